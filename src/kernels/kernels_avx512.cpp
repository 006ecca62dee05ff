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

#include <type_traits>
#include <vector>

#include "kernels/dispatch.h"
#include "util/fp16.h"

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

}  // namespace
}  // namespace avx512

const KernelTable& avx512_kernels() {
  static const KernelTable table{"avx512",         avx512::quantize_q8_0, avx512::gemm_q8_0, avx512::gemm_q4_0,
                                 avx512::gemm_f16, avx512::gemm_f32,      avx512::Isa::dot_f32};
  return table;
}

}  // namespace promptly::kernels
