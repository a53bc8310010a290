// The first maximum of each row of a step's logits [N, V] (V = 49152 for SmolLM2): greedy decoding's token for
// every verified row. PyTorch's max reads a bfloat16 row through a generic reduction (0.15-0.45 ms for 6 rows on
// 2 cores, a step being ~20 ms); here one pass of 16-lane compares keeps each lane's largest value and where it
// was, ties to the earlier index (a strict >), so the answer is argmax's: the first maximum. A NaN makes the row
// -1, for the caller to hand to PyTorch (whose max returns the NaN's index): a NaN row is rare and is never
// decided here.
#include "row_argmax.h"

#include <ATen/Parallel.h>

#include <cmath>
#include <cstdint>
#include <cstring>

#ifdef __AVX512F__
#include <immintrin.h>
#endif

namespace {

inline float bf16_to_float(uint16_t bits) {
  uint32_t wide = uint32_t(bits) << 16;
  float value;
  std::memcpy(&value, &wide, sizeof value);
  return value;
}

// -> the first maximum of row[0:n], or -1 where it holds a NaN; scalar, for short rows and the vector loop's tail
template <typename Load>
int64_t first_max_scalar(Load load, int64_t begin, int64_t n, float best, int64_t where) {
  for (int64_t i = begin; i < n; ++i) {
    float v = load(i);
    if (std::isnan(v)) return -1;
    if (v > best) best = v, where = i;
  }
  return where;
}

#ifdef __AVX512F__
inline __m512 load16(const float* p) { return _mm512_loadu_ps(p); }
inline __m512 load16(const uint16_t* p) {  // 16 bfloat16 -> float32 (exact: the bits moved up)
  __m256i half = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(half), 16));
}
#endif

template <typename T>
float value_at(const T* row, int64_t i) {
  if constexpr (sizeof(T) == 2) return bf16_to_float(row[i]);
  else return row[i];
}

template <typename T>
int64_t first_max(const T* row, int64_t n) {
  auto load = [row](int64_t i) { return value_at(row, i); };
#ifdef __AVX512F__
  if (n >= 16) {
    __m512 best = load16(row);  // lane l holds the largest of row[l], row[l + 16], ... so far
    __m512i where = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    __mmask16 nan = _mm512_cmp_ps_mask(best, best, _CMP_UNORD_Q);
    const __m512i step = _mm512_set1_epi32(16);
    __m512i index = where;
    int64_t i = 16;
    for (; i + 16 <= n; i += 16) {
      __m512 v = load16(row + i);
      index = _mm512_add_epi32(index, step);
      __mmask16 larger = _mm512_cmp_ps_mask(v, best, _CMP_GT_OQ);  // strict: a tie keeps the earlier index
      nan |= _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
      best = _mm512_mask_mov_ps(best, larger, v);
      where = _mm512_mask_mov_epi32(where, larger, index);
    }
    if (nan) return -1;
    float top = _mm512_reduce_max_ps(best);
    __mmask16 at_top = _mm512_cmp_ps_mask(best, _mm512_set1_ps(top), _CMP_EQ_OQ);
    __m512i candidates = _mm512_mask_mov_epi32(_mm512_set1_epi32(INT32_MAX), at_top, where);
    int64_t first = _mm512_reduce_min_epi32(candidates);  // the earliest index holding the maximum
    return first_max_scalar(load, i, n, top, first);
  }
#endif
  if (n == 0) return -1;
  float start = load(0);
  if (std::isnan(start)) return -1;
  return first_max_scalar(load, 1, n, start, 0);
}

}  // namespace

torch::Tensor row_argmax(const torch::Tensor& logits) {
  TORCH_CHECK(logits.dim() == 2 && logits.stride(1) == 1 && logits.device().is_cpu(),
              "row_argmax: a CPU tensor [N, V] with contiguous rows");
  const bool bf16 = logits.scalar_type() == at::kBFloat16;
  TORCH_CHECK(bf16 || logits.scalar_type() == at::kFloat, "row_argmax: float32 or bfloat16 logits");
  const int64_t rows = logits.size(0), n = logits.size(1), stride = logits.stride(0);
  auto out = torch::empty({rows}, torch::kLong);
  int64_t* tokens = out.data_ptr<int64_t>();
  const char* base = static_cast<const char*>(logits.data_ptr());
  const int64_t row_bytes = stride * logits.element_size();
  // a row is ~100-200 KB: one thread for a row or two, the others' start-up would cost more than they save
  at::parallel_for(0, rows, 2, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const char* row = base + r * row_bytes;
      tokens[r] = bf16 ? first_max(reinterpret_cast<const uint16_t*>(row), n)
                       : first_max(reinterpret_cast<const float*>(row), n);
    }
  });
  return out;
}
