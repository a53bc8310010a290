// EAGLE-3's draft tree grown in one call (runtime/drafters/eagle3_drafter.py Eagle3Drafter.grow_levels and runtime/trees/grown_tree.py
// grow_level, whose twin this is): every level's readout and choice, its children valued, the most valuable expanded
// through the draft layer. Between two native calls a level's Python (valuing a few children, a visibility mask, an
// attention bias, embeddings, rotary rows) cost about as much as the calls themselves (docs/tools/draft_blocks.py
// --compare grow times both). The values are Python's own doubles, added in Python's order, and the tree values' log
// sigmoid is computed with the same libm calls, so both grow the same tree (tests/test_eagle3_grow.py).
#include "eagle3_grow.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

#include "decoder_layers.h"

namespace {

// runtime/trees/tree_values.py's worth for a guess only the draft proposed (its probability p, and its parent's, or none):
// the fitted weights in GROW_WEIGHTS's order (runtime/drafters/eagle3_drafter.py), every term added where Python adds it.
enum Weight { kBias, kDepth, kFirstLevel, kDraft, kDraftLogit, kDraftAndCorpus, kDraftAndChain, kCorpusDepth,
              kChainDepth, kParentDraftLogit, kParentUndrafted, kWeights };

double clipped_logit(double p, double low, double high) {
  p = std::min(std::max(p, low), high);
  return std::log(p) - std::log1p(-p);
}

double draft_worth(const std::vector<double>& w, int64_t depth, double p, const double* parent, double low,
                   double high) {
  const int64_t below = depth - 1;
  double z = w[kBias] + w[kDepth] * static_cast<double>(below) + w[kFirstLevel] * static_cast<double>(below == 0);
  if (!std::isnan(p)) {
    z += w[kDraft] + w[kDraftLogit] * clipped_logit(p, low, high);
    z += w[kDraftAndCorpus] * 0.0 + w[kDraftAndChain] * 0.0;  // neither chain proposed it
  }
  z += static_cast<double>(below) * (w[kCorpusDepth] * 0.0 + w[kChainDepth] * 0.0);
  if (parent != nullptr && !std::isnan(*parent)) {
    z += w[kParentDraftLogit] * clipped_logit(*parent, low, high);
  } else if (below > 0) {
    z += w[kParentUndrafted];
  }
  return z >= 0 ? -std::log1p(std::exp(-z)) : z - std::log1p(std::exp(z));  // log sigmoid(z)
}

// runtime/trees/grown_tree.py StepCost.floor: the log-value below which no proposal can be verified; seconds [n + 1] a
// forward's by rows (seconds[0] unused), the ratio rho and the drafting's seconds.
double cost_floor(std::vector<double> values, const std::vector<double>& seconds, double ratio, double overhead) {
  const double row = seconds.size() > 2 ? seconds[2] - seconds[1] : 0.0;
  if (row <= 0 || ratio <= 0) return -std::numeric_limits<double>::infinity();
  std::stable_sort(values.begin(), values.end(), std::greater<double>());
  double rate = 1.0 / (seconds[1] + overhead), expected = 1.0;
  const size_t most = std::min(values.size(), seconds.size() >= 2 ? seconds.size() - 2 : 0);
  for (size_t n = 1; n <= most; ++n) {
    expected += ratio * std::exp(values[n - 1]);
    if (expected / (seconds[n + 1] + overhead) > rate) rate = expected / (seconds[n + 1] + overhead);
  }
  return std::log(row * rate / ratio);
}

struct Found {  // runtime/trees/grown_tree.py Proposals
  std::vector<double> values, drafts;
  std::vector<int64_t> depths, tokens, parents;
};

// Eagle3Drafter._read_verified: the verified positions' fused states [R, nH] into the draft's cache after its
// `committed` rows, each with the token after it (tokens [R] shifted by one, then root), and after them the draft's
// prompt tokens' P rows where given (embeddings and hidden states [P, H]) -> their h [R + P, H].
torch::Tensor read_verified(const torch::Tensor& states, const torch::Tensor& fc_panels, const torch::Tensor& tokens,
                            int64_t root, const torch::Tensor& embed, const std::vector<torch::Tensor>& weights,
                            const std::vector<int64_t>& shape, double eps, const torch::Tensor& cos,
                            const torch::Tensor& sin, const torch::Tensor& cache_k, const torch::Tensor& cache_v,
                            int64_t committed, const std::optional<torch::Tensor>& prompt_embeds,
                            const std::optional<torch::Tensor>& prompt_hidden) {
  const int64_t group = shape[0] / shape[1];
  TORCH_CHECK(states.dim() == 2 && states.scalar_type() == torch::kFloat32 && tokens.scalar_type() == torch::kInt64 &&
              tokens.dim() == 1 && tokens.size(0) == states.size(0),
              "eagle3_grow: states [R, nH] float32, read_tokens [R] int64");
  const auto index = torch::TensorOptions().dtype(torch::kInt64);
  const auto following = torch::cat({tokens.slice(0, 1), torch::full({1}, root, index)});
  auto g = project(states.contiguous(), fc_panels, shape[4]);  // [R, H]
  auto embeds = embed.index_select(0, following).to(torch::kFloat32);
  if (prompt_embeds) {  // [R + P, H] both
    g = torch::cat({g, *prompt_hidden});
    embeds = torch::cat({embeds, *prompt_embeds});
  }
  const int64_t r = g.size(0);
  auto bias = torch::full({group * r, committed + r}, -INFINITY, cos.options());  // causal: attention_bias's rows
  float* bs = bias.data_ptr<float>();
  for (int64_t q = 0; q < group; ++q)
    for (int64_t i = 0; i < r; ++i) std::fill_n(bs + (q * r + i) * (committed + r), committed + i + 1, 0.f);
  const auto positions = torch::arange(committed, committed + r, index);
  return eagle3_layer(embeds, g, weights, shape, eps, cos.index_select(0, positions), sin.index_select(0, positions),
                      bias, cache_k, cache_v, committed);
}

}  // namespace

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
                                       const std::optional<torch::Tensor>& prompt_hidden) {
  TORCH_CHECK(prompt_embeds.has_value() == prompt_hidden.has_value(), "eagle3_grow: prompt embeds and hidden together");
  TORCH_CHECK(worth_weights.empty() || worth_weights.size() == kWeights, "eagle3_grow: ", kWeights,
              " tree-value weights or none");
  TORCH_CHECK(clip.size() == 2 && wanted >= 1, "eagle3_grow: clip {low, high}, wanted >= 1");
  TORCH_CHECK(vocab.scalar_type() == torch::kInt64, "eagle3_grow: vocab int64");
  TORCH_CHECK(fc_panels.has_value() == read_tokens.has_value(), "eagle3_grow: fc_panels and read_tokens together");
  // Eagle3ParallelDrafter's: the root's row and the prompt tokens' read in one call, every level's guesses from their
  // one readout (row L - 1: depth L's, the same under every expanded node), no draft layer after
  const bool parallel = prompt_embeds.has_value();
  const int64_t prompts = parallel ? prompt_embeds->size(0) : 0;
  if (parallel) depth = std::min(depth, 1 + prompts);
  torch::Tensor state = start;  // [m, H]: the expanded nodes' h (the root alone first; parallel: and the prompts')
  if (fc_panels) {
    const auto h = read_verified(start, *fc_panels, *read_tokens, root, embed, weights, shape, eps, cos, sin,
                                 cache_k, cache_v, committed, prompt_embeds, prompt_hidden);
    committed += start.size(0);  // the tree's rows go after the read ones
    state = h.slice(0, h.size(0) - 1 - prompts);
  }
  TORCH_CHECK(state.dim() == 2 && state.size(0) == 1 + prompts, "eagle3_grow: start [1, H] without fc_panels (",
              "parallel: [1 + P, H])");
  torch::Tensor all_logp, all_picked;  // parallel: [1 + P, b] each, read once
  if (parallel) {
    const auto top = eagle3_readout(state, norm, eps, panels, vocab_size, beam);
    all_logp = top[0].contiguous(), all_picked = top[1].contiguous();
  }
  const int64_t group = shape[0] / shape[1];
  const auto index = torch::TensorOptions().dtype(torch::kInt64);
  const int64_t* vocab_ids = vocab.data_ptr<int64_t>();
  Found found;
  std::vector<double> frontier_values{0.0};
  std::vector<int64_t> frontier_proposals{-1};
  std::vector<std::vector<int64_t>> rows{{}};  // each expanded node's draft rows along its path (after committed)
  int64_t written = 0;                         // draft rows of earlier levels
  for (int64_t level = 1; level <= depth; ++level) {
    torch::Tensor logp, picked;  // [m, b] each
    if (parallel) {
      const int64_t m = static_cast<int64_t>(frontier_values.size());
      logp = all_logp.select(0, level - 1).unsqueeze(0).expand({m, -1}).contiguous();
      picked = all_picked.select(0, level - 1).unsqueeze(0).expand({m, -1}).contiguous();
    } else {
      const auto top = eagle3_readout(state, norm, eps, panels, vocab_size, beam);
      logp = top[0].contiguous(), picked = top[1].contiguous();
    }
    const float* lp = logp.data_ptr<float>();
    const int64_t* ix = picked.data_ptr<int64_t>();
    const int64_t m = logp.size(0), b = logp.size(1);
    const int64_t first = static_cast<int64_t>(found.values.size());
    struct Child {
      double value;
      int64_t row, token;
    };
    std::vector<Child> children;
    for (int64_t row = 0; row < m; ++row) {
      const int64_t parent = frontier_proposals[row];
      double above = 0.0;  // the draft's probability of the parent, where there is one
      if (parent >= 0) above = std::exp(found.drafts[parent]);
      for (int64_t j = 0; j < b; ++j) {
        const double draft = static_cast<double>(lp[row * b + j]);
        double value = worth_weights.empty()
                           ? draft
                           : draft_worth(worth_weights, level, std::exp(draft), parent >= 0 ? &above : nullptr,
                                         clip[0], clip[1]);
        value += frontier_values[row];
        const int64_t token = vocab_ids[ix[row * b + j]];
        found.values.push_back(value), found.depths.push_back(level), found.tokens.push_back(token);
        found.parents.push_back(parent), found.drafts.push_back(draft);
        children.push_back({value, row, token});
      }
    }
    if (level == depth) break;
    std::vector<int64_t> best(children.size());  // the level's most valuable, the first proposed on ties
    std::iota(best.begin(), best.end(), 0);
    std::stable_sort(best.begin(), best.end(),
                     [&](int64_t a, int64_t c) { return -children[a].value < -children[c].value; });
    best.resize(std::min<size_t>(best.size(), static_cast<size_t>(beam)));
    const double top_value = children[best[0]].value;  // bounds every deeper proposal's
    if (static_cast<int64_t>(found.values.size()) >= wanted) {
      std::vector<double> sorted = found.values;
      std::nth_element(sorted.begin(), sorted.begin() + (wanted - 1), sorted.end(), std::greater<double>());
      if (top_value < sorted[wanted - 1]) break;
    }
    if (!seconds.empty() && top_value < cost_floor(found.values, seconds, ratio, overhead)) break;
    if (parallel) {  // the next level's guesses are read already: only the frontier moves
      frontier_values.clear(), frontier_proposals.clear();
      for (int64_t i : best) frontier_values.push_back(children[i].value), frontier_proposals.push_back(first + i);
      continue;
    }
    // the chosen children through the draft layer: each sees the committed rows and its own path's draft rows
    const int64_t next = static_cast<int64_t>(best.size()), length = committed + written;
    std::vector<std::vector<int64_t>> paths;
    std::vector<int64_t> parent_rows, tokens;
    for (int64_t i = 0; i < next; ++i) {
      const Child& child = children[best[i]];
      paths.push_back(rows[child.row]);
      paths.back().push_back(written + i);
      parent_rows.push_back(child.row), tokens.push_back(child.token);
    }
    auto bias = torch::full({group * next, length + next}, -INFINITY, cos.options());  // attention_bias's rows
    float* bs = bias.data_ptr<float>();
    for (int64_t q = 0; q < group; ++q)
      for (int64_t i = 0; i < next; ++i) {
        float* row = bs + (q * next + i) * (length + next);
        std::fill_n(row, committed, 0.f);
        for (int64_t j : paths[i]) row[committed + j] = 0.f;
      }
    const auto token_ids = torch::tensor(tokens, index);
    const auto position = torch::full({next}, committed - 1 + level, index);  // one after the parents' row
    const auto embeds = embed.index_select(0, token_ids).to(torch::kFloat32);
    state = eagle3_layer(embeds, state.index_select(0, torch::tensor(parent_rows, index)), weights, shape, eps,
                         cos.index_select(0, position), sin.index_select(0, position), bias, cache_k, cache_v,
                         length);
    written += next;
    rows = std::move(paths);
    frontier_values.clear(), frontier_proposals.clear();
    for (int64_t i : best) frontier_values.push_back(children[i].value), frontier_proposals.push_back(first + i);
  }
  const auto doubles = torch::TensorOptions().dtype(torch::kFloat64);
  return {torch::tensor(found.values, doubles), torch::tensor(found.depths, index),
          torch::tensor(found.tokens, index), torch::tensor(found.parents, index),
          torch::tensor(found.drafts, doubles)};
}
