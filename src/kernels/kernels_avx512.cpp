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
#include <cmath>
#include <type_traits>
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

// 16 rows x C tokens of the Q4_0x16 layout: per block, 8 VNNI instructions per token cover all 16
// rows (lane = row); the -8 offset of Q4_0 enters through the activation block sums. A token's 8
// instructions are split over A independent accumulators so they do not wait on each other's
// latency (few tokens: more chains per token).
// Q8 = true: the Q8_0x16 layout (8 groups of stored-unsigned quants, offset 128); false: Q4_0x16
// (4 groups of packed nibbles, offset 8).
template <bool Q8, int C>
void tile_x16(const std::uint8_t* group, std::size_t nb, const QuantizedRows& x, std::size_t t, float* y, std::size_t ldy) {
  constexpr std::size_t kGroupBlock = Q8 ? 16 * 34 : 16 * 18;
  constexpr int A = C >= 4 ? 2 : 4;
  __m512 acc[C];
  for (int j = 0; j < C; ++j) acc[j] = _mm512_setzero_ps();
  const __m512i mask = _mm512_set1_epi8(0x0f);
  const ActivationBlock* xt[C];
  for (int j = 0; j < C; ++j) xt[j] = x.act + (t + j) * x.n_blocks;
  for (std::size_t b = 0; b < nb; ++b) {
    const std::uint8_t* gb = group + b * kGroupBlock;
    const __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(gb)));
    __m512i q[8];  // q[k]: elements 4k..4k+3 of all 16 rows, unsigned
    if constexpr (Q8) {
      for (int g = 0; g < 8; ++g) q[g] = _mm512_loadu_si512(gb + 32 + 64 * g);
    } else {
      for (int g = 0; g < 4; ++g) {  // low nibbles hold elements 4g.., high nibbles 16+4g..
        const __m512i v = _mm512_loadu_si512(gb + 32 + 64 * g);
        q[g] = _mm512_and_si512(v, mask);
        q[4 + g] = _mm512_and_si512(_mm512_srli_epi16(v, 4), mask);
      }
    }
    // Fully unrolled so that acc[] stays in registers.
#pragma GCC unroll 8
    for (int j = 0; j < C; ++j) {
      const ActivationBlock& xb = xt[j][b];
      __m512i dot[A];
      for (int a = 0; a < A; ++a) dot[a] = _mm512_setzero_si512();
#pragma GCC unroll 8
      for (int k = 0; k < 8; ++k) {
        std::int32_t x4;
        std::memcpy(&x4, xb.qs + 4 * k, 4);
        dot[k % A] = _mm512_dpbusd_epi32(dot[k % A], q[k], _mm512_set1_epi32(x4));
      }
      for (int a = 1; a < A; ++a) dot[0] = _mm512_add_epi32(dot[0], dot[a]);
      // The stored-unsigned offset leaves exactly in integers (dot - offset * sum(x)); then one
      // convert, one multiply by d_x and one FMA with d_w: the fewest float operations per block.
      dot[0] = _mm512_sub_epi32(dot[0], _mm512_set1_epi32(Q8 ? xb.offset_q8 : xb.offset_q4));
      const __m512 scaled = _mm512_mul_ps(_mm512_cvtepi32_ps(dot[0]), _mm512_set1_ps(xb.d));
      acc[j] = _mm512_fmadd_ps(dw, scaled, acc[j]);
    }
  }
  for (int j = 0; j < C; ++j) _mm512_storeu_ps(y + (t + j) * ldy, acc[j]);
}

