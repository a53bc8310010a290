// All decoder layers of a Llama-family model for a few new tokens, in one call; EAGLE-3's draft layer, and its
// readout with a tree level's choice (decoder_layers.cpp).
#pragma once
#include <torch/extension.h>

#include <optional>
#include <vector>

// x [T, K] W^T -> [T, width] on whichever few-rows kernel the panels were packed for (skinny_linear, quantized_linear)
torch::Tensor project(const torch::Tensor& x, const torch::Tensor& panels, int64_t width);
torch::Tensor decoder_layers(const torch::Tensor& x, const std::vector<torch::Tensor>& weights,
                             const std::vector<int64_t>& shape, double eps, const torch::Tensor& cos,
                             const torch::Tensor& sin, const std::optional<torch::Tensor>& bias,
                             const torch::Tensor& cache_k, const torch::Tensor& cache_v, int64_t length,
                             const std::vector<int64_t>& skip, const std::optional<torch::Tensor>& window);
// decoder_layers with the residual stream after each of `capture`'s layer counts read in the same call (EAGLE-3's
// draft reads them): {x after every layer [T, H], the states [T, len(capture) H] in capture's order}; `window` as
// decoder_layers' (several sequences' rows in one shared cache)
std::vector<torch::Tensor> decoder_layers_states(const torch::Tensor& x, const std::vector<torch::Tensor>& weights,
                                                 const std::vector<int64_t>& shape, double eps,
                                                 const torch::Tensor& cos, const torch::Tensor& sin,
                                                 const std::optional<torch::Tensor>& bias,
                                                 const torch::Tensor& cache_k, const torch::Tensor& cache_v,
                                                 int64_t length, const std::vector<int64_t>& capture,
                                                 const std::optional<torch::Tensor>& window);
torch::Tensor eagle3_layer(const torch::Tensor& embeds, const torch::Tensor& hidden,
                           const std::vector<torch::Tensor>& weights, const std::vector<int64_t>& shape, double eps,
                           const torch::Tensor& cos, const torch::Tensor& sin, const std::optional<torch::Tensor>& bias,
                           const torch::Tensor& cache_k, const torch::Tensor& cache_v, int64_t length);
// h [T, H] -> the k likeliest of each row's draft-vocabulary entries: {log-probabilities [T, k], indices [T, k]}
std::vector<torch::Tensor> eagle3_readout(const torch::Tensor& h, const torch::Tensor& norm, double eps,
                                          const torch::Tensor& panels, int64_t vocab, int64_t k);
