// Every decoder layer of a Llama-family model for the few new tokens of a decoding step, in one call:
// the same arithmetic as LeanLlama.forward in runtime/forward/llama.py (RMSNorm, rotary embedding, grouped-query
// attention over the KV cache with an additive mask, SwiGLU), with its matmuls on the packed few-rows
// kernels (float32 or bfloat16 weights, or the 4-bit format's GGUF blocks; activations, the KV cache and every
// sum in float32). A step's ~40
// small operations per layer cost more in Python dispatch than in arithmetic (about a third of a step on 2
// cores); here the norms, rotary, copies, attention and SwiGLU are plain loops.
// EAGLE-3's draft layer (eagle3_layer: another input and residual) is built from the same attention and MLP
// blocks, for the same reason: its ~60 PyTorch operations cost more in dispatch than in arithmetic; so is its
// readout with a tree level's choice (eagle3_readout), ~10 operations on a few rows at every level a step drafts.
// Each row's arithmetic is the same whatever the number of rows in the step: the decoder's losslessness rests
// on that (a library batched matmul may pick another kernel, or reduction order, for another row count).
#include "decoder_layers.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#ifdef __AVX512F__
#include <immintrin.h>
#endif

#include "quantized_linear.h"
#include "skinny_linear.h"

torch::Tensor project(const torch::Tensor& x, const torch::Tensor& panels, int64_t width) {
  return is_quantized(panels) ? quantized_linear(x, panels, width) : skinny_linear(x, panels, width);
}

