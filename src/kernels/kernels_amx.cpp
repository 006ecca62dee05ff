// AMX path (AVX-512 plus the AMX tile and int8 units of Sapphire Rapids and later; compiled with those
// flags, only called when CPUID, XCR0 and the kernel's permission all say yes: see cpu.cpp).
//
// Why AMX: one TDPBSSD multiplies a 16 x 32 int8 tile by a 32 x 16 one (8192 multiply-adds) in the
// time the VNNI kernel spends on a few hundred, so prefill stops being bound by int8 arithmetic. What
// remains per block is the float work that Q4_0 / Q8_0 / Q4_K need anyway (each 32-element block
// has its own weight and activation scale): convert, scale by d_x, FMA with d_w (and the Q4_K min).
// That work is done exactly as the VNNI kernel does it, in the same order, and the integer dot products are exact either way, so
// the two paths give bit-identical results: a token's output does not depend on whether it went
// through a tile of 16 tokens or through the VNNI tail, and batching stays invisible to greedy output.
//
// Only prompt-sized batches use the tiles (16 tokens at a time, from kMinTiledTokens on); the
// remainder and decode-sized batches (memory-bound, where AMX does not help) go to the AVX-512 kernels.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "kernels/dispatch.h"
#include "tensor/quant.h"

namespace promptly::kernels {
namespace amx {
namespace {

constexpr std::size_t kUnpackedBlock = 512;  // one block of 16 rows as a B tile: 8 rows x 64 bytes

// The tile register shapes (palette 1): tiles 0-3 hold 16 x 16 int32 results, 4-5 the activations
// (16 tokens x 32 bytes: one block each), 6-7 the weights (8 rows of 4 elements x 16 output rows).
struct alignas(64) TileConfig {
  std::uint8_t palette_id = 1;
  std::uint8_t start_row = 0;
  std::uint8_t reserved[14] = {};
  std::uint16_t colsb[16] = {};
  std::uint8_t rows[16] = {};
};
static_assert(sizeof(TileConfig) == 64);

void configure_tiles() {
  TileConfig cfg;
  for (int c = 0; c < 4; ++c) {
    cfg.rows[c] = 16;
    cfg.colsb[c] = 64;
  }
  for (int a = 4; a < 6; ++a) {
    cfg.rows[a] = 16;
    cfg.colsb[a] = 32;
  }
  for (int b = 6; b < 8; ++b) {
    cfg.rows[b] = 8;
    cfg.colsb[b] = 64;
  }
  _tile_loadconfig(&cfg);
}

enum class Format { Q4_0, Q8_0, Q4_K };

// One group of 16 rows, blocks [0, nb) of 32 elements, as signed int8 B tiles (row k of a block's
// tile holds elements 4k..4k+3 of the 16 rows, exactly the stored group order), plus per block the
// 16 rows' scales as floats and, for Q4_K, their mins. Q4_0: nibble - 8; Q8_0: stored-unsigned back
// to signed; Q4_K: the nibbles as they are (0..15; the min is subtracted in floats, as the VNNI
// kernel does), scale d * sc and min dmin * m computed with the VNNI kernel's operations. Done once
// per group and token panel and shared by every 16-token tile of the panel.
template <Format F>
void unpack_group(const std::uint8_t* group, std::size_t nb, std::int8_t* quants, float* scales, float* mins) {
  const __m512i mask = _mm512_set1_epi8(0x0f);
  if constexpr (F == Format::Q4_K) {
    for (std::size_t sb = 0; sb < nb / 8; ++sb) {
      const std::uint8_t* g = group + sb * kQ4KGroupBytes;
      const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(g)));
      const __m512 dmin = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(g + 32)));
      for (std::size_t s = 0; s < 8; ++s) {
        const std::size_t blk = sb * 8 + s;
        _mm512_storeu_ps(scales + 16 * blk, _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(
                                                                _mm_loadu_si128(reinterpret_cast<const __m128i*>(g + 64 + 32 * s))))));
        _mm512_storeu_ps(mins + 16 * blk, _mm512_mul_ps(dmin, _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(
                                                                 _mm_loadu_si128(reinterpret_cast<const __m128i*>(g + 64 + 32 * s + 16))))));
        const std::uint8_t* pair = g + 320 + 512 * (s / 2);  // low nibbles: sub-block 2p, high: 2p + 1
        for (int k = 0; k < 8; ++k) {
          const __m512i v = _mm512_loadu_si512(pair + 64 * k);
          _mm512_storeu_si512(quants + blk * kUnpackedBlock + 64 * k, _mm512_and_si512(s % 2 ? _mm512_srli_epi16(v, 4) : v, mask));
        }
      }
    }
    return;
  }
  (void)mins;
  constexpr std::size_t kGroupBlock = F == Format::Q8_0 ? kQ8_0GroupBytes : kQ4_0GroupBytes;
  const __m512i eight = _mm512_set1_epi8(8);
  const __m512i flip = _mm512_set1_epi8(static_cast<char>(0x80));
  for (std::size_t b = 0; b < nb; ++b) {
    const std::uint8_t* gb = group + b * kGroupBlock;
    std::int8_t* out = quants + b * kUnpackedBlock;
    _mm512_storeu_ps(scales + 16 * b, _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(gb))));
    if constexpr (F == Format::Q8_0) {
      for (int g = 0; g < 8; ++g) _mm512_storeu_si512(out + 64 * g, _mm512_xor_si512(_mm512_loadu_si512(gb + 32 + 64 * g), flip));
    } else {
      for (int g = 0; g < 4; ++g) {
        const __m512i v = _mm512_loadu_si512(gb + 32 + 64 * g);
        _mm512_storeu_si512(out + 64 * g, _mm512_sub_epi8(_mm512_and_si512(v, mask), eight));
        _mm512_storeu_si512(out + 64 * (4 + g), _mm512_sub_epi8(_mm512_and_si512(_mm512_srli_epi16(v, 4), mask), eight));
      }
    }
  }
}

