// AVX-512 path (F, BW, VL, VNNI; compiled with those flags, only called when CPUID has them). The
// int8 dot product is one VNNI instruction on 256-bit registers, and the extra registers of AVX-512
// hold a whole 4 x 4 tile of accumulators.
// GCC 12's AVX-512 intrinsics initialise their "undefined" vectors from themselves, which its own
// -Wuninitialized then reports at every use; the warning is about the header, not this code.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>

#include <cstring>
#include <algorithm>
#include <array>
#include <cmath>
#include <type_traits>
#include <utility>
#include <vector>

#include "kernels/dispatch.h"
#include "util/fp16.h"
#include "tensor/quant-inl.h"
#include "tensor/quant.h"

namespace promptly::kernels {
namespace avx512 {
namespace {

struct Isa {
  static __m256i dot_u8_s8(__m256i u, __m256i s) { return _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, s); }
  // Q8_0 x Q8_0 with VNNI (u8 x s8): x + 128 is unsigned, and the extra 128 * sum(w) is removed by
  // starting the accumulator at -128 * sum(w), computed once per weight block and reused per token.
  struct Q8Weights {
    __m256i w;
    __m256i bias;
  };
  static Q8Weights prepare_q8_weights(__m256i w) {
    const __m256i sum128 = _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_set1_epi8(static_cast<char>(0x80)), w);
    return {w, _mm256_sub_epi32(_mm256_setzero_si256(), sum128)};
  }
  static __m256i prepare_q8_activations(__m256i x) { return _mm256_xor_si256(x, _mm256_set1_epi8(static_cast<char>(0x80))); }
  static __m256i dot_q8(const Q8Weights& w, __m256i xu) { return _mm256_dpbusd_epi32(w.bias, xu, w.w); }
  static float dot_f32(const float* a, const float* b, std::size_t n);
};

#include "kernels/gemm-inl.h"

float Isa::dot_f32(const float* a, const float* b, std::size_t n) {
  __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
  std::size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    acc0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), acc0);
    acc1 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 16), _mm512_loadu_ps(b + i + 16), acc1);
  }
  acc0 = _mm512_add_ps(acc0, acc1);
  for (; i + 16 <= n; i += 16) acc0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), acc0);
  __m256 half = _mm256_add_ps(_mm512_castps512_ps256(acc0), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(acc0), 1)));
  if (i + 8 <= n) {
    half = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), half);
    i += 8;
  }
  float s = hsum(half);
  for (; i < n; ++i) s += a[i] * b[i];
  return s;
}

// F16 weights (read in place from the file) against float activations on 512-bit vectors: R rows x
// C tokens, 16 elements per step, the last k % 16 through masked loads. Why not the shared 256-bit
// tile (gemm-inl.h): F16 prefill is FMA-bound, and half-width vectors halve the peak (125m F16,
// `bench model -p 128`, four alternations: 897 -> 1156 t/s; decode +3%). Masked loads only for the
// tail: with them in every step the streaming GEMV lost ~20%. Each (row, token) sum takes the same
// operations in the same order whatever R and C, so a token's result does not depend on its batch.
// Interleaved4: the F16x4 layout (see repack_x16; R = 4, k a multiple of 16), one group at row r,
// read as one sequential stream with the same arithmetic, so the same sums bit for bit.
// W = BF16 (and BF16x4) takes the same tiles: a BF16 widens to its float exactly (a shift), so its
// sums are those of the dequantized row in the same order.
template <DType W>
inline __m512 widen_half16(__m256i h) {
  if constexpr (W == DType::BF16) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  } else {
    return _mm512_cvtph_ps(h);
  }
}
template <DType W, int R, int C, bool Interleaved4 = false>
void tile_half(const std::uint8_t* w, std::size_t w_stride, std::size_t r, const float* x, std::size_t k, std::size_t t, float* y,
              std::size_t ldy) {
  static_assert(!Interleaved4 || R == 4);
  __m512 acc[R][C];
  for (int i = 0; i < R; ++i)
    for (int j = 0; j < C; ++j) acc[i][j] = _mm512_setzero_ps();
  // Element e of row i is at wr[i] + e, or interleaved at wr[i] + 4e (e a multiple of 16).
  constexpr std::size_t kElementStride = Interleaved4 ? 4 : 1;
  const std::uint16_t* wr[R];
  for (int i = 0; i < R; ++i) {
    wr[i] = reinterpret_cast<const std::uint16_t*>(w + r * w_stride) + (Interleaved4 ? 16 * i : i * w_stride / 2);
  }
  std::size_t e = 0;
  for (; e + 16 <= k; e += 16) {
    if constexpr (Interleaved4) {
      // The stream is sequential, but with several tokens the activations crowd L1 and the hardware
      // prefetchers fill L2 only: 4 tokens over 2048 columns (BM_MatmulStreaming, 2 threads)
      // streamed 17-21 GB/s without this and 33-37 with it (2 KiB ahead: 28-33; 16 KiB: 29-32).
      constexpr std::size_t kPrefetchBytesAhead = 4096;
      const char* step = reinterpret_cast<const char*>(wr[0] + 4 * e);
      _mm_prefetch(step + kPrefetchBytesAhead, _MM_HINT_T0);
      _mm_prefetch(step + kPrefetchBytesAhead + 64, _MM_HINT_T0);
    } else {
      prefetch_next_rows<R, 32>(w + r * w_stride, w_stride, e / 16);
    }
    __m512 wv[R];
    for (int i = 0; i < R; ++i) {
      wv[i] = widen_half16<W>(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(wr[i] + kElementStride * e)));
    }
    for (int j = 0; j < C; ++j) {
      const __m512 xv = _mm512_loadu_ps(x + (t + j) * k + e);
      for (int i = 0; i < R; ++i) acc[i][j] = _mm512_fmadd_ps(wv[i], xv, acc[i][j]);
    }
  }
  if (!Interleaved4 && e < k) {
    const __mmask16 m = static_cast<__mmask16>((1u << (k - e)) - 1);
    __m512 wv[R];
    for (int i = 0; i < R; ++i) wv[i] = widen_half16<W>(_mm256_maskz_loadu_epi16(m, wr[i] + e));
    for (int j = 0; j < C; ++j) {
      const __m512 xv = _mm512_maskz_loadu_ps(m, x + (t + j) * k + e);
      for (int i = 0; i < R; ++i) acc[i][j] = _mm512_fmadd_ps(wv[i], xv, acc[i][j]);
    }
  }
  for (int j = 0; j < C; ++j) {
    for (int i = 0; i < R; ++i) y[(t + j) * ldy + r + i] = _mm512_reduce_add_ps(acc[i][j]);
  }
}
template <DType W>
struct HalfTile512 {
  template <int R, int C>
  struct Of {
    static void run(std::size_t r, std::size_t t, const std::uint8_t* w, std::size_t w_stride, const float* x, std::size_t k, float* y,
                    std::size_t ldy) {
      tile_half<W, R, C>(w, w_stride, r, x, k, t, y, ldy);
    }
  };
};
template <DType W>
void gemm_half_512(const std::uint8_t* w, std::size_t w_stride, std::size_t r0, std::size_t r1, const float* x, std::size_t k,
                   std::size_t n_tokens, float* y, std::size_t ldy) {
  tiled<HalfTile512<W>::template Of>(r0, r1, n_tokens, w, w_stride, x, k, y, ldy);
}

// The F16x4 / BF16x4 layouts.
template <DType W>
void gemm_half_x4(const std::uint8_t* w, std::size_t cols, std::size_t r0, std::size_t r1, const float* x, std::size_t n_tokens, float* y,
                  std::size_t ldy) {
  // Up to 6 tokens a pass over a group (24 sums + 4 weight vectors + 1 activation: 29 of the 32
  // registers), the batch split evenly: 5 guesses of n-gram lookup verified in one pass rather than
  // 4 + 1 (code target, the target's pass 1.50-1.63 -> 1.41-1.46 ms; prefill unchanged, 64 tokens
  // 287-294 -> 302-303 GFLOP/s).
  constexpr std::size_t kMaxTokens = 6;
  const std::size_t stride = 2 * cols;
  for (std::size_t r = r0; r < r1; r += 4) {
    for (std::size_t t = 0; t < n_tokens;) {
      const std::size_t left = n_tokens - t, passes = (left + kMaxTokens - 1) / kMaxTokens, c = (left + passes - 1) / passes;
      switch (c) {
        case 6: tile_half<W, 4, 6, true>(w, stride, r, x, cols, t, y, ldy); break;
        case 5: tile_half<W, 4, 5, true>(w, stride, r, x, cols, t, y, ldy); break;
        case 4: tile_half<W, 4, 4, true>(w, stride, r, x, cols, t, y, ldy); break;
        case 3: tile_half<W, 4, 3, true>(w, stride, r, x, cols, t, y, ldy); break;
        case 2: tile_half<W, 4, 2, true>(w, stride, r, x, cols, t, y, ldy); break;
        default: tile_half<W, 4, 1, true>(w, stride, r, x, cols, t, y, ldy); break;
      }
      t += c;
    }
  }
}

