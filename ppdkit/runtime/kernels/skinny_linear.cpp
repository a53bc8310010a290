// y = x W^T for a few rows x [M, K] and a weight packed into P-column panels: the matmul of a decoding step,
// bound by reading W. Each thread streams whole panels of W front to back (sequential reads the prefetcher
// follows) and keeps every partial sum in a register, so W is read once per pass of up to 15 rows (12 with
// AVX2). Two weight formats (runtime/forward/linear.py's table):
// - float32, panels [N/P, K, P] (P = 16 floats with AVX-512, 8 with AVX2 + FMA): y += x[k] * W[k] with FMA,
//   k in order;
// - bfloat16, panels [N/P, K/2, P, 2], with AVX512-BF16: x is rounded to bfloat16 (to nearest even) and
//   VDPBF16PS adds two exact products a k-pair, odd k first, into float32 sums, k-pairs in order (the
//   PyTorch twin, runtime/kernels/twin.py, does exactly these roundings). From `bf16_fma_from_rows` rows the
//   same panels go through float32 FMAs instead: each k-pair's two bfloat16 weights widened to float32 (exact),
//   then acc = fma(x_odd, w_odd, acc), acc = fma(x_even, w_even, acc). A product of two bfloat16 numbers is exact
//   in float32, so each FMA rounds what VDPBF16PS rounds, once; with denormals flushed (MXCSR's DAZ and FTZ, as
//   VDPBF16PS does) the sums are the same bits. (The one case apart: a product below float32's smallest normal
//   from two normal numbers, which VDPBF16PS drops and an FMA adds, changes a sum only while the sum is below
//   2^-102: no activation row of a model gets there.) Where VDPBF16PS issues at a third of the FMAs' rate (Intel
//   cores without AMX tiles: 85 against 150 GMAC/s on 2 cores from 4 rows), this is the faster path for a step's
//   rows; runtime/kernels/native.py times both once per process and sets the threshold. Without VDPBF16PS (AVX2, or
//   AVX-512 without BF16) every row count takes the FMAs: the same bits, and half float32's bytes to read.
// - bfloat16 on AMX tiles (AMX-BF16), the same panels with K padded to a multiple of 32: a B tile is 16
//   consecutive k-pair rows of one panel (1 KB), an A tile up to 16 rows of x's 32 k values, and TDPBF16PS adds
//   the 32 products of a k-block into each float32 sum, k-blocks in order; rows in tiles of 16, every tile
//   against four panels in turn, so W comes from memory once whatever the rows. The hardware's rounding inside
//   a k-block is its own (it matches neither sequential order of the SDM's pseudo-code, measured), so this path
//   has no bit-for-bit twin; it is held to the twin within a bound and to row invariance
//   (tests/test_precision.py).
// A row's sums never depend on the other rows of the call, so its result is the same for any number of rows
// (the decoder's losslessness rests on this; runtime/forward/row_invariance.py checks it at load). The two bfloat16
// paths round differently, so a process packs every weight for one of them (skinny_pack's `kernel`).
// Built on first use with -march=native (runtime/kernels/native.py falls back to oneDNN on other CPUs).
#include "skinny_linear.h"

#include <ATen/Parallel.h>

#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include "amx_tiles.h"
#if defined(__AMX_TILE__) && defined(__AMX_BF16__)
#define PPDKIT_AMX 1
#endif

