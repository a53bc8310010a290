// The 4-bit format's few-rows matmul (quantized_linear.cpp): y = x W^T for GGUF Q4_1 / Q8_0 weight blocks and
// activations quantized to int8 per row and block of 32, with AVX512-VNNI integer dot products.
#pragma once
#include <torch/extension.h>

bool quantized_available();      // built with AVX512-VNNI
bool quantized_amx_available();  // and with AMX-INT8, which Linux allows: many rows go through its tiles
// From how many rows a call goes through the AMX-INT8 tiles (`rows` > 0 sets it; the same bits either way) -> the
// count in use (INT64_MAX where the build has no AMX-INT8)
int64_t quantized_amx_from_rows(int64_t rows = 0);
// codes [N, B, 32] (uint8 0..15 for Q4_1, int8 for Q8_0), scale and minimum [N, B] float32 (minimum empty for
// Q8_0) -> the panels, uint8 [N/16, B, bytes]: each block's codes, scales and minimums
torch::Tensor quantized_pack(const torch::Tensor& codes, const torch::Tensor& scale, const torch::Tensor& minimum);
bool is_quantized(const torch::Tensor& packed);  // panels of quantized_pack (skinny_pack's are float32 or bfloat16)
// amx_from_rows: the fewest rows that go through AMX-INT8 tiles where available (-1: the kernel's choice); the
// result is the same bits on either path
torch::Tensor quantized_linear(const torch::Tensor& x, const torch::Tensor& packed, int64_t out_features,
                               int64_t amx_from_rows = -1);