namespace {

// w * x / sqrt(mean(x^2) + eps) per row of x [T, H].
torch::Tensor rms_norm(const torch::Tensor& x, const torch::Tensor& w, float eps) {
  const int64_t t = x.size(0), h = x.size(1);
  auto out = torch::empty_like(x);
  const float* xs = x.data_ptr<float>();
  const float* ws = w.data_ptr<float>();
  float* os = out.data_ptr<float>();
  for (int64_t r = 0; r < t; ++r) {
    const float* row = xs + r * h;
    float squares = 0.f;
#pragma omp simd reduction(+ : squares)
    for (int64_t j = 0; j < h; ++j) squares += row[j] * row[j];
    const float scale = 1.f / std::sqrt(squares / static_cast<float>(h) + eps);
#pragma omp simd
    for (int64_t j = 0; j < h; ++j) os[r * h + j] = ws[j] * (row[j] * scale);
  }
  return out;
}

// Rotary embedding in place on the first `heads` heads of each row of qkv [T, (Hq + 2 Hkv) D]
// (Llama's half-split convention: (a, b) -> (a cos - b sin, b cos + a sin)), cos/sin [T, D].
void rotate(torch::Tensor& qkv, int64_t heads, int64_t d, const torch::Tensor& cos, const torch::Tensor& sin) {
  const int64_t t = qkv.size(0), stride = qkv.size(1), half = d / 2;
  float* base = qkv.data_ptr<float>();
  for (int64_t r = 0; r < t; ++r) {
    const float* c = cos.data_ptr<float>() + r * d;
    const float* s = sin.data_ptr<float>() + r * d;
    for (int64_t head = 0; head < heads; ++head) {
      float* v = base + r * stride + head * d;
#pragma omp simd
      for (int64_t j = 0; j < half; ++j) {
        const float a = v[j], b = v[j + half];
        v[j] = a * c[j] - b * s[j];
        v[j + half] = b * c[j + half] + a * s[j + half];
      }
    }
  }
}

// dst[j] = src[j] where finite, else 0. A draft row (a prompt token, any values a component may hold)
// must not reach the rows masked from it: their attention weight on it is exactly 0, but 0 x NaN is NaN,
// so its key and value enter the cache as finite numbers (runtime/forward/kv_cache.py does the same for the
// PyTorch layers). Rows the verified path sees are finite already and pass unchanged.
// dst holds element j at dst[j * stride] (a key is a column of the transposed key cache).
void copy_finite(const float* src, int64_t n, float* dst, int64_t stride) {
  for (int64_t j = 0; j < n; ++j) dst[j * stride] = std::isfinite(src[j]) ? src[j] : 0.f;
}

// e^x on 16 floats at once (GCC vector extensions: one AVX-512 register, or two AVX2 ones), and only so: a
// library exp may take a vector path in a loop's body and a scalar one in its tail, rounding an element
// differently by where it falls, and where it falls depends on the row count. Callers pad a short block.
// Cephes' expf: x = n ln2 + r with n = round(x / ln2), e^r by a degree-7 polynomial, 2^n by the exponent bits;
// x < -87.3 (masked scores: -inf) gives exactly 0. Plain multiplies and adds (the build contracts none).
using Floats = float __attribute__((vector_size(64)));
using Ints = int32_t __attribute__((vector_size(64)));
constexpr int64_t kBlock = 16;

inline Floats exp_block(Floats x) {
  const Floats low = Floats{} - 87.3f, high = Floats{} + 88.3f;
  const Ints keep = x >= low;  // false for -inf and NaN
  x = x < low ? low : x > high ? high : x;
  const Floats shifter = Floats{} + 12582912.f;  // 1.5 * 2^23: adding and subtracting it rounds to an integer
  const Floats n = (x * 1.44269504088896341f + shifter) - shifter;
  Floats r = x - n * 0.693359375f;
  r = r + n * 2.12194440e-4f;
  Floats p = Floats{} + 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * (r * r) + r + 1.f;
  const Ints bits = (__builtin_convertvector(n, Ints) + 127) << 23;
  const Floats result = p * reinterpret_cast<const Floats&>(bits);
  return keep ? result : Floats{};
}

// The `width` <= 16 floats at p as a block, padded with `pad`. A whole block is one vector load; only a short
// one goes through a copy of its own length (a library call, then a stalled load: dear at every block).
inline Floats load_block(const float* p, int64_t width, float pad) {
  Floats block;
  if (width == kBlock) {
    std::memcpy(&block, p, sizeof(Floats));
  } else {
    block = Floats{} + pad;
    std::memcpy(&block, p, width * sizeof(float));
  }
  return block;
}

inline void store_block(float* p, int64_t width, const Floats& block) {
  if (width == kBlock) {
    std::memcpy(p, &block, sizeof(Floats));
  } else {
    std::memcpy(p, &block, width * sizeof(float));
  }
}

// f(block of 16) over xs[0, n) in place, the last block padded with `pad`.
template <typename F>
void blocks(float* xs, int64_t n, float pad, F f) {
  for (int64_t j0 = 0; j0 < n; j0 += kBlock) {
    const int64_t width = std::min(kBlock, n - j0);
    store_block(xs + j0, width, f(load_block(xs + j0, width, pad)));
  }
}

// Grouped-query attention over the first s cached keys/values: q [Hkv, R, D] (R = g T query rows per
// key/value head), keys transposed at k + (head * D + e) * capacity + j, values at v + (head * capacity + j) * D,
// bias [R, S] or none -> [Hkv, R, D].
// Each (head, row) is computed whole by one thread, with sums in a fixed order: a score sums q_e k_je over e
// in order (an FMA chain, vectorized across keys); the softmax's total runs over the keys the row sees in
// kLanes interleaved partial sums (by rank) added up in one fixed tree; the output sums p_j v_j over j in
// order, masked keys (score -inf) adding exact zeros. So a row's result is the same for any number of rows in
// the step, any number of keys it cannot see, and wherever in the cache the keys it sees were written.
constexpr int64_t kLanes = 16;
constexpr int64_t kChunk = 64;  // scores or outputs a thread keeps in registers at once (4 AVX-512 registers)

// out_r[c] = the sum over i < n, in order, of a_r[i] * b[i * stride + c], for c < width <= kChunk and the R rows
// a_r -> out_r: kChunk FMA chains a row held in registers (a chunk of scores over the head dimension, a chunk of
// outputs over the keys). The rows share each load of b; each row's chain is the same whatever R is.
template <int R>
inline void chained_sums(const float* const* a, int64_t n, const float* b, int64_t stride, int64_t width,
                         float* const* out) {
#ifdef __AVX512F__
  // The same FMAs in registers (the compiler's own vectorization spills R x 64 sums, and runs a short chunk, the
  // last keys of a row, one float at a time): lanes past `width` load zeros and are not stored.
  __mmask16 valid[4];
  for (int c = 0; c < 4; ++c) {
    const int64_t lanes = std::clamp<int64_t>(width - 16 * c, 0, 16);
    valid[c] = static_cast<__mmask16>((1u << lanes) - 1u);
  }
  __m512 acc[R][4];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < 4; ++c) acc[r][c] = _mm512_setzero_ps();
  for (int64_t i = 0; i < n; ++i) {
    const float* row = b + i * stride;
    const __m512 b0 = _mm512_maskz_loadu_ps(valid[0], row), b1 = _mm512_maskz_loadu_ps(valid[1], row + 16),
                 b2 = _mm512_maskz_loadu_ps(valid[2], row + 32), b3 = _mm512_maskz_loadu_ps(valid[3], row + 48);
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      const __m512 ai = _mm512_set1_ps(a[r][i]);
      acc[r][0] = _mm512_fmadd_ps(ai, b0, acc[r][0]);
      acc[r][1] = _mm512_fmadd_ps(ai, b1, acc[r][1]);
      acc[r][2] = _mm512_fmadd_ps(ai, b2, acc[r][2]);
      acc[r][3] = _mm512_fmadd_ps(ai, b3, acc[r][3]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < 4; ++c) _mm512_mask_storeu_ps(out[r] + 16 * c, valid[c], acc[r][c]);
#else
  float acc[R][kChunk] = {};
  for (int64_t i = 0; i < n; ++i) {
    const float* row = b + i * stride;
    if (width == kChunk) {
#pragma GCC unroll 4
      for (int r = 0; r < R; ++r) {
        const float ai = a[r][i];
#pragma omp simd
        for (int64_t c = 0; c < kChunk; ++c) acc[r][c] = std::fma(ai, row[c], acc[r][c]);
      }
    } else {
      for (int r = 0; r < R; ++r)
        for (int64_t c = 0; c < width; ++c) acc[r][c] = std::fma(a[r][i], row[c], acc[r][c]);
    }
  }
  for (int r = 0; r < R; ++r) std::copy_n(acc[r], width, out[r]);
#endif
}

constexpr int kRowsTogether = 4;  // query rows of one key/value head that share the loads of its keys and values

// chained_sums for 1 to kRowsTogether rows.
inline void chained_sums(int rows, const float* const* a, int64_t n, const float* b, int64_t stride, int64_t width,
                         float* const* out) {
  switch (rows) {
    case 1: return chained_sums<1>(a, n, b, stride, width, out);
    case 2: return chained_sums<2>(a, n, b, stride, width, out);
    case 3: return chained_sums<3>(a, n, b, stride, width, out);
    default: return chained_sums<kRowsTogether>(a, n, b, stride, width, out);
  }
}

// A row's scores w [n] (bias b [n] or none) -> its attention weights, in place; scratch: n + 16 floats.
void softmax(float* w, int64_t n, const float* b, float scale, float* scratch) {
  if (b) {
#pragma omp simd
    for (int64_t j = 0; j < n; ++j) w[j] = std::fma(w[j], scale, b[j]);
  } else {
#pragma omp simd
    for (int64_t j = 0; j < n; ++j) w[j] *= scale;
  }
  Floats tops = Floats{} - INFINITY;  // a maximum is exact in any order: 16 lanes, then across them
  for (int64_t j0 = 0; j0 < n; j0 += kBlock) {
    const Floats block = load_block(w + j0, std::min(kBlock, n - j0), -INFINITY);
    tops = tops > block ? tops : block;
  }
  float top = -INFINITY;
  for (int64_t lane = 0; lane < kBlock; ++lane) top = std::max(top, tops[lane]);
  blocks(w, n, -INFINITY, [top](Floats x) { return exp_block(x - top); });
  // The total over the keys this row sees, in their order: a tree node's ancestors sit at other cache
  // positions than in the one-row steps that would have decoded them (masked keys between them), so a key's
  // lane is its rank among the visible keys, not its position.
  // The visible weights are gathered in order into `seen` (masked ones are exact zeros and skipped), then lane
  // i sums seen[i], seen[i + 16], ... in order: 16-wide blocks added as vectors, the last one padded with zeros
  // (adding +0 to a sum of non-negative weights changes nothing).
  float* seen = scratch;
  int64_t count = 0;
  if (b) {
    int64_t j = 0;
#ifdef __AVX512F__
    for (; j + 16 <= n; j += 16) {  // the visible weights of 16 keys, packed in order
      const __mmask16 visible = _mm512_cmp_ps_mask(_mm512_loadu_ps(b + j), _mm512_set1_ps(-INFINITY), _CMP_NEQ_OQ);
      // packed in a register, stored whole (a compressing store to memory is microcoded and slow); the
      // floats past the packed ones are overwritten by the next store, or ignored (seen has 16 to spare)
      _mm512_storeu_ps(seen + count, _mm512_maskz_compress_ps(visible, _mm512_loadu_ps(w + j)));
      count += __builtin_popcount(visible);
    }
#endif
    for (; j < n; ++j)
      if (b[j] != -INFINITY) seen[count++] = w[j];
  } else {
    seen = w, count = n;
  }
  Floats lanes{};
  for (int64_t j0 = 0; j0 < count; j0 += kLanes) {
    lanes = lanes + load_block(seen + j0, std::min(kLanes, count - j0), 0.f);
  }
  for (int64_t width = kLanes / 2; width > 0; width /= 2)  // the fixed tree: 16 -> 8 -> 4 -> 2 -> 1
    for (int64_t lane = 0; lane < width; ++lane) lanes[lane] += lanes[lane + width];
  const float inverse = 1.f / lanes[0];
#pragma omp simd
  for (int64_t j = 0; j < n; ++j) w[j] *= inverse;
}

// window: none (every row sees the cache slots [0, s)), or per token r of the step the slots [window[3 r],
// window[3 r + 1]] it sees: its own sequence's keys, when several sequences share the cache (runtime/batching/batched_decoding.py);
// a bias row then covers those slots from the first, masking the tree rows of its sequence that it may not see.
torch::Tensor attention(const torch::Tensor& q, const float* k, const float* v, int64_t capacity, int64_t s,
                        const std::optional<torch::Tensor>& bias, float scale, int64_t tokens, const int64_t* window) {
  const int64_t hkv = q.size(0), rows = q.size(1), d = q.size(2);
  auto attn = torch::empty({hkv, rows, d}, q.options());  // every (head, row) is one work item's, written whole
  auto scratch = torch::empty({hkv * rows, s}, q.options());  // a row's scores, then its weights
  const float* qs = q.data_ptr<float>();
  const float* bs = bias ? bias->data_ptr<float>() : nullptr;
  float* as = attn.data_ptr<float>();
  float* ws = scratch.data_ptr<float>();
  // Work items: up to kRowsTogether rows of one key/value head that see the same keys, so the rows share the reads of
  // those keys and values. Consecutive tokens with the same window (all of a step's without one; a sequence's tree
  // rows with one) form a span, whose rows are taken in the grouped layout's order: query head q of token r is row
  // q T + r, so a span of one token groups its query heads (T rows apart) and a longer span runs along its tokens.
  // Too few groups for the threads (a one-token step: a group per key/value head, 3 for 2 threads, 2 : 1), each row is
  // an item of its own: the threads then share the work evenly, each row's sums the same as in a group.
  const int64_t g = rows / tokens;
  const int64_t together = hkv * ((rows + kRowsTogether - 1) / kRowsTogether) < 2 * at::get_num_threads()
                               ? 1 : kRowsTogether;
  std::vector<std::array<int64_t, kRowsTogether>> groups;
  std::vector<int64_t> counts;
  for (int64_t a = 0; a < tokens;) {
    int64_t b = a + 1;
    while (b < tokens && (!window || (window[3 * b] == window[3 * a] && window[3 * b + 1] == window[3 * a + 1]))) ++b;
    for (int64_t i = 0; i < g * (b - a); ++i) {  // the span's rows: q major, token minor
      if (i % together == 0) groups.emplace_back(), counts.push_back(0);
      groups.back()[counts.back()++] = (i / (b - a)) * tokens + a + i % (b - a);
    }
    a = b;
  }
  const int64_t row_groups = static_cast<int64_t>(groups.size());
  at::parallel_for(0, hkv * row_groups, 1, [&](int64_t first, int64_t last) {
    std::vector<float> gathered(bs ? s + kLanes : 0);  // softmax's scratch, once per thread's items (n <= s)
    for (int64_t item = first; item < last; ++item) {
      const int64_t head = item / row_groups, group = item % row_groups, count = counts[group];
      const int64_t token = groups[group][0] % tokens;  // every row of the group sees this token's keys
      const int64_t lo = window ? window[3 * token] : 0, n = window ? window[3 * token + 1] + 1 - lo : s;
      const float* kt = k + head * d * capacity + lo;
      const float* values = v + (head * capacity + lo) * d;
      const float* qr[kRowsTogether];
      float* w[kRowsTogether];
      float* out[kRowsTogether];
      for (int64_t i = 0; i < count; ++i) {
        const int64_t row = head * rows + groups[group][i];
        qr[i] = qs + row * d, w[i] = ws + row * s, out[i] = as + row * d;
      }
      const int c = static_cast<int>(count);
      for (int64_t j0 = 0; j0 < n; j0 += kChunk) {  // scores: sums over the head dimension
        float* chunk[kRowsTogether];
        for (int i = 0; i < c; ++i) chunk[i] = w[i] + j0;
        chained_sums(c, qr, d, kt + j0, capacity, std::min(kChunk, n - j0), chunk);
      }
      for (int64_t i = 0; i < count; ++i)
        softmax(w[i], n, bs ? bs + groups[group][i] * s : nullptr, scale, gathered.data());
      for (int64_t e0 = 0; e0 < d; e0 += kChunk) {  // outputs: sums over the keys
        float* chunk[kRowsTogether];
        for (int i = 0; i < c; ++i) chunk[i] = out[i] + e0;
        chained_sums(c, w, n, values + e0, d, std::min(kChunk, d - e0), chunk);
      }
    }
  });
  return attn;
}

// SwiGLU's product silu(gate) * up = gate / (1 + e^-gate) * up per element of gate_up [T, 2 I] -> [T, I].
torch::Tensor swiglu(const torch::Tensor& gate_up, int64_t inter) {
  const int64_t t = gate_up.size(0);
  auto out = torch::empty({t, inter}, gate_up.options());
  const float* gu = gate_up.data_ptr<float>();
  float* os = out.data_ptr<float>();
  at::parallel_for(0, t, 1, [&](int64_t first, int64_t last) {
    for (int64_t r = first; r < last; ++r) {
      float* o = os + r * inter;
      const float* gate = gu + r * 2 * inter;
      const float* up = gate + inter;
      std::copy_n(gate, inter, o);
      blocks(o, inter, 0.f, [](Floats g) { return g / (1.f + exp_block(-g)); });
#pragma omp simd
      for (int64_t j = 0; j < inter; ++j) o[j] *= up[j];
    }
  });
  return out;
}

// The step's shapes and buffers, shared by its layers.
struct Step {
  int64_t hq, hkv, d, inter, hidden, g, t, capacity, s;
  float eps, scale;
  const int64_t* slots;  // window's (first seen, last seen, written) slots, row by row, or none
  const std::optional<torch::Tensor>* bias;
  torch::Tensor cos, sin, q, merged;  // q: queries grouped by their key/value head [Hkv, g T, D]; merged [T, Hq D]