namespace {

#ifdef __AVX512F__
using Vec = __m512;
constexpr int64_t kPanel = 16;  // output columns per panel: one vector register of floats
constexpr int kMaxRows = 15;    // rows per pass
constexpr int kRegisters = 32;
inline Vec vzero() { return _mm512_setzero_ps(); }
inline void vstore(float* p, Vec v) { _mm512_storeu_ps(p, v); }
#else
using Vec = __m256;
constexpr int64_t kPanel = 8;
constexpr int kMaxRows = 12;
constexpr int kRegisters = 16;
inline Vec vzero() { return _mm256_setzero_ps(); }
inline void vstore(float* p, Vec v) { _mm256_storeu_ps(p, v); }
#endif

// The floating-point environment a format's panels run in: as the thread has it (FlushDenormals below: VDPBF16PS's).
struct KeepDenormals {};

// A weight format: W (its element), the k values one panel row holds (Step), X (x's operand for one panel row),
// the vector registers one panel row takes (Registers), the floating-point environment it needs (Denormals) and the
// multiply-add of one panel row into the accumulators.
struct Float32 {
  using W = float;
  using X = float;
  static constexpr int64_t Step = 1;
  static constexpr int Registers = 1;
  using Denormals = KeepDenormals;
#ifdef __AVX512F__
  using Row = __m512;
  static Row load(const W* p) { return _mm512_loadu_ps(p); }
  static Vec madd(Vec acc, X x, Row w) { return _mm512_fmadd_ps(_mm512_set1_ps(x), w, acc); }
#else
  using Row = __m256;
  static Row load(const W* p) { return _mm256_loadu_ps(p); }
  static Vec madd(Vec acc, X x, Row w) { return _mm256_fmadd_ps(_mm256_set1_ps(x), w, acc); }
#endif
};

// VDPBF16PS's treatment of denormals (DAZ, FTZ) for the FMAs of the calling thread, while it lives.
class FlushDenormals {
 public:
  FlushDenormals() : saved_(_mm_getcsr()) { _mm_setcsr(saved_ | 0x8040); }
  ~FlushDenormals() { _mm_setcsr(saved_); }