// acc += w (unsigned bytes) times the 4 signed bytes at p repeated in every lane: one VNNI
// instruction whose second operand is an embedded broadcast from memory. GCC 12 turns
// _mm512_set1_epi32 of a loaded value into a separate broadcast load instead, and this core issues
// those at fewer per cycle than the dot products (an L1-resident Q8_0x16 tile of 12 tokens: 20-25%
// slower that way); hence the asm. The pointer must be a base plus a constant offset for the
// instruction to stay one fused uop, which is what the block-major activations give (see
// QuantizedRows::act).
inline __m512i dpbusd_broadcast(__m512i acc, __m512i w, const std::int8_t* p) {
  asm("vpdpbusd %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(w), "m"(*reinterpret_cast<const std::int8_t(*)[4]>(p)));
  return acc;
}

// G adjacent 16-row groups (16G rows) x C tokens of the Q4_0x16 layout: per block and group, 8 VNNI
// instructions per token cover all 16 rows (lane = row); the -8 offset of Q4_0 enters through the
// activation block sums.
// The instructions go weight vector by weight vector, each against every token in turn, so that
// consecutive ones feed different accumulators: a token's 8 in a row would form a dependency chain
// whose latency (5 cycles each) fills the scheduler before the ports are busy (measured on L1-resident
// data: 12.7 cycles per token and block that way, 8.5 this way). With few tokens each token gets A
// accumulators so that there are still enough independent chains.
// G = 2 for batches. Why: on AMD Zen 5 one group's tile is bound by loads, not by its dot products:
// each VNNI instruction's broadcast activation operand is a load, and with the offsets, d_x and
// weights a block of 8 tokens issues ~100 loads for 64 dot products at two per cycle (an
// L1-resident probe: 3.6-4.0 TSC cycles per token and block against 2.3 for the bare products;
// taking out any 8 of those loads saved 0.3). With two groups each token's 4 activation bytes are
// broadcast into a register once and feed both, which halves the loads per product: 3.0-3.25 at 8
// tokens. A lone token streams its weights from memory, where loads do not limit and one stream is
// what the prefetching was tuned for, so G = 1 keeps the broadcast inside each instruction. Either
// way each output takes the same operations (integer sums, exact in any order; then the same
// convert, multiply and FMA), so results do not depend on G, and batch equivalence does not depend
// on which tile a row lands in.
// Q8 = true: the Q8_0x16 layout (8 groups of stored-unsigned quants, offset 128); false: Q4_0x16
// (4 groups of packed nibbles, offset 8).
template <bool Q8, int G, int C>
void tile_groups(const std::uint8_t* group, std::size_t group_stride, std::size_t nb, const QuantizedRows& x, std::size_t t,
                 float* y, std::size_t ldy) {
  constexpr std::size_t kGroupBlock = Q8 ? kQ8_0GroupBytes : kQ4_0GroupBytes;
  constexpr int A = G * C >= 8 ? 1 : G * C >= 4 ? 2 : 4;
  __m512 acc[G][C];
#pragma GCC unroll 16
  for (int j = 0; j < C; ++j) {
#pragma GCC unroll 2
    for (int h = 0; h < G; ++h) acc[h][j] = _mm512_setzero_ps();
  }
  const __m512i mask = _mm512_set1_epi8(0x0f);
  const ActivationBlock* xb = x.act + t;  // block b's C tokens, side by side
  for (std::size_t b = 0; b < nb; ++b, xb += x.act_stride) {
    const std::uint8_t* gb[G];
#pragma GCC unroll 2
    for (int h = 0; h < G; ++h) {
      gb[h] = group + h * group_stride + b * kGroupBlock;
      // The first tile over a group streams its weights from DRAM, and the hardware prefetcher alone
      // leaves it waiting (measured: 8 tokens read 4.3 GB/s per thread without this, see
      // BM_MatmulStreaming), so ask for them a few blocks ahead along the group's contiguous stream.
      // Later tiles find the lines cached and the hints cost a load slot each.
      for (std::size_t line = 0; line < kGroupBlock; line += 64) {
        _mm_prefetch(reinterpret_cast<const char*>(gb[h]) + 8 * kGroupBlock + line, _MM_HINT_T0);
      }
    }
    // A prompt tile's activations come from L2, each block's C tokens a stride apart from the last
    // block's: not a stream the hardware prefetchers follow, so fetch two blocks ahead.
    if (C >= 4 && b + 2 < nb) {
      const char* next = reinterpret_cast<const char*>(xb + 2 * x.act_stride);
      for (std::size_t line = 0; line < C * sizeof(ActivationBlock); line += 64) _mm_prefetch(next + line, _MM_HINT_T0);
    }
    __m512 dw[G];
#pragma GCC unroll 2
    for (int h = 0; h < G; ++h) dw[h] = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(gb[h])));
    // The stored-unsigned offset leaves exactly in integers: each token's first chain starts at
    // -offset * sum(x) (a broadcast load, no arithmetic).
    __m512i dot[G][C][A];
#pragma GCC unroll 16
    for (int j = 0; j < C; ++j) {
      dot[0][j][0] = _mm512_set1_epi32(Q8 ? xb[j].offset_q8 : xb[j].offset_q4);
#pragma GCC unroll 2
      for (int h = 1; h < G; ++h) dot[h][j][0] = dot[0][j][0];
#pragma GCC unroll 2
      for (int h = 0; h < G; ++h) {
        for (int a = 1; a < A; ++a) dot[h][j][a] = _mm512_setzero_si512();
      }
    }
    // Weight vector k of each group: elements 4k..4k+3 of its 16 rows, unsigned.
    const auto multiply = [&](int k, const __m512i (&q)[G]) __attribute__((always_inline)) {
#pragma GCC unroll 16
      for (int j = 0; j < C; ++j) {
        if constexpr (G == 1) {
          dot[0][j][k % A] = dpbusd_broadcast(dot[0][j][k % A], q[0], xb[j].qs + 4 * k);
        } else {
          // One broadcast load (asm: GCC would fold it back into each instruction, one load per group).
          __m512i xk;
          asm("vpbroadcastd %1, %0" : "=v"(xk) : "m"(*reinterpret_cast<const std::int32_t(*)[1]>(xb[j].qs + 4 * k)));
#pragma GCC unroll 2
          for (int h = 0; h < G; ++h) dot[h][j][k % A] = _mm512_dpbusd_epi32(dot[h][j][k % A], q[h], xk);
        }
      }
    };
#pragma GCC unroll 8
    for (int g = 0; g < (Q8 ? 8 : 4); ++g) {
      __m512i v[G];
#pragma GCC unroll 2
      for (int h = 0; h < G; ++h) v[h] = _mm512_loadu_si512(gb[h] + 32 + 64 * g);
      if constexpr (Q8) {
        multiply(g, v);
      } else {  // low nibbles hold elements 4g.., high nibbles 16+4g..
        __m512i q[G];
#pragma GCC unroll 2
        for (int h = 0; h < G; ++h) q[h] = _mm512_and_si512(v[h], mask);
        multiply(g, q);
#pragma GCC unroll 2
        for (int h = 0; h < G; ++h) q[h] = _mm512_and_si512(_mm512_srli_epi16(v[h], 4), mask);
        multiply(4 + g, q);
      }
    }
    // One convert, one multiply by d_x and one FMA with d_w: the fewest float operations per block.
#pragma GCC unroll 16
    for (int j = 0; j < C; ++j) {
      const __m512 dx = _mm512_set1_ps(xb[j].d);
#pragma GCC unroll 2
      for (int h = 0; h < G; ++h) {
        for (int a = 1; a < A; ++a) dot[h][j][0] = _mm512_add_epi32(dot[h][j][0], dot[h][j][a]);
        acc[h][j] = _mm512_fmadd_ps(dw[h], _mm512_mul_ps(_mm512_cvtepi32_ps(dot[h][j][0]), dx), acc[h][j]);
      }
    }
  }
#pragma GCC unroll 16
  for (int j = 0; j < C; ++j) {
#pragma GCC unroll 2
    for (int h = 0; h < G; ++h) _mm512_storeu_ps(y + (t + j) * ldy + 16 * h, acc[h][j]);
  }
}

// Q4_Kx16: 16 rows x C tokens. Per 32-element sub-block: 8 VNNI instructions per token, then the
// sub-block's scale (d * sc) and min (dmin * m, against the activation block's sum). Issued weight
// vector by weight vector across the tokens, as in tile_groups and for the same reason.
// Q5 (the Q5_Kx16 layout): each weight vector's fifth bits come as a 64-bit mask (one load), added
// as 16 to the bytes they mark (one masked add): levels 0..31, still unsigned bytes for VNNI.
template <bool Q5, int C>
void tile_k_x16(const std::uint8_t* group, std::size_t nsb, const QuantizedRows& x, std::size_t t, float* y, std::size_t ldy) {
  constexpr std::size_t kGroupBytes = Q5 ? kQ5KGroupBytes : kQ4KGroupBytes;
  constexpr int A = C >= 8 ? 1 : C >= 4 ? 2 : 4;
  __m512 acc[C];
#pragma GCC unroll 16
  for (int j = 0; j < C; ++j) acc[j] = _mm512_setzero_ps();
  const __m512i mask = _mm512_set1_epi8(0x0f);
  [[maybe_unused]] const __m512i sixteen = _mm512_set1_epi8(16);
  for (std::size_t sb = 0; sb < nsb; ++sb) {
    const std::uint8_t* g = group + sb * kGroupBytes;
    const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(g)));
    const __m512 dmin = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(g + 32)));
    for (int s = 0; s < 8; ++s) {
      const std::uint8_t* quants = g + 320 + 512 * (s / 2);  // low nibbles: sub-block 2p, high: 2p + 1
      if constexpr (C <= 2) {  // few tokens wait on memory: fetch the next super-block's quants ahead
        if (s % 2 == 0) {
          for (int l = 0; l < 8; ++l) _mm_prefetch(reinterpret_cast<const char*>(quants) + kGroupBytes + 64 * l, _MM_HINT_T0);
          if (Q5 && s == 0) {
            for (int l = 0; l < 8; ++l) _mm_prefetch(reinterpret_cast<const char*>(g) + kGroupBytes + kQ4KGroupBytes + 64 * l, _MM_HINT_T0);
          }
        }
      }
      const ActivationBlock* xb = x.act + (sb * 8 + static_cast<std::size_t>(s)) * x.act_stride + t;
      __m512i dot[C][A];
#pragma GCC unroll 16
      for (int j = 0; j < C; ++j) {
        for (int a = 0; a < A; ++a) dot[j][a] = _mm512_setzero_si512();
      }
#pragma GCC unroll 8
      for (int k = 0; k < 8; ++k) {
        const __m512i v = _mm512_loadu_si512(quants + 64 * k);
        __m512i q = _mm512_and_si512(s % 2 ? _mm512_srli_epi16(v, 4) : v, mask);
        if constexpr (Q5) {
          std::uint64_t high;
          std::memcpy(&high, g + kQ4KGroupBytes + 64 * s + 8 * k, sizeof high);
          q = _mm512_mask_add_epi8(q, _cvtu64_mask64(high), q, sixteen);
        }
#pragma GCC unroll 16
        for (int j = 0; j < C; ++j) dot[j][k % A] = dpbusd_broadcast(dot[j][k % A], q, xb[j].qs + 4 * k);
      }
      const __m512 scale = _mm512_mul_ps(
          d, _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(g + 64 + 32 * s)))));
      const __m512 minv = _mm512_mul_ps(
          dmin, _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(g + 64 + 32 * s + 16)))));
