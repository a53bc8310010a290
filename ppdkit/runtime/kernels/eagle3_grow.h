// EAGLE-3's draft tree grown in one call: every level's readout, choice and draft layer (eagle3_grow.cpp).
#pragma once
#include <torch/extension.h>

#include <optional>
#include <vector>

// start: the root's h [1, H], whose guesses are the root's children; or, with fc_panels, the verified positions' fused
// states [R, nH] (a step's few rows), read into the draft's cache first as Eagle3Drafter._read_verified reads them (fc,
// then the draft layer at positions committed .., causal; each row with the token after it: read_tokens [R] int64
// shifted by one, then `root`), the last row's h then the root's. embed [V, H] the base's embeddings; vocab [V'] the
// draft vocabulary's token ids; weights, shape, eps: eagle3_layer's; norm, panels, vocab_size: eagle3_readout's;
// cos/sin [P, D] the rotary tables; the draft's cache with `committed` rows. beam, depth, wanted as grow_level's;
// worth_weights: the fitted tree values (GROW_WEIGHTS's order) or none; clip {low, high}: their probabilities' bounds;
// seconds (a forward's by rows), ratio, overhead: StepCost's, seconds empty without one. -> the proposals: values [n]
// float64, depths [n], tokens [n], parents [n] (-1: the root), drafts [n] float64 (log-probabilities). The cache's R
// read rows are the caller's to commit; the rows after them are the tree's, left for the next verification to
// overwrite. prompt_embeds and prompt_hidden [P, H] (Eagle3ParallelDrafter's, grow_marginals's twin): P rows read after
// the root's in the same call (start, without fc_panels: [1 + P, H], the root's h then the prompts'), one readout of
// them all, depth L's guesses the same under every expanded node, no draft layer after; depth at most 1 + P.
std::vector<torch::Tensor> eagle3_grow(const torch::Tensor& start, const std::optional<torch::Tensor>& fc_panels,
                                       const std::optional<torch::Tensor>& read_tokens, int64_t root,
                                       const torch::Tensor& embed,
                                       const torch::Tensor& vocab, const std::vector<torch::Tensor>& weights,
                                       const std::vector<int64_t>& shape, double eps, const torch::Tensor& norm,
                                       const torch::Tensor& panels, int64_t vocab_size, const torch::Tensor& cos,
                                       const torch::Tensor& sin, const torch::Tensor& cache_k,
                                       const torch::Tensor& cache_v, int64_t committed, int64_t beam, int64_t depth,
                                       int64_t wanted, const std::vector<double>& worth_weights,
                                       const std::vector<double>& clip, const std::vector<double>& seconds,
                                       double ratio, double overhead, const std::optional<torch::Tensor>& prompt_embeds,
                                       const std::optional<torch::Tensor>& prompt_hidden);