 private:
  unsigned saved_;
};

#ifdef __AVX512BF16__
struct BFloat16 {
  using W = uint16_t;
  using X = uint32_t;  // x[k] and x[k + 1] as bfloat16, k even
  static constexpr int64_t Step = 2;
  static constexpr int Registers = 1;
  using Denormals = KeepDenormals;  // VDPBF16PS flushes them whatever MXCSR says
  using Row = __m512i;
  static Row load(const W* p) { return _mm512_loadu_si512(p); }
  static Vec madd(Vec acc, X x, Row w) {
    return _mm512_dpbf16_ps(acc, (__m512bh)_mm512_set1_epi32(static_cast<int>(x)), (__m512bh)w);
  }
};
#endif

// The same panels on float32 FMAs: a panel row's k-pairs (16 with AVX-512, 8 with AVX2) widened into its even and
// odd k (a bfloat16 is the high half of a float32), x given as float32 pairs already rounded to bfloat16. Every
// build has it: where the CPU has no VDPBF16PS (AVX2, or AVX-512 without BF16) it is bfloat16's only path, with the
// dot products' bits all the same.
struct BFloat16Fma {
  using W = uint16_t;
  struct X {
    float even, odd;
  };
  static constexpr int64_t Step = 2;
  static constexpr int Registers = 2;
  using Denormals = FlushDenormals;
  struct Row {
    Vec even, odd;
  };
#ifdef __AVX512F__
  static Row load(const W* p) {
    const __m512i pairs = _mm512_loadu_si512(p);
    return {_mm512_castsi512_ps(_mm512_slli_epi32(pairs, 16)),
            _mm512_castsi512_ps(_mm512_and_si512(pairs, _mm512_set1_epi32(static_cast<int>(0xFFFF0000u))))};
  }
  static Vec madd(Vec acc, X x, Row w) {  // odd k first, as VDPBF16PS adds them
    acc = _mm512_fmadd_ps(_mm512_set1_ps(x.odd), w.odd, acc);
    return _mm512_fmadd_ps(_mm512_set1_ps(x.even), w.even, acc);
  }
#else
  static Row load(const W* p) {
    const __m256i pairs = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    return {_mm256_castsi256_ps(_mm256_slli_epi32(pairs, 16)),
            _mm256_castsi256_ps(_mm256_and_si256(pairs, _mm256_set1_epi32(static_cast<int>(0xFFFF0000u))))};
  }
  static Vec madd(Vec acc, X x, Row w) {
    acc = _mm256_fmadd_ps(_mm256_set1_ps(x.odd), w.odd, acc);
    return _mm256_fmadd_ps(_mm256_set1_ps(x.even), w.even, acc);
  }
#endif
};

// Panels [p0, p1) of W, `Cols` panels at a time, for `Rows` rows of x: Rows * Cols accumulators. k_rows: the
// panel rows (K / F::Step).
template <typename F, int Rows, int Cols>
void panels(const typename F::X* __restrict x, const typename F::W* __restrict w, float* __restrict y,
            int64_t k_rows, int64_t n_dim, int64_t p0, int64_t p1) {
  constexpr int64_t row_width = kPanel * F::Step;  // W elements per panel row
  for (int64_t p = p0; p < p1; p += Cols) {
    Vec acc[Rows][Cols];
#pragma GCC unroll 16
    for (int r = 0; r < Rows; ++r)
#pragma GCC unroll 4
      for (int c = 0; c < Cols; ++c) acc[r][c] = vzero();
    const typename F::W* panel = w + p * k_rows * row_width;
    // The next panels' lines are asked for as this group's are used, one per panel row: the sums of a few rows keep
    // the core busy between loads, and a demand miss would stall it (8 bfloat16 rows: 17 -> 13 ms a step)
    const typename F::W* next = p + 2 * Cols <= p1 ? panel + Cols * k_rows * row_width : nullptr;
    for (int64_t k = 0; k < k_rows; ++k) {
      typename F::Row wk[Cols];
      if (next)
#pragma GCC unroll 4
        for (int c = 0; c < Cols; ++c)
          _mm_prefetch(reinterpret_cast<const char*>(next + (c * k_rows + k) * row_width), _MM_HINT_T0);
#pragma GCC unroll 4
      for (int c = 0; c < Cols; ++c) wk[c] = F::load(panel + (c * k_rows + k) * row_width);
#pragma GCC unroll 16
      for (int r = 0; r < Rows; ++r) {
        const typename F::X xk = x[r * k_rows + k];
#pragma GCC unroll 4
        for (int c = 0; c < Cols; ++c) acc[r][c] = F::madd(acc[r][c], xk, wk[c]);
      }
    }
#pragma GCC unroll 16
    for (int r = 0; r < Rows; ++r)
#pragma GCC unroll 4
      for (int c = 0; c < Cols; ++c) vstore(y + r * n_dim + (p + c) * kPanel, acc[r][c]);
  }
}

// Few rows: several panels at once (independent chains, more streams); more rows: fewer panels, so the
// accumulators (at most 30 of 32 registers with AVX-512, 12 of 16 with AVX2) and the panel rows fit in the
// vector registers; x's broadcasts fold into the multiply-adds as memory operands. Two panels up to 15 rows:
// one panel for 13-16 rows cost 25-30% more per row (a load per 16 FMAs, measured on a 1536 x 576 float32
// weight), so 16 rows run as two passes of 8.
template <typename F, int Rows>
void run(const typename F::X* x, const typename F::W* w, float* y, int64_t k_rows, int64_t n_dim) {
  // two panels' rows (F::Registers each) and the sums must fit
  // (AVX2: the most of 4, 2, 1 panels whose sums, rows and x's broadcast, which AVX2 cannot fold, fit in 16)
  constexpr auto fits = [](int cols) { return Rows * cols + cols * F::Registers + 1 <= kRegisters; };
  constexpr int Cols = kRegisters == 32 ? (Rows <= 4 ? 4 : 2 * (Rows + F::Registers) <= kRegisters ? 2 : 1)
                                        : (fits(4) ? 4 : fits(2) ? 2 : 1);
  const int64_t groups = n_dim / kPanel / Cols;
  at::parallel_for(0, groups, 4, [&](int64_t g0, int64_t g1) {
    const typename F::Denormals environment;  // on each thread that runs panels
    panels<F, Rows, Cols>(x, w, y, k_rows, n_dim, g0 * Cols, g1 * Cols);
  });
  const int64_t done = groups * Cols;  // the last panels when their count is not a multiple of Cols
  if (done * kPanel < n_dim) {
    const typename F::Denormals environment;
    panels<F, Rows, 1>(x, w, y, k_rows, n_dim, done, n_dim / kPanel);
  }
}

template <typename F, int Rows>
void dispatch(int64_t m, const typename F::X* x, const typename F::W* w, float* y, int64_t k_rows, int64_t n_dim) {
  if constexpr (Rows > kMaxRows) {
    TORCH_CHECK(false, "skinny_linear takes at most ", kMaxRows, " rows per pass, got ", m);
  } else if (m == Rows) {
    run<F, Rows>(x, w, y, k_rows, n_dim);
  } else {
    dispatch<F, Rows + 1>(m, x, w, y, k_rows, n_dim);
  }
}

// y [M, padded N] = x W^T in balanced passes of at most kMaxRows rows (18 rows as 9 + 9), each reading W once.
template <typename F>
void passes(int64_t m, const typename F::X* x, const typename F::W* w, float* y, int64_t k_rows, int64_t n_dim) {
  const int64_t count = (m + kMaxRows - 1) / kMaxRows;
  for (int64_t pass = 0, row = 0; pass < count; ++pass) {
    const int64_t rows = (m - row) / (count - pass);
    dispatch<F, 1>(rows, x + row * k_rows, w, y + row * n_dim, k_rows, n_dim);
    row += rows;
  }
}

#ifdef PPDKIT_AMX
using amx::TileConfig;

constexpr int64_t kBlock = 32;  // k values per tile: 16 k-pairs of bfloat16, 64 bytes

// Tiles: tmm0-3 sums (four panels), tmm4 x, tmm6-7 weights; every tile of x and of sums `rows` (<= 16) rows.
TileConfig tile_config(int64_t rows) {
  TileConfig config;
  for (int t = 0; t < 8; ++t) config.colsb[t] = 64;
  for (int t : {0, 1, 2, 3, 4}) config.rows[t] = static_cast<uint8_t>(rows);
  config.rows[5] = 1;  // unused
  config.rows[6] = config.rows[7] = 16;
  return config;
}

// Panels [p0, p1) for x in `tiles` tiles of `rows` <= 16 rows (bfloat16 [tiles * rows, k_blocks * 32], zero rows
// past the real ones) into y [tiles * rows, n_dim]; w: panels [N/16, k_blocks * 16, 16, 2]. Four panels at a
// time, every tile of x against them in turn: the four panels (at most 4 x 48 KB here) come from memory for
// the first tile and from L2 for the others, so W is read once whatever the rows. A panel's sums gain its
// k-blocks in order; a row's sums depend on nothing else.
void amx_panels(const uint16_t* x, const uint16_t* w, float* y, int64_t rows, int64_t tiles, int64_t k_blocks,
                int64_t n_dim, int64_t p0, int64_t p1) {
  const amx::Scope tiles_in_use(tile_config(rows));
  const int64_t x_stride = k_blocks * kBlock, x_bytes = x_stride * 2, y_bytes = n_dim * 4;
  const int64_t panel = k_blocks * kBlock * kPanel;
  auto tile = [&](int64_t p, int64_t block) { return w + p * panel + block * kBlock * kPanel; };
  int64_t p = p0;
  for (; p + 4 <= p1; p += 4) {  // four independent sums, two weight tiles in turn
    for (int64_t t = 0; t < tiles; ++t) {
      const uint16_t* xt = x + t * rows * x_stride;
      float* yt = y + t * rows * n_dim;
      _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3);
      for (int64_t b = 0; b < k_blocks; ++b) {
        _tile_loadd(4, xt + b * kBlock, x_bytes);
        _tile_loadd(6, tile(p, b), 64);
        _tile_dpbf16ps(0, 4, 6);
        _tile_loadd(7, tile(p + 1, b), 64);
        _tile_dpbf16ps(1, 4, 7);
        _tile_loadd(6, tile(p + 2, b), 64);
        _tile_dpbf16ps(2, 4, 6);
        _tile_loadd(7, tile(p + 3, b), 64);
        _tile_dpbf16ps(3, 4, 7);
      }
      _tile_stored(0, yt + p * kPanel, y_bytes);
      _tile_stored(1, yt + (p + 1) * kPanel, y_bytes);
      _tile_stored(2, yt + (p + 2) * kPanel, y_bytes);
      _tile_stored(3, yt + (p + 3) * kPanel, y_bytes);
    }
  }
  for (; p < p1; ++p) {  // the last panels, one at a time: the same k-block order
    for (int64_t t = 0; t < tiles; ++t) {
      const uint16_t* xt = x + t * rows * x_stride;
      _tile_zero(0);
      for (int64_t b = 0; b < k_blocks; ++b) {
        _tile_loadd(4, xt + b * kBlock, x_bytes);
        _tile_loadd(6, tile(p, b), 64);
        _tile_dpbf16ps(0, 4, 6);
      }
      _tile_stored(0, y + t * rows * n_dim + p * kPanel, y_bytes);
    }
  }
}