#pragma GCC unroll 16
      for (int j = 0; j < C; ++j) {
        for (int a = 1; a < A; ++a) dot[j][0] = _mm512_add_epi32(dot[j][0], dot[j][a]);
        const __m512 prod = _mm512_mul_ps(_mm512_set1_ps(xb[j].d), _mm512_cvtepi32_ps(dot[j][0]));
        acc[j] = _mm512_fmadd_ps(scale, prod, acc[j]);
        acc[j] = _mm512_fnmadd_ps(minv, _mm512_set1_ps(xb[j].sum), acc[j]);
      }
    }
  }
#pragma GCC unroll 16
  for (int j = 0; j < C; ++j) _mm512_storeu_ps(y + (t + j) * ldy, acc[j]);
}


// IQ4_XSx16: 16 rows x C tokens. Per 32-element sub-block: each weight vector's nibbles become their
// levels + 128 through one in-register table lookup (vpshufb: unsigned bytes, as VNNI wants one
// operand), 8 VNNI instructions per token from a chain started at the activation block's
// -128 * sum (which undoes the +128), then the sub-block scale (d * sc). Q4_Kx16's arrangement
// otherwise, and its order of issue.
alignas(16) constexpr std::uint8_t kIQ4LevelsPlus128[16] = {
    1, 24, 45, 63, 79, 93, 106, 118, 129, 141, 153, 166, 181, 197, 217, 241};
static_assert([] {
  for (int i = 0; i < 16; ++i) {
    if (kIQ4LevelsPlus128[i] != kIQ4Levels[i] + 128) return false;
  }
  return true;
}());

template <int C>
void tile_iq4_xs_x16(const std::uint8_t* group, std::size_t nsb, const QuantizedRows& x, std::size_t t, float* y, std::size_t ldy) {
  constexpr int A = C >= 8 ? 1 : C >= 4 ? 2 : 4;
  __m512 acc[C];
#pragma GCC unroll 16
  for (int j = 0; j < C; ++j) acc[j] = _mm512_setzero_ps();
  const __m512i mask = _mm512_set1_epi8(0x0f);
  const __m512i levels = _mm512_broadcast_i32x4(_mm_load_si128(reinterpret_cast<const __m128i*>(kIQ4LevelsPlus128)));
  for (std::size_t sb = 0; sb < nsb; ++sb) {
    const std::uint8_t* g = group + sb * kIQ4XSGroupBytes;
    const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(g)));
    for (int s = 0; s < 8; ++s) {
      const std::uint8_t* quants = g + 160 + 512 * (s / 2);  // low nibbles: sub-block 2p, high: 2p + 1
      if constexpr (C <= 2) {  // few tokens wait on memory: fetch the next super-block's quants ahead
        if (s % 2 == 0) {
          for (int l = 0; l < 8; ++l) _mm_prefetch(reinterpret_cast<const char*>(quants) + kIQ4XSGroupBytes + 64 * l, _MM_HINT_T0);
        }
      }
      const ActivationBlock* xb = x.act + (sb * 8 + static_cast<std::size_t>(s)) * x.act_stride + t;
      __m512i dot[C][A];
#pragma GCC unroll 16
      for (int j = 0; j < C; ++j) {
        dot[j][0] = _mm512_set1_epi32(xb[j].offset_q8);
        for (int a = 1; a < A; ++a) dot[j][a] = _mm512_setzero_si512();
      }
#pragma GCC unroll 8
      for (int k = 0; k < 8; ++k) {
        const __m512i v = _mm512_loadu_si512(quants + 64 * k);
        const __m512i q = _mm512_shuffle_epi8(levels, _mm512_and_si512(s % 2 ? _mm512_srli_epi16(v, 4) : v, mask));
#pragma GCC unroll 16
        for (int j = 0; j < C; ++j) dot[j][k % A] = dpbusd_broadcast(dot[j][k % A], q, xb[j].qs + 4 * k);
      }
      const __m512 scale =
          _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(g + 32 + 16 * s)))));
#pragma GCC unroll 16
      for (int j = 0; j < C; ++j) {
        for (int a = 1; a < A; ++a) dot[j][0] = _mm512_add_epi32(dot[j][0], dot[j][a]);
        acc[j] = _mm512_fmadd_ps(scale, _mm512_mul_ps(_mm512_set1_ps(xb[j].d), _mm512_cvtepi32_ps(dot[j][0])), acc[j]);
      }
    }
  }
#pragma GCC unroll 16
  for (int j = 0; j < C; ++j) _mm512_storeu_ps(y + (t + j) * ldy, acc[j]);
}

// The 16-element sub-block layouts, 16 rows x C tokens: per sub-block, 4 VNNI instructions per
// token on its four weight vectors (unsigned levels, stored + kOffset), the offset through the
// activation half-block sums, then the sub-block scale (d * sc). Issued weight vector by weight
// vector across the tokens, as in tile_groups. Sub16 gives the layout's bytes, the prefetch of the
// next super-block, and sub-block s's weight vector k.
// Q6_Kx16: the levels are bytes (0..63), one load each.
struct Q6Sub16 {
  static constexpr std::size_t kGroupBytes = kQ6KGroupBytes;
  static constexpr float kOffset = 32.0f;
  static void prefetch(const std::uint8_t* g, int s) {
    for (int l = 0; l < 4; ++l) _mm_prefetch(reinterpret_cast<const char*>(g) + kGroupBytes + 288 + 64 * (4 * s + l), _MM_HINT_T0);
  }
  const std::uint8_t* v;
  Q6Sub16(const std::uint8_t* g, int s) : v(g + 288 + 256 * s) {}
  __m512i vector(int k) const { return _mm512_loadu_si512(v + 64 * k); }
};
// Q3_Kx16: one 64-byte load holds the four vectors' low 2 bits (a shift and a mask each), and four
// 64-bit masks their third bits (added as 4 by one masked byte add): levels 0..7.
struct Q3Sub16 {
  static constexpr std::size_t kGroupBytes = kQ3KGroupBytes;
  static constexpr float kOffset = 4.0f;
  static void prefetch(const std::uint8_t* g, int s) {
    _mm_prefetch(reinterpret_cast<const char*>(g) + kGroupBytes + 288 + 64 * s, _MM_HINT_T0);
    if (s % 2 == 0) _mm_prefetch(reinterpret_cast<const char*>(g) + kGroupBytes + 1312 + 32 * s, _MM_HINT_T0);
  }
  __m512i low;
  const std::uint8_t* third;
  Q3Sub16(const std::uint8_t* g, int s) : low(_mm512_loadu_si512(g + 288 + 64 * s)), third(g + 1312 + 32 * s) {}
  __m512i vector(int k) const {
    std::uint64_t bits;
    std::memcpy(&bits, third + 8 * k, sizeof bits);
    const __m512i q = _mm512_and_si512(_mm512_srli_epi16(low, 2 * k), _mm512_set1_epi8(3));
    return _mm512_mask_add_epi8(q, _cvtu64_mask64(bits), q, _mm512_set1_epi8(4));
  }
};

template <typename Sub16, int C>
void tile_sub16_x16(const std::uint8_t* group, std::size_t nsb, const QuantizedRows& x, std::size_t t, float* y, std::size_t ldy) {
  constexpr int A = C >= 8 ? 1 : C >= 4 ? 2 : 4;
  __m512 acc[C];
#pragma GCC unroll 16
  for (int j = 0; j < C; ++j) acc[j] = _mm512_setzero_ps();
  const float* half_sums[C];
  for (int j = 0; j < C; ++j) half_sums[j] = x.half_sums + 2 * (t + j) * x.n_blocks;
  for (std::size_t sb = 0; sb < nsb; ++sb) {
    const std::uint8_t* g = group + sb * Sub16::kGroupBytes;
    const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(g)));
    for (int s = 0; s < 16; ++s) {
      if constexpr (C <= 2) Sub16::prefetch(g, s);  // few tokens wait on memory: fetch the next super-block ahead
      const std::size_t k_block = sb * 8 + static_cast<std::size_t>(s / 2);
      const ActivationBlock* xb = x.act + k_block * x.act_stride + t;
      const int half = s % 2;
      __m512i dot[C][A];
#pragma GCC unroll 16
      for (int j = 0; j < C; ++j) {
        for (int a = 0; a < A; ++a) dot[j][a] = _mm512_setzero_si512();
      }
      const Sub16 sub(g, s);
#pragma GCC unroll 4
      for (int k = 0; k < 4; ++k) {
        const __m512i q = sub.vector(k);
#pragma GCC unroll 16
        for (int j = 0; j < C; ++j) dot[j][k % A] = dpbusd_broadcast(dot[j][k % A], q, xb[j].qs + 16 * half + 4 * k);
      }
      const __m512 scale =
          _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(g + 32 + 16 * s)))));
