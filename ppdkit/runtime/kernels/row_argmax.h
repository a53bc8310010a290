// The first maximum of each row (row_argmax.cpp): greedy decoding's token, read from a step's logits.
#pragma once
#include <torch/extension.h>

// float32 or bfloat16 [N, V], rows contiguous -> int64 [N]: the index of each row's first maximum (argmax's choice),
// or -1 for a row holding a NaN (the caller asks PyTorch, whose max picks the NaN)
torch::Tensor row_argmax(const torch::Tensor& logits);
