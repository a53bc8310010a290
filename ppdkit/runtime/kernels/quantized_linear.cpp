// y = x W^T for a few rows x [M, K] and a weight given as GGUF blocks of 32 (runtime/forward/gguf_blocks.py): Q4_1
// (w = d q + m, q in 0..15) or Q8_0 (w = d q, q int8). The arithmetic is runtime/kernels/twin.py's
// quantized_linear_twin, bit for bit:
// - x is quantized per row and block: amax / 127 its scale dx, round-half-even(x * (127 / amax)) its int8 codes;
// - per output and block, AVX512-VNNI's VPDPBUSD (or, from 16 rows where the CPU has them, AMX-INT8's TDPBSUD)
//   sums the products of the weight's unsigned codes and x's signed codes exactly in int32 (Q8_0's signed codes
//   are stored plus 128, and 128 * sum(x codes) taken off after);
// - per block in order, the float32 sum gains (dw * dx) * s, then for Q4_1 mw * (dx * sum(x codes)), each product
//   and sum rounded once (-ffp-contract=off: no FMA).
// Panels hold 16 outputs (one vector of lanes), packed into one uint8 tensor [N/16, B, bytes]: per block the 16
// outputs' codes (Q4_1: 256 bytes, two codes a byte; Q8_0: 512), then their 16 scales, then (Q4_1) their 16
// minimums, both float16 as the GGUF holds them, so a block's data is read in one stream. Each row's operations are
// the same whatever the number of rows, so a row's result never depends on the rows beside it. Rows share the weight
// loads: a pass of up to 12 rows reads W once.
#include "quantized_linear.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <vector>

#ifdef __AVX512VNNI__
#include <immintrin.h>

#include "amx_tiles.h"

namespace {

constexpr int64_t kLanes = 16;  // outputs per panel
constexpr int64_t kBlock = 32;  // weights per block
constexpr int kMaxRows = 12;    // rows per pass: 12 sums, 8 weight vectors and the scales fit in 32 registers
// from this many rows AMX-INT8 tiles, where the CPU has them (amx_from_rows): over a whole model's weights streamed
// from memory on a 2-core Sapphire Rapids Xeon, the tiles took 1.17x VNNI's time at 4-12 rows and 0.94x at 16
// (docs/measurements/step-costs-gguf.json); in cache they win from 12
constexpr int64_t kAmxRows = 16;
std::atomic<int64_t> amx_rows{kAmxRows};  // the threshold in use (quantized_amx_from_rows sets it)

// x's int8 codes and per-block figures, in a buffer of the calling thread's that every call reuses: a step makes
// ~120 of these (4 matmuls a layer), and 4 tensors each cost more in allocation than the quantization itself.
struct Activations {
  int8_t* codes;       // [M, K]
  float* scale;        // [M, B]: amax / 127
  float* scaled_sum;   // [M, B]: scale * sum of the block's codes
  int32_t* code_sum;   // [M, B]: sum of the block's codes
};

Activations quantize_rows(const torch::Tensor& x) {
  const int64_t m = x.size(0), k = x.size(1), blocks = k / kBlock;
  thread_local std::vector<uint8_t> buffer;
  const size_t code_bytes = (static_cast<size_t>(m * k) + 63) / 64 * 64, figures = static_cast<size_t>(m * blocks);
  buffer.resize(code_bytes + 3 * figures * 4 + 64);
  uint8_t* base = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(buffer.data()) + 63) & ~uintptr_t{63});
  Activations a{reinterpret_cast<int8_t*>(base), reinterpret_cast<float*>(base + code_bytes),
                reinterpret_cast<float*>(base + code_bytes + figures * 4),
                reinterpret_cast<int32_t*>(base + code_bytes + 2 * figures * 4)};
  const float* src = x.data_ptr<float>();
  int8_t* codes = a.codes;
  float *scale = a.scale, *scaled = a.scaled_sum;
  int32_t* sums = a.code_sum;
  const __m512 abs_mask = _mm512_castsi512_ps(_mm512_set1_epi32(0x7fffffff));
  for (int64_t i = 0; i < m * blocks; ++i) {  // a block of 32 is two vectors
    const float* v = src + i * kBlock;
    const __m512 lo = _mm512_loadu_ps(v), hi = _mm512_loadu_ps(v + kLanes);
    const float amax = _mm512_reduce_max_ps(
        _mm512_max_ps(_mm512_and_ps(lo, abs_mask), _mm512_and_ps(hi, abs_mask)));  // exact, in any order
    const float inverse = amax == 0.0f ? 0.0f : 127.0f / amax;
    const __m512 by = _mm512_set1_ps(inverse);
    constexpr int kNearestEven = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
    const __m512i q_lo = _mm512_cvt_roundps_epi32(_mm512_mul_ps(lo, by), kNearestEven);
    const __m512i q_hi = _mm512_cvt_roundps_epi32(_mm512_mul_ps(hi, by), kNearestEven);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(codes + i * kBlock), _mm512_cvtepi32_epi8(q_lo));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(codes + i * kBlock + kLanes), _mm512_cvtepi32_epi8(q_hi));
    const int32_t sum = _mm512_reduce_add_epi32(_mm512_add_epi32(q_lo, q_hi));  // exact in int32
    scale[i] = amax / 127.0f;
    sums[i] = sum;
    scaled[i] = scale[i] * static_cast<float>(sum);
  }
  return a;
}