#pragma GCC unroll 16
      for (int j = 0; j < C; ++j) {
        for (int a = 1; a < A; ++a) dot[j][0] = _mm512_add_epi32(dot[j][0], dot[j][a]);
        // d_x * dot - offset * d_x * sum(x half)
        const __m512 corrected = _mm512_fmsub_ps(_mm512_set1_ps(xb[j].d), _mm512_cvtepi32_ps(dot[j][0]),
                                                 _mm512_set1_ps(Sub16::kOffset * half_sums[j][2 * k_block + half]));
        acc[j] = _mm512_fmadd_ps(scale, corrected, acc[j]);
      }
    }
  }
#pragma GCC unroll 16
  for (int j = 0; j < C; ++j) _mm512_storeu_ps(y + (t + j) * ldy, acc[j]);
}

// Near-equal token tiles: the fewest of at most kMax tokens (9 tokens: one tile of 9, 14: 7 + 7)
// rather than full tiles plus a remainder: a tile of 1-3 tokens pays the group's unpacking and its
// latency for little work (13% of a mixed decode/prefill step's time went to such remainders).
struct TokenTiles {
  std::size_t count, base, larger;  // tiles; tokens per tile; how many of the first tiles get one more
  TokenTiles(std::size_t tokens, std::size_t max_per_tile)
      : count((tokens + max_per_tile - 1) / max_per_tile), base(tokens / count), larger(tokens % count) {}
  std::size_t size(std::size_t i) const { return base + (i < larger); }
};

// No two-group tile (the K-quants, IQ4_XS).
template <int C>
struct NoPairTile {
  static void run(const std::uint8_t*, std::size_t, std::size_t, const QuantizedRows&, std::size_t, float*, std::size_t) {}
};

// Runs Tile<C>(group, n_super, x, t, y + r, ldy) over 16-row groups [r0, r1) and all tokens, C <= kMax;
// with kMaxPair > 0 and more than one token, pairs of groups go to PairTile<C> (C <= kMaxPair) instead.
template <std::size_t kGroupBytesPer, std::size_t kElemsPer, int kMax, template <int> class Tile, int kMaxPair = 0,
          template <int> class PairTile = NoPairTile>
void x16_driver(const std::uint8_t* w, std::size_t cols, std::size_t r0, std::size_t r1, const QuantizedRows& x,
                std::size_t n_tokens, float* y, std::size_t ldy) {
  using TileFn = void (*)(const std::uint8_t*, std::size_t, const QuantizedRows&, std::size_t, float*, std::size_t);
  using PairFn = void (*)(const std::uint8_t*, std::size_t, std::size_t, const QuantizedRows&, std::size_t, float*, std::size_t);
  static constexpr auto kTiles = []<int... I>(std::integer_sequence<int, I...>) {
    return std::array<TileFn, sizeof...(I)>{&Tile<I + 1>::run...};
  }(std::make_integer_sequence<int, kMax>{});
  static constexpr auto kPairs = []<int... I>(std::integer_sequence<int, I...>) {
    return std::array<PairFn, sizeof...(I)>{&PairTile<I + 1>::run...};
  }(std::make_integer_sequence<int, std::max(kMaxPair, 1)>{});
  const std::size_t n = cols / kElemsPer;  // blocks (or super-blocks) per row
  const std::size_t group_stride = n * kGroupBytesPer;
  // Prompts go in panels of tokens whose activations (an ActivationBlock per block and token) stay in L2
  // while every group of the share passes over them; a whole 512-token chunk of a 5632-column
  // matrix (4.3 MB) would come from L3 again for every 16 rows. Each panel reads the weights once
  // more, which costs little where there are this many tokens per weight.
  const std::size_t panel = std::max<std::size_t>(4 * kMax, (std::size_t{768} << 10) / (cols / 32 * sizeof(ActivationBlock)));
  // One token streams its weights from memory: a single group's stream is what the prefetching in
  // the tiles was tuned for, and loads do not limit it.
  const bool pairs = kMaxPair > 0 && n_tokens > 1;
  for (std::size_t p0 = 0; p0 < n_tokens; p0 += panel) {
    const std::size_t count = std::min(panel, n_tokens - p0);
    const TokenTiles singles(count, kMax), doubles(count, pairs ? kMaxPair : kMax);
    for (std::size_t r = r0; r < r1;) {
      const std::uint8_t* group = w + (r / 16) * group_stride;
      if (pairs && r + 32 <= r1) {
        for (std::size_t i = 0, t = p0; i < doubles.count; t += doubles.size(i), ++i) {
          kPairs[doubles.size(i) - 1](group, group_stride, n, x, t, y + r, ldy);
        }
        r += 32;
      } else {
        for (std::size_t i = 0, t = p0; i < singles.count; t += singles.size(i), ++i) kTiles[singles.size(i) - 1](group, n, x, t, y + r, ldy);
        r += 16;
      }
    }
  }
}

// Tile<C> and PairTile<C> for x16_driver: one or two 16-row groups of the Q4_0x16 (Q8 = false) or
// Q8_0x16 (Q8 = true) layout.
template <bool Q8>
struct GroupTiles {
  template <int C>
  struct Single {
    static void run(const std::uint8_t* g, std::size_t n, const QuantizedRows& x, std::size_t t, float* y, std::size_t ldy) {
      tile_groups<Q8, 1, C>(g, 0, n, x, t, y, ldy);
    }
  };
  template <int C>
  struct Pair {
    static void run(const std::uint8_t* g, std::size_t stride, std::size_t n, const QuantizedRows& x, std::size_t t, float* y,
                    std::size_t ldy) {
      tile_groups<Q8, 2, C>(g, stride, n, x, t, y, ldy);
    }
  };
};
template <int C>
struct Q4_KTile {
  static void run(const std::uint8_t* g, std::size_t n, const QuantizedRows& x, std::size_t t, float* y, std::size_t ldy) {
    tile_k_x16<false, C>(g, n, x, t, y, ldy);
  }
};
template <int C>
struct Q5_KTile {
  static void run(const std::uint8_t* g, std::size_t n, const QuantizedRows& x, std::size_t t, float* y, std::size_t ldy) {
    tile_k_x16<true, C>(g, n, x, t, y, ldy);
  }
};
template <typename Sub16>
struct Sub16Tiles {
  template <int C>
  struct Single {
    static void run(const std::uint8_t* g, std::size_t n, const QuantizedRows& x, std::size_t t, float* y, std::size_t ldy) {
      tile_sub16_x16<Sub16, C>(g, n, x, t, y, ldy);
    }
  };
};
template <int C>
struct IQ4_XSTile {
  static void run(const std::uint8_t* g, std::size_t n, const QuantizedRows& x, std::size_t t, float* y, std::size_t ldy) {
    tile_iq4_xs_x16<C>(g, n, x, t, y, ldy);
  }
};


// exp(x) for x <= 0, 16 at a time (exp256's method).
inline __m512 exp512(__m512 x) {
  x = _mm512_max_ps(x, _mm512_set1_ps(-87.0f));
  const __m512 t = _mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f));
  const __m512 n = _mm512_roundscale_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 y = _mm512_mul_ps(_mm512_sub_ps(t, n), _mm512_set1_ps(0.693147180559945309f));
  __m512 p = _mm512_set1_ps(1.0f / 720.0f);
  p = _mm512_fmadd_ps(p, y, _mm512_set1_ps(1.0f / 120.0f));
  p = _mm512_fmadd_ps(p, y, _mm512_set1_ps(1.0f / 24.0f));
  p = _mm512_fmadd_ps(p, y, _mm512_set1_ps(1.0f / 6.0f));
  p = _mm512_fmadd_ps(p, y, _mm512_set1_ps(0.5f));
  p = _mm512_fmadd_ps(p, y, _mm512_set1_ps(1.0f));
  p = _mm512_fmadd_ps(p, y, _mm512_set1_ps(1.0f));
  const __m512i pow2n = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
  return _mm512_mul_ps(p, _mm512_castsi512_ps(pow2n));
}

// 16 cached elements starting at element e of a block, as floats (e a multiple of 16).
template <DType T>
inline __m512 kv_load16(const void* block, std::size_t e) {
  if constexpr (T == DType::F32) {
    return _mm512_loadu_ps(static_cast<const float*>(block) + e);
  } else if constexpr (T == DType::F16) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(static_cast<const std::uint16_t*>(block) + e)));
  } else {
    const BlockQ8_0& b = static_cast<const BlockQ8_0*>(block)[e / kQK8_0];
    const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b.qs + e % kQK8_0));
    return _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q)), _mm512_set1_ps(h2f(b.d)));
  }
}

// Where each of a chunk's (up to 16) keys and values starts in the paged cache: the block table
// walked once per chunk, without a division per key and dimension group.
struct ChunkRows {
  const void* k[16];
  const void* v[16];
  std::size_t at[16];  // element offset in the block
};
inline ChunkRows chunk_rows(const void* const* k_blocks, const void* const* v_blocks, std::size_t block_tokens, std::size_t stride,
                            std::size_t offset, std::size_t j0, std::size_t nj) {
  ChunkRows r;
  for (std::size_t j = 0, blk = j0 / block_tokens, in = j0 % block_tokens; j < nj; ++j) {
    r.k[j] = k_blocks[blk];
    r.v[j] = v_blocks[blk];
    r.at[j] = in * stride + offset;
    if (++in == block_tokens) {
      in = 0;
      ++blk;
    }
  }
  return r;
}