// y [tiles * rows, n_dim] = x W^T for x [tiles * rows, k_blocks * 32] in tiles of `rows` rows; threads split the
// panels in groups of four.
void amx_linear(const uint16_t* x, const uint16_t* w, float* y, int64_t rows, int64_t tiles, int64_t k_blocks,
                int64_t n_dim) {
  const int64_t panels = n_dim / kPanel;
  at::parallel_for(0, (panels + 3) / 4, 2, [&](int64_t g0, int64_t g1) {
    amx_panels(x, w, y, rows, tiles, k_blocks, n_dim, g0 * 4, std::min(g1 * 4, panels));
  });
}
#endif

// x [M, K] rounded to bfloat16 once per call (to nearest even, as PyTorch rounds) as `convert` gives each value (its
// bits, or widened back to float32), [M, 2 k_pairs] with a zero past an odd K. A plain loop: three tensor operations
// here cost a one-row step ~6 ms on 2 AVX2 cores (120 calls a step).
template <typename T, typename Convert>
std::vector<T> bf16_rows(const float* xs, int64_t m, int64_t k, int64_t k_pairs, Convert convert) {
  std::vector<T> rows(m * k_pairs * 2, T{});
  for (int64_t r = 0; r < m; ++r)
    for (int64_t i = 0; i < k; ++i) rows[r * k_pairs * 2 + i] = convert(xs[r * k + i]);
  return rows;
}