inline __m512i broadcast4(const int8_t* p) {  // x's codes k .. k + 3 in every lane
  int32_t v;
  std::memcpy(&v, p, sizeof v);
  return _mm512_set1_epi32(v);
}

// One block's float32 steps for one row and a panel's 16 outputs: the contract both paths (VNNI, AMX) share and
// runtime/kernels/twin.py writes down. s: the block's exact integer sums (Q8_0: before taking off 128 x the sum of
// x's codes); dx, dxs, code_sum: x's scale, scale x code sum, and code sum for the block.
template <bool Q4>
inline __m512 add_block(__m512 acc, __m512i s, __m512 scale, __m512 minimum, float dx, float dxs, int32_t code_sum) {
  if constexpr (!Q4) s = _mm512_sub_epi32(s, _mm512_set1_epi32(128 * code_sum));
  acc = _mm512_add_ps(acc, _mm512_mul_ps(_mm512_mul_ps(scale, _mm512_set1_ps(dx)), _mm512_cvtepi32_ps(s)));
  if constexpr (Q4) acc = _mm512_add_ps(acc, _mm512_mul_ps(minimum, _mm512_set1_ps(dxs)));
  return acc;
}

constexpr int64_t kQ4Codes = kLanes * kBlock / 2, kQ8Codes = kLanes * kBlock;  // code bytes per panel block
// with the 16 scales (and minimums) as float16, as the GGUF stores them: exact (QuantizedWeight's are float16 values),
// and a block's bytes are what the one-row step streams (Q4_1 320 per 16 x 32 weights against 384 as float32)
constexpr int64_t kQ4Stride = kQ4Codes + 2 * kLanes * 2, kQ8Stride = kQ8Codes + kLanes * 2;

inline __m512 halves(const uint8_t* p) {  // 16 float16 -> float32, exactly
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}