// Q4_Kx16: 16 rows x C tokens. Per 32-element sub-block: 8 VNNI instructions per token, then the
// sub-block's scale (d * sc) and min (dmin * m, against the activation block's sum).
template <int C>
void tile_q4_k_x16(const std::uint8_t* group, std::size_t nsb, const QuantizedRows& x, std::size_t t, float* y, std::size_t ldy) {
  __m512 acc[C];
  for (int j = 0; j < C; ++j) acc[j] = _mm512_setzero_ps();
  const __m512i mask = _mm512_set1_epi8(0x0f);
  for (std::size_t sb = 0; sb < nsb; ++sb) {
    const std::uint8_t* g = group + sb * kQ4KGroupBytes;
    const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(g)));
    const __m512 dmin = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(g + 32)));
    for (int p = 0; p < 4; ++p) {
      const std::uint8_t* quants = g + 320 + 512 * p;
      __m512i lo[8], hi[8];
      for (int k = 0; k < 8; ++k) {
        const __m512i v = _mm512_loadu_si512(quants + 64 * k);
        lo[k] = _mm512_and_si512(v, mask);
        hi[k] = _mm512_and_si512(_mm512_srli_epi16(v, 4), mask);
      }
      for (int half = 0; half < 2; ++half) {
        const int s = 2 * p + half;
        const __m512 scale = _mm512_mul_ps(
            d, _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(g + 64 + 32 * s)))));
        const __m512 minv = _mm512_mul_ps(
            dmin, _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(g + 64 + 32 * s + 16)))));
        const __m512i* q = half == 0 ? lo : hi;
        const std::size_t k_block = sb * 8 + static_cast<std::size_t>(s);
        for (int j = 0; j < C; ++j) {
          const BlockQ8_0& xb = x.blocks[(t + j) * x.n_blocks + k_block];
          __m512i dot0 = _mm512_setzero_si512(), dot1 = _mm512_setzero_si512();
          for (int k = 0; k < 8; k += 2) {
            std::int32_t x0, x1;
            std::memcpy(&x0, xb.qs + 4 * k, 4);
            std::memcpy(&x1, xb.qs + 4 * k + 4, 4);
            dot0 = _mm512_dpbusd_epi32(dot0, q[k], _mm512_set1_epi32(x0));
            dot1 = _mm512_dpbusd_epi32(dot1, q[k + 1], _mm512_set1_epi32(x1));
          }
          const __m512 prod = _mm512_mul_ps(_mm512_set1_ps(h2f(xb.d)), _mm512_cvtepi32_ps(_mm512_add_epi32(dot0, dot1)));
          acc[j] = _mm512_fmadd_ps(scale, prod, acc[j]);
          acc[j] = _mm512_fnmadd_ps(minv, _mm512_set1_ps(x.sums[(t + j) * x.n_blocks + k_block]), acc[j]);
        }
      }
    }
  }
  for (int j = 0; j < C; ++j) _mm512_storeu_ps(y + (t + j) * ldy, acc[j]);
}


// Q6_Kx16: 16 rows x C tokens. Per 16-element sub-block: 4 VNNI instructions per token on the
// unsigned 6-bit values, the -32 offset through the activation half-block sums, then the sub-block
// scale (d * sc).
template <int C>
void tile_q6_k_x16(const std::uint8_t* group, std::size_t nsb, const QuantizedRows& x, std::size_t t, float* y, std::size_t ldy) {
  __m512 acc[C];
  for (int j = 0; j < C; ++j) acc[j] = _mm512_setzero_ps();
  for (std::size_t sb = 0; sb < nsb; ++sb) {
    const std::uint8_t* g = group + sb * kQ6KGroupBytes;
    const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(g)));
    for (int s = 0; s < 16; ++s) {
      const __m512 scale =
          _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(g + 32 + 16 * s)))));
      __m512i q[4];
      for (int k = 0; k < 4; ++k) q[k] = _mm512_loadu_si512(g + 288 + 64 * (4 * s + k));
      const std::size_t k_block = sb * 8 + static_cast<std::size_t>(s / 2);
      const int half = s % 2;
      for (int j = 0; j < C; ++j) {
        const BlockQ8_0& xb = x.blocks[(t + j) * x.n_blocks + k_block];
        __m512i dot0 = _mm512_setzero_si512(), dot1 = _mm512_setzero_si512();
        for (int k = 0; k < 4; k += 2) {
          std::int32_t x0, x1;
          std::memcpy(&x0, xb.qs + 16 * half + 4 * k, 4);
          std::memcpy(&x1, xb.qs + 16 * half + 4 * k + 4, 4);
          dot0 = _mm512_dpbusd_epi32(dot0, q[k], _mm512_set1_epi32(x0));
          dot1 = _mm512_dpbusd_epi32(dot1, q[k + 1], _mm512_set1_epi32(x1));
        }
        // d_x * dot - 32 * d_x * sum(x half)
        const __m512 corrected = _mm512_fmsub_ps(_mm512_set1_ps(h2f(xb.d)), _mm512_cvtepi32_ps(_mm512_add_epi32(dot0, dot1)),
                                                 _mm512_set1_ps(32.0f * x.half_sums[2 * ((t + j) * x.n_blocks + k_block) + half]));
        acc[j] = _mm512_fmadd_ps(scale, corrected, acc[j]);
      }
    }
  }
  for (int j = 0; j < C; ++j) _mm512_storeu_ps(y + (t + j) * ldy, acc[j]);
}