  // Query head h at token r sits at row (h / g) * g T + (h % g) T + r of the grouped layout [Hkv, g T, D]
  // (the order of attention_bias's rows and of runtime/forward/llama.py's grouped queries).
  int64_t grouped_row(int64_t head, int64_t r) const { return (head / g) * g * t + (head % g) * t + r; }
};

// The attention sub-layer on its normed input [T, in] (in: H, or EAGLE-3's 2H) -> its output projection [T, H];
// the rows' keys/values are written into cache layer `layer` at positions [length, length + T) (or window's slots).
torch::Tensor attention_block(Step& st, const torch::Tensor& normed, const torch::Tensor& qkv_panels,
                              const torch::Tensor& o_panels, const torch::Tensor& cache_k,
                              const torch::Tensor& cache_v, int64_t layer, int64_t length) {
  const int64_t hq = st.hq, hkv = st.hkv, d = st.d, t = st.t, capacity = st.capacity;
  const int64_t qkv_width = (hq + 2 * hkv) * d;
  auto qkv = project(normed, qkv_panels, qkv_width).contiguous();  // [T, (Hq + 2 Hkv) D]
  rotate(qkv, hq + hkv, d, st.cos, st.sin);
  const float* qkvs = qkv.data_ptr<float>();
  float* ks = cache_k.data_ptr<float>() + layer * hkv * capacity * d;
  float* vs = cache_v.data_ptr<float>() + layer * hkv * capacity * d;
  float* qs = st.q.data_ptr<float>();
  for (int64_t r = 0; r < t; ++r) {
    const float* row = qkvs + r * qkv_width;
    for (int64_t head = 0; head < hq; ++head) std::copy_n(row + head * d, d, qs + st.grouped_row(head, r) * d);
    const int64_t slot = st.slots ? st.slots[3 * r + 2] : length + r;
    for (int64_t kv = 0; kv < hkv; ++kv) {
      copy_finite(row + (hq + kv) * d, d, ks + kv * d * capacity + slot, capacity);
      copy_finite(row + (hq + hkv + kv) * d, d, vs + (kv * capacity + slot) * d, 1);
    }
  }
  auto attn = attention(st.q, ks, vs, capacity, st.s, *st.bias, st.scale, t, st.slots);  // [Hkv, g T, D]
  const float* as = attn.data_ptr<float>();
  float* ms = st.merged.data_ptr<float>();
  for (int64_t head = 0; head < hq; ++head)
    for (int64_t r = 0; r < t; ++r) std::copy_n(as + st.grouped_row(head, r) * d, d, ms + r * hq * d + head * d);
  return project(st.merged, o_panels, st.hidden);
}

// x += y for x [T, H] (contiguous) and y of its shape: a plain loop, each sum rounded once as Tensor.add_ rounds it,
// without its dispatch (two residual adds a layer)
void add_into(torch::Tensor& x, const torch::Tensor& y) {
  const auto yc = y.contiguous();
  float* xs = x.data_ptr<float>();
  const float* ys = yc.data_ptr<float>();
  const int64_t n = x.numel();
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) xs[i] += ys[i];
}