// The online-softmax steps every attention kernel shares. A query's result must not depend on which
// kernel its tile goes to, so all take these same operation chains.
// A score, or -inf where the key lies past what the lane's query may see (causality, or no query).
inline __m512 visible_score(__m512i ctx, __m512i key_pos, __m512 score) {
  return _mm512_mask_blend_ps(_mm512_cmpgt_epi32_mask(ctx, key_pos), _mm512_set1_ps(-INFINITY), score);
}
struct Rescale {
  __m512 m_safe;      // the running max, 0 in lanes that have seen nothing (exp never sees -inf - -inf)
  __m512 correction;  // what earlier sums are multiplied by: exp(old max - new max), 0 where there were none
};
// The same, where the lane's query also sees nothing before its window's first position.
inline __m512 visible_score(__m512i ctx, __m512i first, __m512i key_pos, __m512 score) {
  const __mmask16 visible = _mm512_cmpgt_epi32_mask(ctx, key_pos) & _mm512_cmpge_epi32_mask(key_pos, first);
  return _mm512_mask_blend_ps(visible, _mm512_set1_ps(-INFINITY), score);
}
// cap * tanh(score / cap) with tanh(y) = 1 - 2 / (exp(2y) + 1); |y| is clamped at 9, where tanh is
// 1 in floats, so that the exponential stays in range.
inline __m512 soft_cap(__m512 score, float cap) {
  __m512 y = _mm512_mul_ps(score, _mm512_set1_ps(1.0f / cap));
  y = _mm512_min_ps(_mm512_max_ps(y, _mm512_set1_ps(-9.0f)), _mm512_set1_ps(9.0f));
  const __m512 e = exp512(_mm512_add_ps(y, y));
  const __m512 t = _mm512_sub_ps(_mm512_set1_ps(1.0f), _mm512_div_ps(_mm512_set1_ps(2.0f), _mm512_add_ps(e, _mm512_set1_ps(1.0f))));
  return _mm512_mul_ps(t, _mm512_set1_ps(cap));
}
// Moves the running max m to include a chunk's max.
inline Rescale rescale(__m512& m, __m512 chunk_max) {
  const __m512 m_new = _mm512_max_ps(m, chunk_max);
  const __m512 m_safe = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(m_new, _mm512_set1_ps(-INFINITY), _CMP_NEQ_OQ), m_new);
  const __m512 correction =
      _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(m, _mm512_set1_ps(-INFINITY), _CMP_NEQ_OQ), exp512(_mm512_sub_ps(m, m_safe)));
  m = m_new;
  return {m_safe, correction};
}
// exp(score - max), exactly 0 for a masked score.
inline __m512 probability(__m512 score, __m512 m_safe) {
  return _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(score, _mm512_set1_ps(-INFINITY), _CMP_NEQ_OQ), exp512(_mm512_sub_ps(score, m_safe)));
}
// log(sum of exp(score)) from a lane's running max and sum, -inf for a lane that saw no key.
inline float log_sum_exp_of(float m, float l) { return l > 0.0f ? m + std::log(l) : -INFINITY; }
// 1 / l, or 0 for a lane that saw no key.
inline __m512 inverse_or_zero(__m512 l) {
  return _mm512_maskz_div_ps(_mm512_cmp_ps_mask(l, _mm512_setzero_ps(), _CMP_GT_OQ), _mm512_set1_ps(1.0f), l);
}

// The tiled attention (see KernelTable::attention_tile): one vector lane per query, V vectors of 16
// lanes (V = 2 for more than 16 queries, 4 for more than 32). Keys go in chunks of 16: the chunk's keys and values are
// converted to floats once for all lanes, scores for 8 keys x 16V queries come from broadcast-FMAs
// against the transposed queries (one broadcast feeds V FMAs), the online softmax runs per lane
// (rescaled once per chunk), and the values are accumulated into the transposed output. Each lane's
// operations are the same whatever V and whatever its neighbours, so a query's result does not depend
// on the tile it shares. Windows (first, null for none) and the soft cap (0 for none) are applied
// here only: chunks wholly before every query's window are skipped, which changes no sum, and no
// position before every window is read, so the blocks that hold only such positions may be null.
template <DType T, int V>
void attention_tile_impl(const float* const* q, const std::size_t* first, const std::size_t* n_ctx, std::size_t n_q,
                         const void* const* k_blocks, const void* const* v_blocks, std::size_t block_tokens, std::size_t stride,
                         std::size_t offset, std::size_t head_dim, float scale, float softcap, float* const* out, float* lse) {
  constexpr std::size_t kLanes = 16, kChunk = 16, kMaxDim = 256;
  // Keys scored, and dimensions accumulated, per step: 8 x V accumulators for V <= 2, 4 x 4 for
  // V = 4, within the 32 vector registers.
  constexpr int kKeys = V <= 2 ? 8 : 4, kDims = V <= 2 ? 8 : 4;
  const std::size_t D = head_dim;
  alignas(64) float qt[V][kMaxDim * kLanes];  // qt[v][d * 16 + i] = scale * q[16v + i][d]
  alignas(64) float ot[V][kMaxDim * kLanes];  // ot[v][d * 16 + i]: query 16v + i's running weighted sum of values
  alignas(64) float kf[kChunk * kMaxDim];     // the chunk's keys as floats, key-major
  alignas(64) float vf[kChunk * kMaxDim];
  alignas(64) float s[V][kChunk * kLanes];    // scores, then probabilities: s[v][j * 16 + i]
  std::size_t max_ctx = 0, min_first = first ? SIZE_MAX : 0;
  alignas(64) std::int32_t ctx_lane[V][kLanes] = {};
  alignas(64) std::int32_t first_lane[V][kLanes] = {};
  for (std::size_t i = 0; i < n_q; ++i) {
    ctx_lane[i / kLanes][i % kLanes] = static_cast<std::int32_t>(n_ctx[i]);
    max_ctx = std::max(max_ctx, n_ctx[i]);
    if (first) {
      first_lane[i / kLanes][i % kLanes] = static_cast<std::int32_t>(first[i]);
      min_first = std::min(min_first, first[i]);
    }
  }
  for (int v = 0; v < V; ++v) {
    for (std::size_t d = 0; d < D; ++d) {
      for (std::size_t i = 0; i < kLanes; ++i) {
        const std::size_t query = static_cast<std::size_t>(v) * kLanes + i;
        qt[v][d * kLanes + i] = query < n_q ? scale * q[query][d] : 0.0f;
      }
    }
    std::fill_n(ot[v], D * kLanes, 0.0f);
  }
  __m512i ctx_v[V], first_v[V];
  __m512 m[V], l[V];
  for (int v = 0; v < V; ++v) {
    ctx_v[v] = _mm512_load_si512(ctx_lane[v]);
    first_v[v] = _mm512_load_si512(first_lane[v]);
    m[v] = _mm512_set1_ps(-INFINITY);
    l[v] = _mm512_setzero_ps();
  }

  for (std::size_t j0 = std::min(min_first, max_ctx) / kChunk * kChunk; j0 < max_ctx; j0 += kChunk) {
    const std::size_t nj = std::min(kChunk, max_ctx - j0);
    if (nj < kChunk) std::fill(kf + nj * D, kf + kChunk * D, 0.0f);  // the score loop reads whole groups of kKeys
    const ChunkRows where = chunk_rows(k_blocks, v_blocks, block_tokens, stride, offset, j0, nj);
    for (std::size_t j = 0; j < nj; ++j) {
      if (j0 + j < min_first) {  // before every query's window: its block may be released (null), so never read
        std::fill_n(kf + j * D, D, 0.0f);
        std::fill_n(vf + j * D, D, 0.0f);
        continue;
      }
      for (std::size_t d = 0; d < D; d += 16) {
        _mm512_store_ps(kf + j * D + d, kv_load16<T>(where.k[j], where.at[j] + d));
        _mm512_store_ps(vf + j * D + d, kv_load16<T>(where.v[j], where.at[j] + d));
      }
    }
    // Scores, kKeys keys at a time so that kKeys x V independent FMA chains hide the latency.
    __m512 chunk_max[V];
    for (int v = 0; v < V; ++v) chunk_max[v] = _mm512_set1_ps(-INFINITY);
    for (std::size_t j = 0; j < nj; j += kKeys) {
      __m512 acc[V][kKeys];
      for (int v = 0; v < V; ++v)
        for (int u = 0; u < kKeys; ++u) acc[v][u] = _mm512_setzero_ps();
      const std::size_t nu = std::min<std::size_t>(kKeys, nj - j);
      for (std::size_t d = 0; d < D; ++d) {
        __m512 qd[V];
        for (int v = 0; v < V; ++v) qd[v] = _mm512_load_ps(qt[v] + d * kLanes);
#pragma GCC unroll 8
        for (int u = 0; u < kKeys; ++u) {
          const __m512 kd = _mm512_set1_ps(kf[(j + static_cast<std::size_t>(u)) * D + d]);
          for (int v = 0; v < V; ++v) acc[v][u] = _mm512_fmadd_ps(kd, qd[v], acc[v][u]);
        }
      }
      for (std::size_t u = 0; u < nu; ++u) {
        for (int v = 0; v < V; ++v) {
          const __m512 raw = softcap > 0.0f ? soft_cap(acc[v][u], softcap) : acc[v][u];
          const __m512 sc = visible_score(ctx_v[v], first_v[v], _mm512_set1_epi32(static_cast<std::int32_t>(j0 + j + u)), raw);
          _mm512_store_ps(s[v] + (j + u) * kLanes, sc);
          chunk_max[v] = _mm512_max_ps(chunk_max[v], sc);
        }
      }
    }
    __m512 correction[V];
    for (int v = 0; v < V; ++v) {
      const auto [m_safe, corr] = rescale(m[v], chunk_max[v]);
      correction[v] = corr;
      // The chunk's probabilities are summed as even keys + odd keys, the order the key-pair kernel
      // (attention_pairs_impl) can reproduce exactly.
      __m512 sum_even = _mm512_setzero_ps(), sum_odd = _mm512_setzero_ps();
      for (std::size_t j = 0; j < nj; ++j) {
        const __m512 p = probability(_mm512_load_ps(s[v] + j * kLanes), m_safe);
        _mm512_store_ps(s[v] + j * kLanes, p);
        if (j % 2 == 0) {
          sum_even = _mm512_add_ps(sum_even, p);
        } else {
          sum_odd = _mm512_add_ps(sum_odd, p);
        }
      }
      l[v] = _mm512_add_ps(_mm512_mul_ps(l[v], correction[v]), _mm512_add_ps(sum_even, sum_odd));
    }
    // ot[d] = ot[d] * correction + sum_j p_j * v_j[d], kDims dimensions at a time in registers.
    for (std::size_t d0 = 0; d0 < D; d0 += kDims) {
      __m512 acc[V][kDims];
      for (int v = 0; v < V; ++v) {
#pragma GCC unroll 8
        for (int u = 0; u < kDims; ++u) acc[v][u] = _mm512_mul_ps(_mm512_load_ps(ot[v] + (d0 + static_cast<std::size_t>(u)) * kLanes), correction[v]);
      }
      for (std::size_t j = 0; j < nj; ++j) {
        __m512 p[V];
        for (int v = 0; v < V; ++v) p[v] = _mm512_load_ps(s[v] + j * kLanes);
#pragma GCC unroll 8
        for (int u = 0; u < kDims; ++u) {
          const __m512 vd = _mm512_set1_ps(vf[j * D + d0 + static_cast<std::size_t>(u)]);
          for (int v = 0; v < V; ++v) acc[v][u] = _mm512_fmadd_ps(vd, p[v], acc[v][u]);
        }
      }
      for (int v = 0; v < V; ++v) {
#pragma GCC unroll 8
        for (int u = 0; u < kDims; ++u) _mm512_store_ps(ot[v] + (d0 + static_cast<std::size_t>(u)) * kLanes, acc[v][u]);
      }
    }
  }
  for (int v = 0; v < V; ++v) {
    alignas(64) float inv[kLanes], m_lane[kLanes], l_lane[kLanes];
    _mm512_store_ps(inv, inverse_or_zero(l[v]));
    _mm512_store_ps(m_lane, m[v]);
    _mm512_store_ps(l_lane, l[v]);
    for (std::size_t i = 0; i < kLanes; ++i) {
      const std::size_t query = static_cast<std::size_t>(v) * kLanes + i;
      if (query >= n_q) break;
      for (std::size_t d = 0; d < D; ++d) out[query][d] = ot[v][d * kLanes + i] * inv[i];
      if (lse) lse[query] = log_sum_exp_of(m_lane[i], l_lane[i]);
    }
  }
}

