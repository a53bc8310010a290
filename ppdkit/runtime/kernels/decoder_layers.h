// All decoder layers of a Llama-family model for a few new tokens, in one call, and EAGLE-3's draft layer
// (decoder_layers.cpp).
#pragma once
#include <torch/extension.h>

#include <optional>
#include <vector>

torch::Tensor decoder_layers(const torch::Tensor& x, const std::vector<torch::Tensor>& weights,
                             const std::vector<int64_t>& shape, double eps, const torch::Tensor& cos,
                             const torch::Tensor& sin, const std::optional<torch::Tensor>& bias,
                             const torch::Tensor& cache_k, const torch::Tensor& cache_v, int64_t length,
                             const std::vector<int64_t>& skip, const std::optional<torch::Tensor>& window);
torch::Tensor eagle3_layer(const torch::Tensor& embeds, const torch::Tensor& hidden,
                           const std::vector<torch::Tensor>& weights, const std::vector<int64_t>& shape, double eps,
                           const torch::Tensor& cos, const torch::Tensor& sin, const std::optional<torch::Tensor>& bias,
                           const torch::Tensor& cache_k, const torch::Tensor& cache_v, int64_t length);
