// The 4-bit format's few-rows matmul (quantized_linear.cpp): y = x W^T for GGUF Q4_1 / Q8_0 weight blocks and
// activations quantized to int8 per row and block of 32, with AVX512-VNNI integer dot products.
#pragma once
#include <torch/extension.h>

bool quantized_available();  // built with AVX512-VNNI
// codes [N, B, 32] (uint8 0..15 for Q4_1, int8 for Q8_0), scale and minimum [N, B] float32 (minimum empty for
// Q8_0) -> {codes panels, scale panels [N/16, B, 16], minimum panels (empty for Q8_0)}
std::vector<torch::Tensor> quantized_pack(const torch::Tensor& codes, const torch::Tensor& scale,
                                          const torch::Tensor& minimum);
torch::Tensor quantized_linear(const torch::Tensor& x, const std::vector<torch::Tensor>& packed, int64_t out_features);