// The tiled attention for at most 8 queries (one decoding token's GQA group): with one lane per
// query, half of every vector would idle. Here a lane is (query, key parity) while scoring, so each
// FMA serves two keys, and (query, dimension parity) while accumulating values, so each FMA serves two
// dimensions: half the FMAs of attention_tile_impl for the same work. Every (query, key) score, every
// exp, every probability sum (even keys + odd keys) and every (query, dimension) value accumulation is
// the same chain of operations in the same order as in attention_tile_impl, so a query's result is
// bit-identical whichever of the two kernels its tile goes to (windows and caps included).
template <DType T>
void attention_pairs_impl(const float* const* q, const std::size_t* first, const std::size_t* n_ctx, std::size_t n_q,
                          const void* const* k_blocks, const void* const* v_blocks, std::size_t block_tokens, std::size_t stride,
                          std::size_t offset, std::size_t head_dim, float scale, float softcap, float* const* out, float* lse) {
  constexpr std::size_t kLanes = 16, kChunk = 16, kPairs = kChunk / 2, kMaxDim = 256;
  const std::size_t D = head_dim;
  alignas(64) float qt[kMaxDim * kLanes];         // qt[d * 16 + 2i + e] = scale * q[i][d]
  alignas(64) float ot[kMaxDim / 2 * kLanes];     // ot[(d / 2) * 16 + 2i + d % 2]: query i's running sum
  alignas(64) float kf[kPairs * 2 * kMaxDim];     // kf[p * 2D + 2d + e] = key 2p + e of the chunk, dimension d
  alignas(64) float vf[kChunk * kMaxDim];         // the chunk's values, key-major
  alignas(64) float s[kPairs * kLanes];           // scores, then probabilities: s[p * 16 + 2i + e], key 2p + e
  alignas(64) float pk[kChunk * kLanes];          // pk[j * 16 + 2i + e] = probability of key j for query i
  alignas(64) std::int32_t ctx_lane[kLanes] = {};
  alignas(64) std::int32_t first_lane[kLanes] = {};
  std::size_t max_ctx = 0, min_first = first ? SIZE_MAX : 0;
  for (std::size_t i = 0; i < n_q; ++i) {
    ctx_lane[2 * i] = ctx_lane[2 * i + 1] = static_cast<std::int32_t>(n_ctx[i]);
    max_ctx = std::max(max_ctx, n_ctx[i]);
    if (first) {
      first_lane[2 * i] = first_lane[2 * i + 1] = static_cast<std::int32_t>(first[i]);
      min_first = std::min(min_first, first[i]);
    }
  }
  for (std::size_t d = 0; d < D; ++d) {
    for (std::size_t i = 0; i < kLanes / 2; ++i) qt[d * kLanes + 2 * i] = qt[d * kLanes + 2 * i + 1] = i < n_q ? scale * q[i][d] : 0.0f;
  }
  std::fill_n(ot, D / 2 * kLanes, 0.0f);
  const __m512i ctx_v = _mm512_load_si512(ctx_lane);
  const __m512i first_v = _mm512_load_si512(first_lane);
  const __m512i parity = _mm512_set_epi32(1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0);
  // Interleave two keys' 16 dimensions: (a0 b0 a1 b1 ... a7 b7) and (a8 b8 ... a15 b15).
  const __m512i interleave_lo = _mm512_set_epi32(23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
  const __m512i interleave_hi = _mm512_set_epi32(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8);
  const auto pair_of = [](const float* p) {  // (p[0], p[1]) in every pair of lanes
    double bits;
    std::memcpy(&bits, p, sizeof bits);
    return _mm512_castpd_ps(_mm512_set1_pd(bits));
  };
  __m512 m = _mm512_set1_ps(-INFINITY), l = _mm512_setzero_ps();

  for (std::size_t j0 = std::min(min_first, max_ctx) / kChunk * kChunk; j0 < max_ctx; j0 += kChunk) {
    const std::size_t nj = std::min(kChunk, max_ctx - j0);
    const ChunkRows where = chunk_rows(k_blocks, v_blocks, block_tokens, stride, offset, j0, nj);
    for (std::size_t p = 0; p < kPairs; ++p) {
      for (std::size_t d = 0; d < D; d += 16) {
        __m512 key[2];
        for (std::size_t e = 0; e < 2; ++e) {
          const std::size_t j = 2 * p + e;
          if (j < nj && j0 + j < min_first) {  // before every window: never read (its block may be released)
            key[e] = _mm512_setzero_ps();
            _mm512_store_ps(vf + j * D + d, _mm512_setzero_ps());
          } else if (j < nj) {
            key[e] = kv_load16<T>(where.k[j], where.at[j] + d);
            _mm512_store_ps(vf + j * D + d, kv_load16<T>(where.v[j], where.at[j] + d));
          } else {
            key[e] = _mm512_setzero_ps();  // scored (and masked) with the rest of the pair
          }
        }
        _mm512_store_ps(kf + p * 2 * D + 2 * d, _mm512_permutex2var_ps(key[0], interleave_lo, key[1]));
        _mm512_store_ps(kf + p * 2 * D + 2 * d + 16, _mm512_permutex2var_ps(key[0], interleave_hi, key[1]));
      }
    }
    __m512 acc[kPairs];
    for (auto& a : acc) a = _mm512_setzero_ps();
    for (std::size_t d = 0; d < D; ++d) {
      const __m512 qd = _mm512_load_ps(qt + d * kLanes);
#pragma GCC unroll 8
      for (std::size_t p = 0; p < kPairs; ++p) acc[p] = _mm512_fmadd_ps(pair_of(kf + p * 2 * D + 2 * d), qd, acc[p]);
    }
    __m512 chunk_max = _mm512_set1_ps(-INFINITY);
    for (std::size_t p = 0; p < kPairs; ++p) {
      const __m512i key_pos = _mm512_add_epi32(parity, _mm512_set1_epi32(static_cast<std::int32_t>(j0 + 2 * p)));
      const __m512 sc = visible_score(ctx_v, first_v, key_pos, softcap > 0.0f ? soft_cap(acc[p], softcap) : acc[p]);
      _mm512_store_ps(s + p * kLanes, sc);
      chunk_max = _mm512_max_ps(chunk_max, sc);
    }
    chunk_max = _mm512_max_ps(chunk_max, _mm512_permute_ps(chunk_max, 0xB1));  // both keys of each pair
    const auto [m_safe, correction] = rescale(m, chunk_max);
    __m512 sum = _mm512_setzero_ps();  // lanes (i, 0): even keys, (i, 1): odd keys
    for (std::size_t p = 0; p < (nj + 1) / 2; ++p) {
      const __m512 prob = probability(_mm512_load_ps(s + p * kLanes), m_safe);
      // Key j's probabilities in both lanes of each query: the multiplier of its values.
      _mm512_store_ps(pk + 2 * p * kLanes, _mm512_permute_ps(prob, 0xA0));
      _mm512_store_ps(pk + (2 * p + 1) * kLanes, _mm512_permute_ps(prob, 0xF5));
      sum = _mm512_add_ps(sum, prob);
    }
    l = _mm512_add_ps(_mm512_mul_ps(l, correction), _mm512_add_ps(sum, _mm512_permute_ps(sum, 0xB1)));
    // ot = ot * correction + sum_j p_j * v_j, 16 dimensions (8 vectors of pairs) at a time.
    for (std::size_t d0 = 0; d0 < D; d0 += 16) {
      __m512 o[8];
#pragma GCC unroll 8
      for (std::size_t u = 0; u < 8; ++u) o[u] = _mm512_mul_ps(_mm512_load_ps(ot + (d0 / 2 + u) * kLanes), correction);
      for (std::size_t j = 0; j < nj; ++j) {
        const __m512 pj = _mm512_load_ps(pk + j * kLanes);
#pragma GCC unroll 8
        for (std::size_t u = 0; u < 8; ++u) o[u] = _mm512_fmadd_ps(pair_of(vf + j * D + d0 + 2 * u), pj, o[u]);
      }
#pragma GCC unroll 8
      for (std::size_t u = 0; u < 8; ++u) _mm512_store_ps(ot + (d0 / 2 + u) * kLanes, o[u]);
    }
  }
  alignas(64) float inv[kLanes], m_lane[kLanes], l_lane[kLanes];
  _mm512_store_ps(inv, inverse_or_zero(l));
  _mm512_store_ps(m_lane, m);
  _mm512_store_ps(l_lane, l);
  for (std::size_t i = 0; i < n_q; ++i) {
    for (std::size_t d = 0; d < D; ++d) out[i][d] = ot[(d / 2) * kLanes + 2 * i + d % 2] * inv[2 * i];
    if (lse) lse[i] = log_sum_exp_of(m_lane[2 * i], l_lane[2 * i]);
  }
}

// r[i] = column i of the 16 x 16 matrix whose rows were r[0..15].
inline void transpose16(__m512 r[16]) {
  __m512 t[16];
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
  for (int i = 0; i < 4; ++i) {
    r[4 * i + 0] = _mm512_shuffle_ps(t[4 * i], t[4 * i + 2], 0x44);
    r[4 * i + 1] = _mm512_shuffle_ps(t[4 * i], t[4 * i + 2], 0xEE);
    r[4 * i + 2] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0x44);
    r[4 * i + 3] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0xEE);
  }
  for (int h = 0; h < 2; ++h) {
    for (int i = 0; i < 4; ++i) {
      t[8 * h + i] = _mm512_shuffle_f32x4(r[8 * h + i], r[8 * h + 4 + i], 0x88);
      t[8 * h + 4 + i] = _mm512_shuffle_f32x4(r[8 * h + i], r[8 * h + 4 + i], 0xDD);
    }
  }
  for (int i = 0; i < 8; ++i) {
    r[i] = _mm512_shuffle_f32x4(t[i], t[8 + i], 0x88);
    r[8 + i] = _mm512_shuffle_f32x4(t[i], t[8 + i], 0xDD);
  }
}