// Panels [p0, p1) of W for `Rows` rows of x.
template <bool Q4, int Rows>
void panels(const Activations& a, int64_t row0, const uint8_t* __restrict w, float* __restrict y, int64_t blocks,
            int64_t n_dim, int64_t p0, int64_t p1) {
  constexpr int64_t codes_bytes = Q4 ? kQ4Codes : kQ8Codes, stride = Q4 ? kQ4Stride : kQ8Stride;
  const int64_t k = blocks * kBlock;
  const int8_t* xq = a.codes + row0 * k;
  const float* dx = a.scale + row0 * blocks;
  const float* dxs = a.scaled_sum + row0 * blocks;
  const int32_t* xs = a.code_sum + row0 * blocks;
  const __m512i low = _mm512_set1_epi8(0x0F);
  for (int64_t p = p0; p < p1; ++p) {
    __m512 acc[Rows];
#pragma GCC unroll 12
    for (int r = 0; r < Rows; ++r) acc[r] = _mm512_setzero_ps();
    // the next panel's block is asked for as this one's is used: its lines arrive while the rows' sums run (a step's
    // matmuls 1.1-1.2x faster from 4 rows on 2 cores, measured A/B in one process)
    const uint8_t* next = p + 1 < p1 ? w + (p + 1) * blocks * stride : nullptr;
    for (int64_t b = 0; b < blocks; ++b) {
      const uint8_t* block = w + (p * blocks + b) * stride;
      if (next)
        for (int64_t line = 0; line < stride; line += 64)
          _mm_prefetch(reinterpret_cast<const char*>(next + b * stride + line), _MM_HINT_T0);
      __m512i wv[8];  // wv[g]: the 16 outputs' codes k = 4g .. 4g + 3
      if constexpr (Q4) {  // 4 vectors: low nibbles k = 4h + j, high nibbles k = 16 + 4h + j
#pragma GCC unroll 4
        for (int h = 0; h < 4; ++h) {
          const __m512i v = _mm512_loadu_si512(block + h * 64);
          wv[h] = _mm512_and_si512(v, low);
          wv[h + 4] = _mm512_and_si512(_mm512_srli_epi16(v, 4), low);
        }
      } else {
#pragma GCC unroll 8
        for (int g = 0; g < 8; ++g) wv[g] = _mm512_loadu_si512(block + g * 64);
      }
      const __m512 scale = halves(block + codes_bytes);
      const __m512 minimum = Q4 ? halves(block + codes_bytes + kLanes * 2) : _mm512_setzero_ps();
#pragma GCC unroll 12
      for (int r = 0; r < Rows; ++r) {
        const int8_t* xr = xq + r * k + b * kBlock;
        __m512i s = _mm512_setzero_si512();
#pragma GCC unroll 8
        for (int g = 0; g < 8; ++g) s = _mm512_dpbusd_epi32(s, wv[g], broadcast4(xr + 4 * g));
        const int64_t i = r * blocks + b;
        acc[r] = add_block<Q4>(acc[r], s, scale, minimum, dx[i], dxs[i], xs[i]);
      }
    }
#pragma GCC unroll 12
    for (int r = 0; r < Rows; ++r) _mm512_storeu_ps(y + r * n_dim + p * kLanes, acc[r]);
  }
}