// From this many rows the AVX512-BF16 path multiplies on float32 FMAs (the same bits, see the top); never until set.
std::atomic<int64_t> fma_from_rows{INT64_MAX};

}  // namespace

bool skinny_linear_available() { return true; }

int64_t skinny_bf16_fma_from_rows(int64_t rows) {
  if (rows > 0) fma_from_rows = rows;
  return fma_from_rows;
}

bool skinny_amx_available() {
#ifdef PPDKIT_AMX
  return amx::permitted();
#else
  return false;
#endif
}

bool skinny_bf16_available() { return true; }  // VDPBF16PS where the CPU has it, float32 FMAs everywhere

bool skinny_bf16_dot_available() {
#ifdef __AVX512BF16__
  return true;
#else
  return false;
#endif
}

std::string skinny_vector_kernel() {
#ifdef __AVX512F__
  return "avx512";
#else
  return "avx2";
#endif
}

torch::Tensor skinny_pack(const torch::Tensor& weight, const std::string& kernel) {
  TORCH_CHECK(weight.dim() == 2, "pack takes a [N, K] weight");
  TORCH_CHECK(kernel == "auto" || kernel == "amx" || kernel == "avx512" || kernel == "avx2",
              "pack's kernel is auto, amx, avx512 or avx2, not ", kernel);
  TORCH_CHECK(kernel == "auto" || kernel == "amx" || kernel == skinny_vector_kernel(), "pack: this build's vector "
              "panels are ", skinny_vector_kernel(), "'s, not ", kernel, "'s");
  const int64_t n = weight.size(0), k = weight.size(1), padded = (n + kPanel - 1) / kPanel * kPanel;
  if (weight.scalar_type() == torch::kFloat32) {  // [N, K] -> [ceil(N/P), K, P], zero padded
    auto w = torch::zeros({padded, k}, weight.options());
    w.narrow(0, 0, n).copy_(weight);
    return w.view({padded / kPanel, kPanel, k}).transpose(1, 2).contiguous();
  }
  TORCH_CHECK(weight.scalar_type() == torch::kBFloat16, "pack takes a float32 or a bfloat16 weight");
  const bool amx = kernel == "amx" || (kernel == "auto" && skinny_amx_available());
  TORCH_CHECK(!amx || skinny_amx_available(), "pack: this CPU or build has no AMX-BF16 tiles");
  // [N, K] -> [ceil(N/P), ceil(K/2), P, 2]: a panel row is P columns' k-pair, one VDPBF16PS operand. For
  // AMX, K padded to whole tiles and viewed [ceil(N/16), K/32, 16, 16, 2]: a tile of 16 panel rows per k-block
  // (the fifth dimension tells skinny_linear which path the panels are for).
  const int64_t k_even = amx ? (k + 31) / 32 * 32 : (k + 1) / 2 * 2;
  auto w = torch::zeros({padded, k_even}, weight.options());
  w.narrow(0, 0, n).narrow(1, 0, k).copy_(weight);
  auto panels = w.view({padded / kPanel, kPanel, k_even / 2, 2}).permute({0, 2, 1, 3}).contiguous();
  return amx ? panels.view({padded / kPanel, k_even / 32, 16, kPanel, 2}) : panels;
}