// acc[n] += scale * (float(dot[n]) * d_x[n]) for the 16 tokens of a tile, and for Q4_K also
// acc[n] -= min * sum_x[n]: the VNNI kernels' operations in their order.
template <Format F>
inline void finish_block(const std::int32_t* dots, const float* scale_block, const float* min_block, const float* dx, const float* sums,
                         std::size_t nb, __m512* acc) {
  const __m512 scale = _mm512_loadu_ps(scale_block);
  __m512 minv = _mm512_setzero_ps();
  if constexpr (F == Format::Q4_K) minv = _mm512_loadu_ps(min_block);
#pragma GCC unroll 16
  for (std::size_t n = 0; n < kTokenTile; ++n) {
    const __m512 scaled = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_load_si512(dots + 16 * n)), _mm512_set1_ps(dx[n]));
    acc[n] = _mm512_fmadd_ps(scale, scaled, acc[n]);
    if constexpr (F == Format::Q4_K) acc[n] = _mm512_fnmadd_ps(minv, _mm512_set1_ps(sums[n * nb]), acc[n]);
  }
}

// The tile unit runs behind the vector units: a product's result can be stored only tens of cycles
// after it was issued. So the blocks are software-pipelined three deep: step b issues the product of
// block b (result tile b % 4), stores the product of block b - 2 (issued a whole step earlier) and
// does the float work of block b - 3 (stored a step earlier, so its loads hit L1); A and B tiles
// alternate so that the next block's loads need not wait for the last product to read them.
// Measured, this is no faster than storing each product at once and working two blocks behind: the
// float work bounds the kernel, and it runs slower while tile instructions are in flight (the core
// clocks down for AMX; see README, Performance). Macros because GCC's tile intrinsics paste the tile
// number into the assembly text.
#define PROMPTLY_AMX_PRODUCT(C, A, B, BLK)                               \
  do {                                                                   \
    _tile_loadd(A, tile_qs + (BLK) * kUnpackedBlock, 32);                \
    _tile_loadd(B, quants + (BLK) * kUnpackedBlock, 64);                 \
    _tile_zero(C);                                                       \
    _tile_dpbssd(C, A, B);                                               \
  } while (0)
#define PROMPTLY_AMX_STEP(C, A, B, STORED)                                                                                   \
  do {                                                                                                                       \
    const std::size_t blk = b + (C);                                                                                         \
    if (blk < nb) PROMPTLY_AMX_PRODUCT(C, A, B, blk);                                                                        \
    if (blk >= 2 && blk - 2 < nb) _tile_stored(STORED, dots[STORED], 64);                                                   \
    if (blk >= 3 && blk - 3 < nb) {                                                                                          \
      const std::size_t done = blk - 3;                                                                                      \
      finish_block<F>(dots[(C + 1) % 4], scales + 16 * done, mins + 16 * done, tile_dx + 16 * done, sums + done, nb, acc); \
    }                                                                                                                        \
  } while (0)

