// EAGLE-3's draft tree grown in one call: every level's readout, choice and draft layer (eagle3_grow.cpp).
#pragma once
#include <torch/extension.h>

#include <vector>

// root_h [1, H]: the h whose guesses are the root's children; embed [V, H] the base's embeddings; vocab [V'] the
// draft vocabulary's token ids; weights, shape, eps: eagle3_layer's; norm, panels, vocab_size: eagle3_readout's;
// cos/sin [P, D] the rotary tables; the draft's cache with `committed` rows. beam, depth, wanted as grow_level's;
// worth_weights: the fitted tree values (GROW_WEIGHTS's order) or none; clip {low, high}: their probabilities'
// bounds; seconds (a forward's by rows), ratio, overhead: StepCost's, seconds empty without one. -> the proposals:
// values [n] float64, depths [n], tokens [n], parents [n] (-1: the root), drafts [n] float64 (log-probabilities).
// The cache's rows after `committed` are the tree's, left for the next verification to overwrite.
std::vector<torch::Tensor> eagle3_grow(const torch::Tensor& root_h, const torch::Tensor& embed,
                                       const torch::Tensor& vocab, const std::vector<torch::Tensor>& weights,
                                       const std::vector<int64_t>& shape, double eps, const torch::Tensor& norm,
                                       const torch::Tensor& panels, int64_t vocab_size, const torch::Tensor& cos,
                                       const torch::Tensor& sin, const torch::Tensor& cache_k,
                                       const torch::Tensor& cache_v, int64_t committed, int64_t beam, int64_t depth,
                                       int64_t wanted, const std::vector<double>& worth_weights,
                                       const std::vector<double>& clip, const std::vector<double>& seconds,
                                       double ratio, double overhead);