// The tiled attention for a single query: a decoding token of a model with one query head per KV
// head (no GQA), where the key-pair kernel would fill 2 of 16 lanes. Here a lane is a key while
// scoring (the chunk's keys are transposed, 16 x 16 at a time) and a dimension while accumulating
// values. A key's score is one chain of head_dim dependent FMAs, so four chunks are scored with their
// chains interleaved, then taken through the online softmax one chunk at a time as before. Every
// score, exp, probability sum (even keys + odd keys) and value accumulation is the same chain of
// operations in the same order as in attention_tile_impl: bit-identical results (windows and caps
// included; keys before the window are neither read nor accumulated, their probabilities being 0).
template <DType T>
void attention_single_impl(const float* q, std::size_t first, std::size_t n_ctx, const void* const* k_blocks,
                           const void* const* v_blocks, std::size_t block_tokens, std::size_t stride, std::size_t offset,
                           std::size_t head_dim, float scale, float softcap, float* out, float* lse) {
  constexpr std::size_t kLanes = 16, kChunk = 16, kGroup = 4, kMaxDim = 256;
  const std::size_t D = head_dim;
  alignas(64) float qs[kMaxDim];
  alignas(64) float ot[kMaxDim] = {};
  for (std::size_t d = 0; d < D; ++d) qs[d] = scale * q[d];
  const __m512i ctx = _mm512_set1_epi32(static_cast<std::int32_t>(n_ctx));
  const __m512i first_v = _mm512_set1_epi32(static_cast<std::int32_t>(first));
  const __m512i lane = _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
  __m512 m = _mm512_set1_ps(-INFINITY), l = _mm512_setzero_ps();
  ChunkRows where[kGroup];
  for (std::size_t g0 = std::min(first, n_ctx) / kChunk * kChunk; g0 < n_ctx; g0 += kGroup * kChunk) {
    const std::size_t n_chunks = std::min(kGroup, (n_ctx - g0 + kChunk - 1) / kChunk);
    std::size_t nj[kGroup];
    for (std::size_t c = 0; c < n_chunks; ++c) {
      nj[c] = std::min(kChunk, n_ctx - g0 - c * kChunk);
      where[c] = chunk_rows(k_blocks, v_blocks, block_tokens, stride, offset, g0 + c * kChunk, nj[c]);
    }
    // Each chunk's 16 x 16 slices of keys are transposed in registers and go straight into its
    // score chain (dimension by dimension, as every kernel does); the chunks take turns, so one's
    // transposes overlap the others' FMA latency. Nothing is written to memory on the way.
    __m512 score[kGroup];
    for (auto& sc : score) sc = _mm512_setzero_ps();
    for (std::size_t d0 = 0; d0 < D; d0 += kLanes) {
      for (std::size_t c = 0; c < n_chunks; ++c) {
        __m512 rows[kLanes];
#pragma GCC unroll 16
        for (std::size_t j = 0; j < kChunk; ++j) {
          const bool read = j < nj[c] && g0 + c * kChunk + j >= first;  // padding and keys before the window: masked below
          rows[j] = read ? kv_load16<T>(where[c].k[j], where[c].at[j] + d0) : _mm512_setzero_ps();
        }
        transpose16(rows);
#pragma GCC unroll 16
        for (std::size_t i = 0; i < kLanes; ++i) score[c] = _mm512_fmadd_ps(rows[i], _mm512_set1_ps(qs[d0 + i]), score[c]);
      }
    }
    for (std::size_t c = 0; c < n_chunks; ++c) {
      const std::size_t j0 = g0 + c * kChunk;
      const std::size_t j_read = first > j0 ? std::min(first - j0, nj[c]) : 0;  // keys before it have probability 0
      const __m512 raw = softcap > 0.0f ? soft_cap(score[c], softcap) : score[c];
      const __m512 sc = visible_score(ctx, first_v, _mm512_add_epi32(lane, _mm512_set1_epi32(static_cast<std::int32_t>(j0))), raw);
      const auto [m_safe, correction] = rescale(m, _mm512_set1_ps(_mm512_reduce_max_ps(sc)));
      const __m512 probs = probability(sc, m_safe);
      // Key j's probability in every lane, from the register: a broadcast load right after the
      // vector store would wait for the store to complete.
      const auto prob = [&](std::size_t j) { return _mm512_permutexvar_ps(_mm512_set1_epi32(static_cast<int>(j)), probs); };
      __m512 sum_even = _mm512_setzero_ps(), sum_odd = _mm512_setzero_ps();
      for (std::size_t j = 0; j < nj[c]; ++j) {
        if (j % 2 == 0) {
          sum_even = _mm512_add_ps(sum_even, prob(j));
        } else {
          sum_odd = _mm512_add_ps(sum_odd, prob(j));
        }
      }
      l = _mm512_add_ps(_mm512_mul_ps(l, correction), _mm512_add_ps(sum_even, sum_odd));
      // Values straight from the cache (the same conversion as anywhere else). Each group of 16
      // dimensions is a chain of nj dependent FMAs; four groups go key by key side by side, so that
      // consecutive instructions are independent (one chain after another left the kernel waiting
      // on FMA latency: half its time).
      std::size_t d0 = 0;
      for (; d0 + 4 * kLanes <= D; d0 += 4 * kLanes) {
        __m512 o[4];
#pragma GCC unroll 4
        for (std::size_t u = 0; u < 4; ++u) o[u] = _mm512_mul_ps(_mm512_load_ps(ot + d0 + u * kLanes), correction);
        for (std::size_t j = j_read; j < nj[c]; ++j) {
          const __m512 pj = prob(j);
#pragma GCC unroll 4
          for (std::size_t u = 0; u < 4; ++u) o[u] = _mm512_fmadd_ps(kv_load16<T>(where[c].v[j], where[c].at[j] + d0 + u * kLanes), pj, o[u]);
        }
#pragma GCC unroll 4
        for (std::size_t u = 0; u < 4; ++u) _mm512_store_ps(ot + d0 + u * kLanes, o[u]);
      }
      for (; d0 < D; d0 += kLanes) {
        __m512 o = _mm512_mul_ps(_mm512_load_ps(ot + d0), correction);
        for (std::size_t j = j_read; j < nj[c]; ++j) o = _mm512_fmadd_ps(kv_load16<T>(where[c].v[j], where[c].at[j] + d0), prob(j), o);
        _mm512_store_ps(ot + d0, o);
      }
    }
  }
  const __m512 inv = inverse_or_zero(l);
  for (std::size_t d0 = 0; d0 < D; d0 += kLanes) _mm512_storeu_ps(out + d0, _mm512_mul_ps(_mm512_load_ps(ot + d0), inv));
  if (lse) *lse = log_sum_exp_of(_mm512_cvtss_f32(m), _mm512_cvtss_f32(l));  // every lane holds the same max and sum
}