// x += the SwiGLU MLP of rms_norm(x, ln2).
void mlp_block(const Step& st, torch::Tensor& x, const torch::Tensor& ln2, const torch::Tensor& gate_up_panels,
               const torch::Tensor& down_panels) {
  auto gate_up = project(rms_norm(x, ln2, st.eps), gate_up_panels, 2 * st.inter).contiguous();  // [T, 2 I]
  add_into(x, project(swiglu(gate_up, st.inter), down_panels, st.hidden));
}

// The checks and shapes both entry points share; s: the most keys a row sees (without a window).
Step make_step(const torch::Tensor& x, const std::vector<int64_t>& shape, double eps, const torch::Tensor& cos,
               const torch::Tensor& sin, const std::optional<torch::Tensor>& bias, const torch::Tensor& cache_k,
               const torch::Tensor& cache_v, int64_t length, const std::optional<torch::Tensor>& window) {
  TORCH_CHECK(shape.size() == 5, "decoder_layers: 5 shape values");
  Step st{};
  st.hq = shape[0], st.hkv = shape[1], st.d = shape[2], st.inter = shape[3], st.hidden = shape[4];
  st.g = st.hq / st.hkv, st.t = x.size(0), st.capacity = cache_v.size(2), st.bias = &bias;
  st.s = length + st.t;
  if (window) {
    TORCH_CHECK(window->scalar_type() == torch::kInt64 && window->is_contiguous() && window->dim() == 2 &&
                window->size(0) == st.t && window->size(1) == 3, "decoder_layers: window [T, 3] int64");
    st.slots = window->data_ptr<int64_t>();
    st.s = 1;
    for (int64_t r = 0; r < st.t; ++r) {
      const int64_t first = st.slots[3 * r], last = st.slots[3 * r + 1], written = st.slots[3 * r + 2];
      TORCH_CHECK(0 <= first && first <= written && written <= last && last < st.capacity,
                  "decoder_layers: window row ", r, " outside the cache, or its own slot outside what it sees");
      st.s = std::max(st.s, last + 1 - first);
    }
    if (bias) {  // the bias rows cover each row's window from its first slot: at least the widest window
      TORCH_CHECK(bias->size(1) >= st.s, "decoder_layers: a window's bias [g T, S] needs S >= its widest window");
      st.s = bias->size(1);
    }
  }
  st.eps = static_cast<float>(eps), st.scale = 1.f / std::sqrt(static_cast<float>(st.d));
  TORCH_CHECK(st.slots || st.s <= st.capacity, "KV cache full: ", st.s, " tokens > capacity ", st.capacity);
  for (const auto* tensor : {&x, &cos, &sin, &cache_k, &cache_v})
    TORCH_CHECK(tensor->scalar_type() == torch::kFloat32, "decoder_layers runs float32 tensors only");
  TORCH_CHECK(cache_k.is_contiguous() && cache_v.is_contiguous() && cache_k.size(1) == st.hkv &&
              cache_k.size(2) == st.d && cache_k.size(3) == st.capacity && cache_v.size(1) == st.hkv &&
              cache_v.size(3) == st.d,
              "decoder_layers: the KV cache must be contiguous keys [layers, Hkv, D, capacity] and values "
              "[layers, Hkv, capacity, D]");
  TORCH_CHECK(x.dim() == 2 && cos.size(0) == st.t && cos.size(1) == st.d,
              "decoder_layers: x [T, .] and cos/sin [T, D]");
  TORCH_CHECK(!bias || (bias->size(0) == st.g * st.t && bias->size(1) == st.s &&
                        bias->scalar_type() == torch::kFloat32 && bias->is_contiguous()),
              "decoder_layers: bias [g T, S], float32");
  st.cos = cos.contiguous(), st.sin = sin.contiguous();
  st.q = torch::empty({st.hkv, st.g * st.t, st.d}, x.options());
  st.merged = torch::empty({st.t, st.hq * st.d}, x.options());
  return st;
}

}  // namespace