// 16 rows x 16 tokens over all nb blocks. The tile's activations are tile-ready: per block, the 16
// tokens' 32 quants back to back (tile_qs) and their 16 scales (tile_dx); sums (Q4_K only) is the
// tile's first token's d * sum(q) per block, tokens nb apart.
template <Format F>
void tile_16x16(const std::int8_t* quants, const float* scales, const float* mins, std::size_t nb, const std::int8_t* tile_qs,
                const float* tile_dx, const float* sums, float* y, std::size_t ldy) {
  // Every loop over acc is unrolled: one indexed at run time keeps the array in memory, and each
  // block's 16 FMAs become load-FMA-store through the stack (64 extra stores per block).
  __m512 acc[kTokenTile];
#pragma GCC unroll 16
  for (std::size_t n = 0; n < kTokenTile; ++n) acc[n] = _mm512_setzero_ps();
  alignas(64) std::int32_t dots[4][256];
  for (std::size_t b = 0; b < nb + 3; b += 4) {
    PROMPTLY_AMX_STEP(0, 4, 6, 2);
    PROMPTLY_AMX_STEP(1, 5, 7, 3);
    PROMPTLY_AMX_STEP(2, 4, 6, 0);
    PROMPTLY_AMX_STEP(3, 5, 7, 1);
  }
#pragma GCC unroll 16
  for (std::size_t n = 0; n < kTokenTile; ++n) _mm512_storeu_ps(y + n * ldy, acc[n]);
}
#undef PROMPTLY_AMX_PRODUCT
#undef PROMPTLY_AMX_STEP

// The same QuantizedRows seen from token t on.
QuantizedRows from_token(const QuantizedRows& x, std::size_t t) {
  return {x.blocks + t * x.n_blocks, x.sums + t * x.n_blocks, x.n_blocks, x.half_sums + 2 * t * x.n_blocks, x.act + t,
          x.act_stride, nullptr, nullptr};
}

template <Format F>
void gemm_x16(const std::uint8_t* w, std::size_t cols, std::size_t r0, std::size_t r1, const QuantizedRows& x, std::size_t n_tokens,
              float* y, std::size_t ldy) {
  const KernelTable& avx512 = avx512_kernels();
  const auto vnni = F == Format::Q4_0 ? avx512.gemm_q4_0_x16 : F == Format::Q8_0 ? avx512.gemm_q8_0_x16 : avx512.gemm_q4_k_x16;
  const std::size_t tiled = x.tiled_qs ? n_tokens / kTokenTile * kTokenTile : 0;
  if (tiled == 0) {
    vnni(w, cols, r0, r1, x, n_tokens, y, ldy);
    return;
  }
  const std::size_t nb = cols / 32;
  const std::size_t group_bytes = F == Format::Q4_K ? nb / 8 * kQ4KGroupBytes : nb * (F == Format::Q8_0 ? kQ8_0GroupBytes : kQ4_0GroupBytes);
  // Tokens go in panels whose activations (36 bytes per block) stay in L2 (~1 MiB of its 2) while
  // every group of the share passes over them; each group is unpacked once per panel.
  const std::size_t panel = std::max(kTokenTile, (std::size_t{1} << 20) / (nb * 36) / kTokenTile * kTokenTile);
  // One group unpacked (per thread, kept across calls so that no call allocates).
  thread_local std::vector<std::int8_t> quants;
  thread_local std::vector<float> scales, mins;
  if (quants.size() < nb * kUnpackedBlock) {
    quants.resize(nb * kUnpackedBlock);
    scales.resize(nb * 16);
    mins.resize(nb * 16);
  }
  std::int8_t* q = quants.data();
  float* s = scales.data();
  float* m = mins.data();
  const QuantizedRows tail = from_token(x, tiled);
  configure_tiles();
  for (std::size_t p0 = 0; p0 < tiled; p0 += panel) {
    const std::size_t p1 = std::min(tiled, p0 + panel);
    for (std::size_t r = r0; r < r1; r += 16) {
      unpack_group<F>(w + (r / 16) * group_bytes, nb, q, s, m);
      for (std::size_t t = p0; t < p1; t += kTokenTile) {
        const std::size_t tile = t / kTokenTile;
        tile_16x16<F>(q, s, m, nb, x.tiled_qs + tile * nb * kUnpackedBlock, x.tiled_dx + tile * nb * kTokenTile, x.sums + t * nb,
                      y + t * ldy + r, ldy);
      }
      // The tokens short of a whole tile go through the VNNI kernel while this group's weights are
      // still in cache: after all groups they would be streamed from memory a second time.
      if (p1 == tiled && tiled < n_tokens) vnni(w, cols, r, r + 16, tail, n_tokens - tiled, y + tiled * ldy, ldy);
    }
  }
  _tile_release();
}

}  // namespace
}  // namespace amx

const KernelTable& amx_kernels() {
  static const KernelTable table = [] {
    KernelTable t = avx512_kernels();
    t.name = "amx";
    t.token_tile = true;
    t.x16_reads_activation_blocks_only = false;  // the tiles read the block sums too
    t.gemm_q4_0_x16 = amx::gemm_x16<amx::Format::Q4_0>;
    t.gemm_q8_0_x16 = amx::gemm_x16<amx::Format::Q8_0>;
    t.gemm_q4_k_x16 = amx::gemm_x16<amx::Format::Q4_K>;
    return t;
  }();
  return table;
}

}  // namespace promptly::kernels