#if defined(__AMX_TILE__) && defined(__AMX_INT8__)
#define PPDKIT_AMX_INT8 1
// AMX-INT8 for many rows: TDPBSUD sums a block's 32 products of x's signed codes and the weight's unsigned codes
// exactly in int32 for up to 16 rows and a panel's 16 outputs at once: the same integers VPDPBUSD gives, so the
// float32 steps after it (the same as panels()'s, in the same order) make the same bits, and a row's result is
// the same on either path. One panel at a time, its 16 x 16 sums in registers; a block's int32 sums go through a
// 1 KB tile store. Q4_1's nibbles are unpacked into the tile's 8 rows of k-quads first (rows 0-3 the low nibbles,
// k = 4h + j, rows 4-7 the high ones, k = 16 + 4h + j: row g holds k = 4g .. 4g + 3).
// Panels [p0, p1) for x's rows in `tiles` tiles of `rows` (codes [tiles * rows, K], zero rows past the `m` real
// ones), into y [m, n_dim].
template <bool Q4>
void amx_panels(const Activations& a, const int8_t* codes, int64_t m, int64_t rows, int64_t tiles,
                const uint8_t* __restrict w, float* __restrict y, int64_t blocks, int64_t n_dim, int64_t p0,
                int64_t p1) {
  constexpr int64_t codes_bytes = Q4 ? kQ4Codes : kQ8Codes, stride = Q4 ? kQ4Stride : kQ8Stride;
  amx::TileConfig config;
  config.rows[0] = config.rows[1] = static_cast<uint8_t>(rows);  // tmm0: sums, tmm1: x codes, tmm2: weights
  config.colsb[0] = 64, config.colsb[1] = kBlock;
  config.rows[2] = 8, config.colsb[2] = 64;
  config.rows[3] = static_cast<uint8_t>(rows), config.colsb[3] = 64;  // tmm3: the next block's sums
  const amx::Scope tiles_in_use(config);
  const int64_t k = blocks * kBlock;
  const float* dx = a.scale;
  const float* dxs = a.scaled_sum;
  const int32_t* xs = a.code_sum;
  alignas(64) int32_t sums[2][16][kLanes];  // a block's int32 sums, two blocks in turn (tmm0 and tmm3)
  std::vector<uint8_t> unpacked(Q4 ? blocks * kQ8Codes + 64 : 0);  // a panel's weight tiles, Q4_1 unpacked once
  uint8_t* tiles_q4 = Q4 ? reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(unpacked.data()) + 63) & ~63ull)
                         : nullptr;
  const __m512i low = _mm512_set1_epi8(0x0F);
  for (int64_t p = p0; p < p1; ++p) {
    const uint8_t* panel = w + p * blocks * stride;
    // the next panel is asked for while this one's tiles run, as panels() does: streamed from memory, the tiles
    // otherwise wait for every panel's lines (8 rows: 1.25x VNNI's time over the whole model, 0.99x in cache)
    const uint8_t* next = p + 1 < p1 ? panel + blocks * stride : nullptr;
    if (next)
      for (int64_t line = 0; line < blocks * stride; line += 64)
        _mm_prefetch(reinterpret_cast<const char*>(next + line), _MM_HINT_T1);
    if constexpr (Q4) {
      for (int64_t b = 0; b < blocks; ++b)
        for (int h = 0; h < 4; ++h) {
          const __m512i v = _mm512_loadu_si512(panel + b * stride + h * 64);
          _mm512_store_si512(tiles_q4 + b * kQ8Codes + h * 64, _mm512_and_si512(v, low));
          _mm512_store_si512(tiles_q4 + b * kQ8Codes + (h + 4) * 64, _mm512_and_si512(_mm512_srli_epi16(v, 4), low));
        }
    }
    auto weights = [&](int64_t b) -> const uint8_t* { return Q4 ? tiles_q4 + b * kQ8Codes : panel + b * stride; };
    for (int64_t t = 0; t < tiles; ++t) {
      const int64_t r0 = t * rows, count = std::min(rows, m - r0);
      const int8_t* xt = codes + r0 * k;
      __m512 acc[16];
      for (int r = 0; r < 16; ++r) acc[r] = _mm512_setzero_ps();
      // block b's sums are in sums[b % 2]; block b + 1's tile product is issued before b's float32 steps run
      _tile_zero(0);
      _tile_loadd(1, xt, k);
      _tile_loadd(2, weights(0), 64);
      _tile_dpbsud(0, 1, 2);
      _tile_stored(0, sums[0], 64);
      for (int64_t b = 0; b < blocks; ++b) {
        if (b + 1 < blocks) {
          _tile_zero(3);
          _tile_loadd(1, xt + (b + 1) * kBlock, k);
          _tile_loadd(2, weights(b + 1), 64);
          _tile_dpbsud(3, 1, 2);
          _tile_stored(3, sums[(b + 1) % 2], 64);
        }
        const uint8_t* block = panel + b * stride;
        const __m512 scale = halves(block + codes_bytes);
        const __m512 minimum = Q4 ? halves(block + codes_bytes + kLanes * 2) : _mm512_setzero_ps();
#pragma GCC unroll 16
        for (int r = 0; r < 16; ++r) {  // panels()'s float32 steps, in its order (unrolled: acc stays in registers)
          if (r >= count) break;
          const int64_t i = (r0 + r) * blocks + b;
          acc[r] = add_block<Q4>(acc[r], _mm512_load_si512(sums[b % 2][r]), scale, minimum, dx[i], dxs[i], xs[i]);
        }
      }
#pragma GCC unroll 16
      for (int r = 0; r < 16; ++r)
        if (r < count) _mm512_storeu_ps(y + (r0 + r) * n_dim + p * kLanes, acc[r]);
    }
  }
}

