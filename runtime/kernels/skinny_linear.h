// The few-rows matmul (skinny_linear.cpp): y = x W^T with W packed once into 16-column panels.
#pragma once
#include <torch/extension.h>

bool skinny_linear_available();                          // false where built without AVX-512
torch::Tensor skinny_pack(const torch::Tensor& weight);  // [N, K] -> [ceil(N/16), K, 16]
torch::Tensor skinny_linear(const torch::Tensor& x, const torch::Tensor& packed, int64_t out_features);