// Runs Tile<C>(group, n_super, x, t, y + r, ldy) over 16-row groups [r0, r1) and all tokens, C <= kMax.
template <std::size_t kGroupBytesPer, std::size_t kElemsPer, int kMax, template <int> class Tile>
void x16_driver(const std::uint8_t* w, std::size_t cols, std::size_t r0, std::size_t r1, const QuantizedRows& x,
                std::size_t n_tokens, float* y, std::size_t ldy) {
  const std::size_t n = cols / kElemsPer;  // blocks (or super-blocks) per row
  for (std::size_t r = r0; r < r1; r += 16) {
    const std::uint8_t* group = w + (r / 16) * n * kGroupBytesPer;
    std::size_t t = 0;
    if constexpr (kMax >= 8) {
      for (; t + 8 <= n_tokens; t += 8) Tile<8>::run(group, n, x, t, y + r, ldy);
    }
    for (; t + 4 <= n_tokens; t += 4) Tile<4>::run(group, n, x, t, y + r, ldy);
    switch (n_tokens - t) {
      case 3: Tile<3>::run(group, n, x, t, y + r, ldy); break;
      case 2: Tile<2>::run(group, n, x, t, y + r, ldy); break;
      case 1: Tile<1>::run(group, n, x, t, y + r, ldy); break;
      default: break;
    }
  }
}

template <int C>
struct Q4_0Tile {
  static void run(const std::uint8_t* g, std::size_t n, const QuantizedRows& x, std::size_t t, float* y, std::size_t ldy) {
    tile_x16<false, C>(g, n, x, t, y, ldy);
  }
};
template <int C>
struct Q8_0Tile {
  static void run(const std::uint8_t* g, std::size_t n, const QuantizedRows& x, std::size_t t, float* y, std::size_t ldy) {
    tile_x16<true, C>(g, n, x, t, y, ldy);
  }
};
template <int C>
struct Q4_KTile {
  static void run(const std::uint8_t* g, std::size_t n, const QuantizedRows& x, std::size_t t, float* y, std::size_t ldy) {
    tile_q4_k_x16<C>(g, n, x, t, y, ldy);
  }
};
template <int C>
struct Q6_KTile {
  static void run(const std::uint8_t* g, std::size_t n, const QuantizedRows& x, std::size_t t, float* y, std::size_t ldy) {
    tile_q6_k_x16<C>(g, n, x, t, y, ldy);
  }
};


}  // namespace
}  // namespace avx512

const KernelTable& avx512_kernels() {
  static const KernelTable table{"avx512",         avx512::quantize_q8_0, avx512::gemm_q8_0, avx512::gemm_q4_0,
                                 avx512::gemm_f16, avx512::gemm_f32,      avx512::Isa::dot_f32, avx512::attention,
                                 avx512::x16_driver<16 * 18, 32, 8, avx512::Q4_0Tile>,
                                 avx512::x16_driver<16 * 34, 32, 8, avx512::Q8_0Tile>,
                                 avx512::x16_driver<kQ4KGroupBytes, kQK_K, 4, avx512::Q4_KTile>,
                                 avx512::x16_driver<kQ6KGroupBytes, kQK_K, 4, avx512::Q6_KTile>, avx512::gemm_dequant};
  return table;
}

}  // namespace promptly::kernels