template <bool Q4>
void amx_linear(const Activations& a, int64_t m, const uint8_t* w, float* y, int64_t blocks, int64_t n_dim) {
  // balanced tiles (24 rows as 12 + 12, not 16 + 16 with 8 of zeros): a row's sums are the same in any tile
  const int64_t tiles = (m + 15) / 16, rows = (m + tiles - 1) / tiles, k = blocks * kBlock;
  std::vector<int8_t> padded;  // the x tiles read whole tiles of rows: zeros past the real ones
  const int8_t* codes = a.codes;
  if (tiles * rows != m) {
    padded.assign(tiles * rows * k, 0);
    std::memcpy(padded.data(), a.codes, m * k);
    codes = padded.data();
  }
  at::parallel_for(0, n_dim / kLanes, 4, [&](int64_t p0, int64_t p1) {
    amx_panels<Q4>(a, codes, m, rows, tiles, w, y, blocks, n_dim, p0, p1);
  });
}
#endif

template <bool Q4, int Rows>
void dispatch(int64_t rows, const Activations& a, int64_t row0, const uint8_t* w, float* y, int64_t blocks,
              int64_t n_dim) {
  if constexpr (Rows > kMaxRows) {
    TORCH_CHECK(false, "quantized_linear takes at most ", kMaxRows, " rows per pass, got ", rows);
  } else if (rows == Rows) {
    at::parallel_for(0, n_dim / kLanes, 4, [&](int64_t p0, int64_t p1) {
      panels<Q4, Rows>(a, row0, w, y + row0 * n_dim, blocks, n_dim, p0, p1);
    });
  } else {
    dispatch<Q4, Rows + 1>(rows, a, row0, w, y, blocks, n_dim);
  }
}

}  // namespace

bool quantized_available() { return true; }

torch::Tensor quantized_pack(const torch::Tensor& codes, const torch::Tensor& scale, const torch::Tensor& minimum) {
  TORCH_CHECK(codes.dim() == 3 && codes.size(2) == kBlock, "quantized_pack takes codes [N, B, 32]");
  const bool q4 = codes.scalar_type() == torch::kUInt8;
  TORCH_CHECK(q4 ? minimum.numel() == scale.numel() : codes.scalar_type() == torch::kInt8 && minimum.numel() == 0,
              "quantized_pack: Q4_1 codes are uint8 with a minimum, Q8_0 codes int8 without");
  const int64_t n = codes.size(0), blocks = codes.size(1), padded = (n + kLanes - 1) / kLanes * kLanes;
  const int64_t panels = padded / kLanes;
  auto floats = [&](const torch::Tensor& t) {  // [P, B, 32 bytes] float16; rows past N: zero scales, zero outputs
    const auto wide = t.to(torch::kFloat32);
    const auto half = wide.to(torch::kHalf);
    const auto back = half.to(torch::kFloat32);  // NaN stays NaN: a draft's blocks load whatever values they hold
    TORCH_CHECK((back.eq(wide) | (back.isnan() & wide.isnan())).all().item<bool>(), "quantized_pack: scales and "
                "minimums must be float16 values, as a GGUF block stores them (gguf_blocks.quantize_q4_1 / "
                "quantize_q8_0 round them so)");
    auto out = torch::zeros({padded, blocks}, t.options().dtype(torch::kHalf));
    out.narrow(0, 0, n).copy_(half);
    auto lanes = out.view({panels, kLanes, blocks}).transpose(1, 2).contiguous();  // [P, B, 16]
    return lanes.view(torch::kUInt8);  // [P, B, 32]
  };
  auto wide = codes.to(torch::kInt16);
  if (!q4) wide = wide + 128;  // unsigned for VPDPBUSD
  auto all = torch::zeros({padded, blocks, kBlock}, wide.options());
  all.narrow(0, 0, n).copy_(wide);
  torch::Tensor bytes;
  if (q4) {  // [P, 16, B, 4 (h), 4 (j)]: low nibble k = 4h + j, high nibble k = 16 + 4h + j
    auto lo = all.narrow(2, 0, 16), hi = all.narrow(2, 16, 16);
    bytes = (lo + hi * 16).view({panels, kLanes, blocks, 4, 4});
  } else {  // [P, 16, B, 8 (g), 4 (j)]: k = 4g + j
    bytes = all.view({panels, kLanes, blocks, 8, 4});
  }
  bytes = bytes.permute({0, 2, 3, 1, 4}).contiguous().to(torch::kUInt8).view({panels, blocks, -1});  // [P, B, codes]
  std::vector<torch::Tensor> parts{bytes, floats(scale)};
  if (q4) parts.push_back(floats(minimum));
  return torch::cat(parts, 2).contiguous();  // [P, B, stride]
}