// x [T, H] -> [T, H] after every layer (before the final norm). weights: 6 per layer (ln1, qkv panels,
// o panels, ln2, gate/up panels, down panels); shape: {Hq, Hkv, D, I, H}; cos/sin [T, D] at the new
// positions; bias [g T, S] (g = Hq / Hkv query heads per key/value head) or none for one token seeing
// everything; cache_k [layers, Hkv, D, capacity] (keys transposed), cache_v [layers, Hkv, capacity, D]: the new
// keys/values are written at positions [length, length + T).
// skip: empty, or per layer a bit mask of the sub-layers left out (1 attention: no keys/values written,
// 2 MLP), a layer-skip draft's (runtime/drafters/layer_skip.py).
// window: none, or [T, 3] int64 for rows of several sequences sharing the cache (runtime/batching/batched_decoding.py): row r's
// key/value is written at slot window[r][2], and the row sees slots window[r][0] .. window[r][1] (its own
// sequence: its committed keys, and with a tree step its tree's rows), masked by bias row r's entries from
// window[r][0] on (bias none: it sees them all). A row's arithmetic is then that of its sequence decoded alone.
namespace {

// decoder_layers' body; with `capture` (layer counts k: the residual stream after k layers) their states are copied
// into `states` [T, len(capture) H], in capture's order.
torch::Tensor run_layers(const torch::Tensor& x_in, const std::vector<torch::Tensor>& weights,
                         const std::vector<int64_t>& shape, double eps, const torch::Tensor& cos,
                         const torch::Tensor& sin, const std::optional<torch::Tensor>& bias,
                         const torch::Tensor& cache_k, const torch::Tensor& cache_v, int64_t length,
                         const std::vector<int64_t>& skip, const std::optional<torch::Tensor>& window,
                         const std::vector<int64_t>& capture, torch::Tensor* states) {
  TORCH_CHECK(weights.size() % 6 == 0, "decoder_layers: 6 weights a layer");
  Step st = make_step(x_in, shape, eps, cos, sin, bias, cache_k, cache_v, length, window);
  TORCH_CHECK(x_in.size(1) == st.hidden, "decoder_layers: x [T, H]");
  for (size_t i = 0; i < weights.size(); i += 3)  // the norms (ln1, ln2 of each layer) in float32 too
    TORCH_CHECK(weights[i].scalar_type() == torch::kFloat32, "decoder_layers runs float32 tensors only (norms)");
  TORCH_CHECK(cache_k.size(0) * 6 == static_cast<int64_t>(weights.size()), "decoder_layers: one cache layer per layer");
  TORCH_CHECK(skip.empty() || skip.size() * 6 == weights.size(), "decoder_layers: one skip mask per layer");
  auto x = x_in.contiguous().clone();
  const int64_t layers = static_cast<int64_t>(weights.size() / 6);
  for (int64_t k : capture) TORCH_CHECK(0 <= k && k <= layers, "decoder_layers: a captured layer count past ", layers);
  auto keep = [&](int64_t done) {  // the states after `done` layers, wherever capture asks for them
    for (size_t j = 0; j < capture.size(); ++j)
      if (capture[j] == done) states->narrow(1, static_cast<int64_t>(j) * st.hidden, st.hidden).copy_(x);
  };
  if (states) {
    *states = torch::empty({st.t, static_cast<int64_t>(capture.size()) * st.hidden}, x.options());
    keep(0);
  }
  for (int64_t layer = 0; layer < layers; ++layer) {
    const torch::Tensor* w = &weights[layer * 6];
    const int64_t skipped = skip.empty() ? 0 : skip[layer];
    if (!(skipped & 1))
      add_into(x, attention_block(st, rms_norm(x, w[0], st.eps), w[1], w[2], cache_k, cache_v, layer, length));
    if (!(skipped & 2)) mlp_block(st, x, w[3], w[4], w[5]);
    if (states) keep(layer + 1);
  }
  return x;
}

}  // namespace