// silu(g) * u, 16 at a time, as g * sigmoid(g) * u with sigmoid from e = exp(-|g|) (exp512's
// domain, so nothing overflows): 1 / (1 + e) for g >= 0, e / (1 + e) below. Within a few ulp of
// silu_mul_reference; the C library's exp, one value at a time, was 6-8% of a prompt's time. The
// last partial vector goes through the same operations under a mask, so an element's result does
// not depend on where it sits.
void silu_mul(float* gate, const float* up, std::size_t n) {
  const __m512 one = _mm512_set1_ps(1.0f), zero = _mm512_setzero_ps();
  for (std::size_t i = 0; i < n; i += 16) {
    const __mmask16 live = n - i >= 16 ? static_cast<__mmask16>(0xffff) : static_cast<__mmask16>((1u << (n - i)) - 1);
    const __m512 g = _mm512_maskz_loadu_ps(live, gate + i);
    const __m512 magnitude = _mm512_abs_ps(g);
    // exp512 stops at -87; beyond, e is taken as 0 (silu(g) is g above 87 and -0 below -87).
    const __m512 e = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(magnitude, _mm512_set1_ps(87.0f), _CMP_LE_OQ),
                                         exp512(_mm512_sub_ps(zero, magnitude)));
    const __m512 inv = _mm512_div_ps(one, _mm512_add_ps(one, e));
    const __m512 sigmoid = _mm512_mask_mul_ps(inv, _mm512_cmp_ps_mask(g, zero, _CMP_LT_OQ), e, inv);
    _mm512_mask_storeu_ps(gate + i, live, _mm512_mul_ps(_mm512_mul_ps(g, sigmoid), _mm512_maskz_loadu_ps(live, up + i)));
  }
}

// gelu_tanh(g) * u, 16 at a time. 0.5 (1 + tanh(a)) = sigmoid(2a), so gelu_tanh(g) = g * sigmoid(z)
// with z = 2 sqrt(2/pi) (g + 0.044715 g^3): silu_mul's sigmoid at z instead of g. The C library's
// tanh, one value at a time, was a third of Gemma's prompt time (perf: __expm1f 23%, __tanhf 6%,
// the loop 5% of a gemma3-1b prefill). Within a few ulp of gelu_tanh_mul_reference.
void gelu_tanh_mul(float* gate, const float* up, std::size_t n) {
  const __m512 one = _mm512_set1_ps(1.0f), zero = _mm512_setzero_ps();
  const __m512 two_c = _mm512_set1_ps(2.0f * 0.7978845608028654f), cubic = _mm512_set1_ps(0.044715f);
  for (std::size_t i = 0; i < n; i += 16) {
    const __mmask16 live = n - i >= 16 ? static_cast<__mmask16>(0xffff) : static_cast<__mmask16>((1u << (n - i)) - 1);
    const __m512 g = _mm512_maskz_loadu_ps(live, gate + i);
    const __m512 z = _mm512_mul_ps(two_c, _mm512_fmadd_ps(_mm512_mul_ps(cubic, g), _mm512_mul_ps(g, g), g));
    const __m512 magnitude = _mm512_abs_ps(z);
    const __m512 e = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(magnitude, _mm512_set1_ps(87.0f), _CMP_LE_OQ),
                                         exp512(_mm512_sub_ps(zero, magnitude)));
    const __m512 inv = _mm512_div_ps(one, _mm512_add_ps(one, e));
    const __m512 sigmoid = _mm512_mask_mul_ps(inv, _mm512_cmp_ps_mask(z, zero, _CMP_LT_OQ), e, inv);
    _mm512_mask_storeu_ps(gate + i, live, _mm512_mul_ps(_mm512_mul_ps(g, sigmoid), _mm512_maskz_loadu_ps(live, up + i)));
  }
}

// Calls kernel.template operator()<T>() with the cache's element type as a template argument.
template <typename Kernel>
void with_kv_type(DType kv_type, Kernel&& kernel) {
  switch (kv_type) {
    case DType::F16: kernel.template operator()<DType::F16>(); break;
    case DType::Q8_0: kernel.template operator()<DType::Q8_0>(); break;
    default: kernel.template operator()<DType::F32>(); break;
  }
}

void attention_tile(const float* const* q, const std::size_t* first, const std::size_t* n_ctx, std::size_t n_q,
                    const void* const* k_blocks, const void* const* v_blocks, DType kv_type, std::size_t block_tokens, std::size_t stride,
                    std::size_t offset, std::size_t head_dim, float scale, float softcap, float* const* out, float* lse) {
  if (head_dim % 16 != 0 || head_dim > 256 || offset % 16 != 0 || stride % 16 != 0 || n_q > kAttentionTile) {
    attention_tile_each<attention>(q, first, n_ctx, n_q, k_blocks, v_blocks, kv_type, block_tokens, stride, offset, head_dim, scale,
                                   softcap, out, lse);
    return;
  }
  with_kv_type(kv_type, [&]<DType T>() {
    if (n_q == 1) {
      attention_single_impl<T>(q[0], first ? first[0] : 0, n_ctx[0], k_blocks, v_blocks, block_tokens, stride, offset, head_dim, scale,
                               softcap, out[0], lse);
    } else if (n_q <= 8) {
      attention_pairs_impl<T>(q, first, n_ctx, n_q, k_blocks, v_blocks, block_tokens, stride, offset, head_dim, scale, softcap, out, lse);
    } else if (n_q <= 16) {
      attention_tile_impl<T, 1>(q, first, n_ctx, n_q, k_blocks, v_blocks, block_tokens, stride, offset, head_dim, scale, softcap, out, lse);
    } else if (n_q <= 32) {
      attention_tile_impl<T, 2>(q, first, n_ctx, n_q, k_blocks, v_blocks, block_tokens, stride, offset, head_dim, scale, softcap, out, lse);
    } else {
      attention_tile_impl<T, 4>(q, first, n_ctx, n_q, k_blocks, v_blocks, block_tokens, stride, offset, head_dim, scale, softcap, out, lse);
    }
  });
}

// See KernelTable::int8_throughput_probe. Twelve chains, so that the dot products' latency (5
// cycles) never idles the two vector ports; in asm because GCC 12 copies every accumulator twice
// per round when the chains are an array of intrinsics.
std::int32_t int8_throughput_probe(std::size_t rounds) {
  __m512i a0 = _mm512_set1_epi32(0), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0, a8 = a0, a9 = a0, a10 = a0, a11 = a0;
  const __m512i u = _mm512_set1_epi8(1), v = _mm512_set1_epi8(-1);
  for (std::size_t r = 0; r < rounds; ++r) {
    asm volatile(
        "vpdpbusd %[v], %[u], %[a0]\n\tvpdpbusd %[v], %[u], %[a1]\n\tvpdpbusd %[v], %[u], %[a2]\n\t"
        "vpdpbusd %[v], %[u], %[a3]\n\tvpdpbusd %[v], %[u], %[a4]\n\tvpdpbusd %[v], %[u], %[a5]\n\t"
        "vpdpbusd %[v], %[u], %[a6]\n\tvpdpbusd %[v], %[u], %[a7]\n\tvpdpbusd %[v], %[u], %[a8]\n\t"
        "vpdpbusd %[v], %[u], %[a9]\n\tvpdpbusd %[v], %[u], %[a10]\n\tvpdpbusd %[v], %[u], %[a11]"
        : [a0] "+v"(a0), [a1] "+v"(a1), [a2] "+v"(a2), [a3] "+v"(a3), [a4] "+v"(a4), [a5] "+v"(a5), [a6] "+v"(a6), [a7] "+v"(a7),
          [a8] "+v"(a8), [a9] "+v"(a9), [a10] "+v"(a10), [a11] "+v"(a11)
        : [u] "v"(u), [v] "v"(v));
  }
  const __m512i sum = _mm512_add_epi32(
      _mm512_add_epi32(_mm512_add_epi32(_mm512_add_epi32(a0, a1), _mm512_add_epi32(a2, a3)), _mm512_add_epi32(_mm512_add_epi32(a4, a5), _mm512_add_epi32(a6, a7))),
      _mm512_add_epi32(_mm512_add_epi32(a8, a9), _mm512_add_epi32(a10, a11)));
  return _mm512_reduce_add_epi32(sum);
}

}  // namespace
}  // namespace avx512

const KernelTable& avx512_kernels() {
  static const KernelTable table{"avx512",         avx512::quantize_activations, avx512::gemm_q8_0, avx512::gemm_q4_0,
                                 avx512::gemm_half_512<DType::F16>, avx512::gemm_half_512<DType::BF16>, avx512::gemm_float<DType::F32>,
                                 avx512::Isa::dot_f32, avx512::attention,
                                 avx512::x16_driver<kQ4_0GroupBytes, 32, 12, avx512::GroupTiles<false>::Single, 8, avx512::GroupTiles<false>::Pair>,
                                 avx512::x16_driver<kQ8_0GroupBytes, 32, 12, avx512::GroupTiles<true>::Single, 8, avx512::GroupTiles<true>::Pair>,
                                 avx512::x16_driver<kQ4KGroupBytes, kQK_K, 12, avx512::Q4_KTile>,
                                 avx512::x16_driver<kQ5KGroupBytes, kQK_K, 12, avx512::Q5_KTile>,
                                 avx512::x16_driver<kQ6KGroupBytes, kQK_K, 12, avx512::Sub16Tiles<avx512::Q6Sub16>::Single>,
                                 avx512::x16_driver<kIQ4XSGroupBytes, kQK_K, 12, avx512::IQ4_XSTile>,
                                 avx512::x16_driver<kQ3KGroupBytes, kQK_K, 12, avx512::Sub16Tiles<avx512::Q3Sub16>::Single>, avx512::gemm_half_x4<DType::F16>,
                                 avx512::gemm_half_x4<DType::BF16>, avx512::gemm_dequant,
                                 avx512::attention_tile, false, true, avx512::silu_mul, avx512::gelu_tanh_mul,
                                 avx512::int8_throughput_probe};
  return table;
}

}  // namespace promptly::kernels
