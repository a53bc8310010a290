// The few-rows matmul (skinny_linear.cpp): y = x W^T with W packed once into P-column panels (P = 16
// floats with AVX-512, 8 with AVX2; bfloat16 weights in panels of P columns' k-pairs).
#pragma once
#include <torch/extension.h>

#include <string>

bool skinny_linear_available();                          // false where built without AVX-512 or AVX2
bool skinny_bf16_available();                            // bfloat16 weights: every build (float32 FMAs at least)
bool skinny_bf16_dot_available();                        // ... and VDPBF16PS: built with AVX512-BF16
std::string skinny_vector_kernel();                      // this build's vector panels: "avx512" or "avx2"
bool skinny_amx_available();                             // bfloat16 on AMX tiles: built with AMX and Linux allows them
// From how many rows the AVX512-BF16 path runs on float32 FMAs (the same bits): sets it where rows > 0; -> the value
int64_t skinny_bf16_fma_from_rows(int64_t rows);
// float32 [N, K] -> [ceil(N/P), K, P]; bfloat16 -> [.., K/2, P, 2] (kernel avx512 or avx2: the build's) or
// [.., K/32, 16, P, 2] (amx);
// kernel auto: amx where available
torch::Tensor skinny_pack(const torch::Tensor& weight, const std::string& kernel);
torch::Tensor skinny_linear(const torch::Tensor& x, const torch::Tensor& packed, int64_t out_features);