torch::Tensor decoder_layers(const torch::Tensor& x, const std::vector<torch::Tensor>& weights,
                             const std::vector<int64_t>& shape, double eps, const torch::Tensor& cos,
                             const torch::Tensor& sin, const std::optional<torch::Tensor>& bias,
                             const torch::Tensor& cache_k, const torch::Tensor& cache_v, int64_t length,
                             const std::vector<int64_t>& skip, const std::optional<torch::Tensor>& window) {
  return run_layers(x, weights, shape, eps, cos, sin, bias, cache_k, cache_v, length, skip, window, {}, nullptr);
}

std::vector<torch::Tensor> decoder_layers_states(const torch::Tensor& x, const std::vector<torch::Tensor>& weights,
                                                 const std::vector<int64_t>& shape, double eps,
                                                 const torch::Tensor& cos, const torch::Tensor& sin,
                                                 const std::optional<torch::Tensor>& bias,
                                                 const torch::Tensor& cache_k, const torch::Tensor& cache_v,
                                                 int64_t length, const std::vector<int64_t>& capture,
                                                 const std::optional<torch::Tensor>& window) {
  torch::Tensor states;
  auto out = run_layers(x, weights, shape, eps, cos, sin, bias, cache_k, cache_v, length, {}, window, capture,
                        &states);
  return {out, states};
}