torch::Tensor skinny_linear(const torch::Tensor& x, const torch::Tensor& packed, int64_t out_features) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == torch::kFloat32, "skinny_linear takes float32 x [M, K]");
  const int64_t m = x.size(0), k = x.size(1), padded = packed.size(0) * kPanel;
  auto y = torch::empty({m, padded}, x.options());
  if (packed.scalar_type() == torch::kFloat32) {
    TORCH_CHECK(k == packed.size(1), "skinny_linear: x [M, K] must match the packed weight's K");
    auto xc = x.contiguous();
    passes<Float32>(m, xc.data_ptr<float>(), packed.data_ptr<float>(), y.data_ptr<float>(), k, padded);
  } else if (packed.dim() == 5) {
#ifdef PPDKIT_AMX
    TORCH_CHECK(packed.scalar_type() == torch::kBFloat16 && (k + 31) / 32 == packed.size(1),
                "skinny_linear: x [M, K] must match the AMX-packed bfloat16 weight's K");
    // rows in tiles of up to 16; x rounded to nearest even, as PyTorch rounds, with zeros up to whole tiles
    const int64_t rows = std::min<int64_t>(m, 16), tiles = (m + 15) / 16;
    auto xb = torch::zeros({tiles * rows, packed.size(1) * 32}, x.options().dtype(torch::kBFloat16));
    xb.narrow(0, 0, m).narrow(1, 0, k).copy_(x);
    auto yt = tiles * rows == m ? y : torch::empty({tiles * rows, padded}, x.options());
    amx_linear(reinterpret_cast<const uint16_t*>(xb.data_ptr()), reinterpret_cast<const uint16_t*>(packed.data_ptr()),
               yt.data_ptr<float>(), rows, tiles, packed.size(1), padded);
    if (tiles * rows != m) y = yt.narrow(0, 0, m);
#else
    TORCH_CHECK(false, "skinny_linear: built without AMX, so it takes no AMX-packed weight");
#endif
  } else {
    TORCH_CHECK(packed.scalar_type() == torch::kBFloat16 && packed.dim() == 4 && (k + 1) / 2 == packed.size(1) &&
                packed.size(2) == kPanel, "skinny_linear: x [M, K] must match the packed bfloat16 weight's K");
    const auto* panels_w = reinterpret_cast<const uint16_t*>(packed.data_ptr());
    const int64_t k_pairs = packed.size(1);
    auto xc = x.contiguous();
    const float* xs = xc.data_ptr<float>();
#ifdef __AVX512BF16__
    if (m < fma_from_rows) {  // k-pairs as one 32-bit operand
      const auto xb = bf16_rows<uint16_t>(xs, m, k, k_pairs, [](float v) { return c10::BFloat16(v).x; });
      passes<BFloat16>(m, reinterpret_cast<const uint32_t*>(xb.data()), panels_w, y.data_ptr<float>(), k_pairs,
                       padded);
      return padded == out_features ? y : y.narrow(1, 0, out_features);
    }
#endif
    // the FMA path takes x's bfloat16 values as float32 (exact), in (even, odd) pairs
    const auto xf = bf16_rows<float>(xs, m, k, k_pairs, [](float v) { return static_cast<float>(c10::BFloat16(v)); });
    passes<BFloat16Fma>(m, reinterpret_cast<const BFloat16Fma::X*>(xf.data()), panels_w, y.data_ptr<float>(), k_pairs,
                        padded);
  }
  return padded == out_features ? y : y.narrow(1, 0, out_features);
}

#else  // neither AVX-512 nor AVX2 + FMA at build time: the Python side uses oneDNN

bool skinny_linear_available() { return false; }
bool skinny_bf16_available() { return false; }
bool skinny_bf16_dot_available() { return false; }
std::string skinny_vector_kernel() { return ""; }
bool skinny_amx_available() { return false; }
int64_t skinny_bf16_fma_from_rows(int64_t) { return INT64_MAX; }
torch::Tensor skinny_pack(const torch::Tensor&, const std::string&) {
  TORCH_CHECK(false, "built without AVX-512 or AVX2");
}
torch::Tensor skinny_linear(const torch::Tensor&, const torch::Tensor&, int64_t) {
  TORCH_CHECK(false, "built without AVX-512 or AVX2");
}

#endif
