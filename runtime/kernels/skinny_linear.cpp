// y = x W^T for a few rows x [M, K] and a weight packed as [N/P, K, P]: the matmul of a decoding step,
// bound by reading W. Each thread streams whole P-column panels of W front to back (sequential reads
// the prefetcher follows) and keeps every partial sum in a register, so W is read once per pass of up
// to 15 rows (12 with AVX2). P is one vector register of floats: 16 with AVX-512, 8 with AVX2 + FMA.
// Built on first use with -march=native (runtime/native.py falls back to oneDNN on other CPUs).
// Sums run over k in order with FMA, as any float32 matmul rounds.
#include "skinny_linear.h"

#include <ATen/Parallel.h>

#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
#include <immintrin.h>

namespace {

#ifdef __AVX512F__
using Vec = __m512;
constexpr int64_t kPanel = 16;  // floats per panel row: one vector register
constexpr int kMaxRows = 15;    // rows per pass
constexpr int kRegisters = 32;
inline Vec vzero() { return _mm512_setzero_ps(); }
inline Vec vload(const float* p) { return _mm512_loadu_ps(p); }
inline Vec vbroadcast(float v) { return _mm512_set1_ps(v); }
inline Vec vfma(Vec a, Vec b, Vec c) { return _mm512_fmadd_ps(a, b, c); }
inline void vstore(float* p, Vec v) { _mm512_storeu_ps(p, v); }
#else
using Vec = __m256;
constexpr int64_t kPanel = 8;
constexpr int kMaxRows = 12;
constexpr int kRegisters = 16;
inline Vec vzero() { return _mm256_setzero_ps(); }
inline Vec vload(const float* p) { return _mm256_loadu_ps(p); }
inline Vec vbroadcast(float v) { return _mm256_set1_ps(v); }
inline Vec vfma(Vec a, Vec b, Vec c) { return _mm256_fmadd_ps(a, b, c); }
inline void vstore(float* p, Vec v) { _mm256_storeu_ps(p, v); }
#endif

// Panels [p0, p1) of W, `Cols` panels at a time, for `Rows` rows of x: Rows * Cols accumulators.
template <int Rows, int Cols>
void panels(const float* __restrict x, const float* __restrict w, float* __restrict y, int64_t k_dim,
            int64_t n_dim, int64_t p0, int64_t p1) {
  for (int64_t p = p0; p < p1; p += Cols) {
    Vec acc[Rows][Cols];
#pragma GCC unroll 16
    for (int r = 0; r < Rows; ++r)
#pragma GCC unroll 4
      for (int c = 0; c < Cols; ++c) acc[r][c] = vzero();
    const float* panel = w + p * k_dim * kPanel;
    for (int64_t k = 0; k < k_dim; ++k) {
      Vec wk[Cols];
#pragma GCC unroll 4
      for (int c = 0; c < Cols; ++c) wk[c] = vload(panel + (c * k_dim + k) * kPanel);
#pragma GCC unroll 16
      for (int r = 0; r < Rows; ++r) {
        const Vec xk = vbroadcast(x[r * k_dim + k]);
#pragma GCC unroll 4
        for (int c = 0; c < Cols; ++c) acc[r][c] = vfma(xk, wk[c], acc[r][c]);
      }
    }
#pragma GCC unroll 16
    for (int r = 0; r < Rows; ++r)
#pragma GCC unroll 4
      for (int c = 0; c < Cols; ++c) vstore(y + r * n_dim + (p + c) * kPanel, acc[r][c]);
  }
}

// Few rows: several panels at once (independent FMA chains, more streams); more rows: fewer panels,
// so the accumulators (at most 30 of 32 registers with AVX-512, 12 of 16 with AVX2) and the panel
// rows fit in the vector registers; x's broadcasts fold into the FMAs as memory operands. Two panels
// up to 15 rows: one panel for 13-16 rows cost 25-30% more per row (a load per 16 FMAs, measured on
// a 1536 x 576 weight), so 16 rows run as two passes of 8.
template <int Rows>
void run(const float* x, const float* w, float* y, int64_t k_dim, int64_t n_dim) {
  constexpr int Cols = kRegisters == 32 ? (Rows <= 4 ? 4 : Rows <= 15 ? 2 : 1) : (Rows <= 2 ? 4 : Rows <= 6 ? 2 : 1);
  const int64_t groups = n_dim / kPanel / Cols;
  at::parallel_for(0, groups, 4, [&](int64_t g0, int64_t g1) {
    panels<Rows, Cols>(x, w, y, k_dim, n_dim, g0 * Cols, g1 * Cols);
  });
  const int64_t done = groups * Cols;  // the last panels when their count is not a multiple of Cols
  if (done * kPanel < n_dim) panels<Rows, 1>(x, w, y, k_dim, n_dim, done, n_dim / kPanel);
}

template <int Rows>
void dispatch(int64_t m, const float* x, const float* w, float* y, int64_t k_dim, int64_t n_dim) {
  if constexpr (Rows > kMaxRows) {
    TORCH_CHECK(false, "skinny_linear takes at most ", kMaxRows, " rows per pass, got ", m);
  } else if (m == Rows) {
    run<Rows>(x, w, y, k_dim, n_dim);
  } else {
    dispatch<Rows + 1>(m, x, w, y, k_dim, n_dim);
  }
}

}  // namespace

bool skinny_linear_available() { return true; }

torch::Tensor skinny_pack(const torch::Tensor& weight) {  // [N, K] -> [ceil(N/P), K, P], zero padded
  TORCH_CHECK(weight.dim() == 2 && weight.scalar_type() == torch::kFloat32, "pack takes a float32 [N, K] weight");
  const int64_t n = weight.size(0), k = weight.size(1), padded = (n + kPanel - 1) / kPanel * kPanel;
  auto w = torch::zeros({padded, k}, weight.options());
  w.narrow(0, 0, n).copy_(weight);
  return w.view({padded / kPanel, kPanel, k}).transpose(1, 2).contiguous();
}

torch::Tensor skinny_linear(const torch::Tensor& x, const torch::Tensor& packed, int64_t out_features) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == torch::kFloat32 && x.size(1) == packed.size(1),
              "skinny_linear takes float32 x [M, K] matching the packed weight");
  const int64_t m = x.size(0), k = x.size(1), padded = packed.size(0) * kPanel;
  auto xc = x.contiguous();
  auto y = torch::empty({m, padded}, x.options());
  // More than kMaxRows rows: balanced passes (18 rows as 9 + 9), each reading the weight once.
  const int64_t passes = (m + kMaxRows - 1) / kMaxRows;
  for (int64_t pass = 0, row = 0; pass < passes; ++pass) {
    const int64_t rows = (m - row) / (passes - pass);
    dispatch<1>(rows, xc.data_ptr<float>() + row * k, packed.data_ptr<float>(), y.data_ptr<float>() + row * padded,
                k, padded);
    row += rows;
  }
  return padded == out_features ? y : y.narrow(1, 0, out_features);
}

#else  // neither AVX-512 nor AVX2 + FMA at build time: the Python side uses oneDNN

bool skinny_linear_available() { return false; }
torch::Tensor skinny_pack(const torch::Tensor&) { TORCH_CHECK(false, "built without AVX-512 or AVX2"); }
torch::Tensor skinny_linear(const torch::Tensor&, const torch::Tensor&, int64_t) {
  TORCH_CHECK(false, "built without AVX-512 or AVX2");
}

#endif