// EAGLE-3's draft layer (models/eagle3.py layer_input and layer_output) on T rows: embeds [T, H] (the tokens'
// embeddings) and hidden [T, H] (g or a parent's h) -> h [T, H]. The attention reads [norm(embeds), norm(hidden)]
// [T, 2H]; its residual is hidden. weights: input norm, hidden norm, qkv panels (2H wide), o panels, post-attention
// norm, gate/up panels, down panels; the cache is the draft's own (one layer); the rest as decoder_layers.
torch::Tensor eagle3_layer(const torch::Tensor& embeds, const torch::Tensor& hidden,
                           const std::vector<torch::Tensor>& weights, const std::vector<int64_t>& shape, double eps,
                           const torch::Tensor& cos, const torch::Tensor& sin, const std::optional<torch::Tensor>& bias,
                           const torch::Tensor& cache_k, const torch::Tensor& cache_v, int64_t length) {
  TORCH_CHECK(weights.size() == 7, "eagle3_layer: 7 weights");
  Step st = make_step(hidden, shape, eps, cos, sin, bias, cache_k, cache_v, length, std::nullopt);
  TORCH_CHECK(embeds.scalar_type() == torch::kFloat32 && embeds.sizes() == hidden.sizes() &&
              hidden.size(1) == st.hidden && cache_k.size(0) == 1, "eagle3_layer: embeds and hidden [T, H] float32, "
              "a one-layer cache");
  for (int i : {0, 1, 4})
    TORCH_CHECK(weights[i].scalar_type() == torch::kFloat32, "eagle3_layer runs float32 tensors only (norms)");
  auto normed = torch::cat({rms_norm(embeds.contiguous(), weights[0], st.eps),
                            rms_norm(hidden.contiguous(), weights[1], st.eps)}, 1);  // [T, 2H]
  auto x = hidden.contiguous().clone();
  add_into(x, attention_block(st, normed, weights[2], weights[3], cache_k, cache_v, 0, length));
  mlp_block(st, x, weights[4], weights[5], weights[6]);
  return x;
}