bool is_quantized(const torch::Tensor& packed) { return packed.scalar_type() == torch::kUInt8; }

int64_t quantized_amx_from_rows(int64_t rows) {
#ifdef PPDKIT_AMX_INT8
  if (rows > 0) amx_rows = rows;
  return amx_rows;
#else
  return INT64_MAX;
#endif
}

bool quantized_amx_available() {
#ifdef PPDKIT_AMX_INT8
  return amx::permitted();
#else
  return false;
#endif
}

torch::Tensor quantized_linear(const torch::Tensor& x, const torch::Tensor& packed, int64_t out_features,
                               int64_t amx_from_rows) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == torch::kFloat32, "quantized_linear takes float32 x [M, K]");
  TORCH_CHECK(packed.dim() == 3 && (packed.size(2) == kQ4Stride || packed.size(2) == kQ8Stride),
              "quantized_linear takes panels made by quantized_pack");
  const bool q4 = packed.size(2) == kQ4Stride;
  const int64_t m = x.size(0), blocks = packed.size(1), n_dim = packed.size(0) * kLanes;
  TORCH_CHECK(x.size(1) == blocks * kBlock, "quantized_linear: x [M, K] must match the weight's K = ", blocks * kBlock);
  const Activations a = quantize_rows(x.contiguous());
  auto y = torch::empty({m, n_dim}, x.options());
  const uint8_t* w = packed.data_ptr<uint8_t>();
#ifdef PPDKIT_AMX_INT8
  // the same bits as the passes below, in fewer instructions
  if (m >= (amx_from_rows < 0 ? amx_rows.load() : amx_from_rows) && amx::permitted()) {
    if (q4) {
      amx_linear<true>(a, m, w, y.data_ptr<float>(), blocks, n_dim);
    } else {
      amx_linear<false>(a, m, w, y.data_ptr<float>(), blocks, n_dim);
    }
    return n_dim == out_features ? y : y.narrow(1, 0, out_features);
  }
#endif
  const int64_t count = (m + kMaxRows - 1) / kMaxRows;  // balanced passes: 18 rows as 9 + 9
  for (int64_t pass = 0, row = 0; pass < count; ++pass) {
    const int64_t rows = (m - row) / (count - pass);
    if (q4) {
      dispatch<true, 1>(rows, a, row, w, y.data_ptr<float>(), blocks, n_dim);
    } else {
      dispatch<false, 1>(rows, a, row, w, y.data_ptr<float>(), blocks, n_dim);
    }
    row += rows;
  }
  return n_dim == out_features ? y : y.narrow(1, 0, out_features);
}

#else  // no AVX512-VNNI at build time: the 4-bit format is not offered

bool quantized_available() { return false; }
bool quantized_amx_available() { return false; }
int64_t quantized_amx_from_rows(int64_t) { return INT64_MAX; }
bool is_quantized(const torch::Tensor& packed) { return packed.scalar_type() == torch::kUInt8; }
torch::Tensor quantized_pack(const torch::Tensor&, const torch::Tensor&, const torch::Tensor&) {
  TORCH_CHECK(false, "built without AVX512-VNNI");
}
torch::Tensor quantized_linear(const torch::Tensor&, const torch::Tensor&, int64_t, int64_t) {
  TORCH_CHECK(false, "built without AVX512-VNNI");
}

#endif