// EAGLE-3's readout (models/eagle3.py readout) and a grown tree level's choice (runtime/trees/grown_tree.py level_top) on
// T rows: h [T, H] -> the k likeliest draft-vocabulary entries of each row, as log-probabilities [T, k] (float32;
// NaN -> -inf, +inf -> 0, as level_logp) and their indices [T, k], best first. norm [H] float32; panels: the LM
// head's, `vocab` rows. The norm is this file's loop; the log-softmax and top-k are PyTorch's own kernels, called
// from here, where a call costs a few microseconds rather than Python's ten or more.
std::vector<torch::Tensor> eagle3_readout(const torch::Tensor& h, const torch::Tensor& norm, double eps,
                                          const torch::Tensor& panels, int64_t vocab, int64_t k) {
  TORCH_CHECK(h.dim() == 2 && h.scalar_type() == torch::kFloat32 && norm.scalar_type() == torch::kFloat32 &&
              norm.numel() == h.size(1), "eagle3_readout: h [T, H] and norm [H] float32");
  auto logits = project(rms_norm(h.contiguous(), norm.contiguous(), static_cast<float>(eps)), panels, vocab);
  auto logp = torch::nan_to_num(torch::log_softmax(logits, 1), -INFINITY, 0.0);  // [T, V']
  auto top = torch::topk(logp, std::min(k, vocab), 1);
  return {std::get<0>(top), std::get<1>(top)};
}
