// AVX2 + FMA + F16C path (compiled with -mavx2 -mfma -mf16c; only called when CPUID has them).
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <type_traits>
#include <vector>

#include "kernels/dispatch.h"
#include "util/fp16.h"
#include "tensor/quant-inl.h"
#include "tensor/quant.h"

namespace promptly::kernels {
namespace avx2 {
namespace {

struct Isa {
  // Sum of u8 x s8 products in groups of 4 bytes -> 8 x int32. maddubs saturates at int16, which
  // unsigned 4-bit values (<= 15 * 127 * 2) never reach.
  static __m256i dot_u8_s8(__m256i u, __m256i s) {
    return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
  }
  // Q8_0 x Q8_0: both signed; move the sign of x onto w so maddubs sees |x| (unsigned) x signed.
  using Q8Weights = __m256i;
  static __m256i prepare_q8_weights(__m256i w) { return w; }
  static __m256i prepare_q8_activations(__m256i x) { return x; }
  static __m256i dot_q8(__m256i w, __m256i x) {
    return _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_sign_epi8(x, x), _mm256_sign_epi8(w, x)), _mm256_set1_epi16(1));
  }
  static float dot_f32(const float* a, const float* b, std::size_t n);
};

#include "kernels/gemm-inl.h"

float Isa::dot_f32(const float* a, const float* b, std::size_t n) {
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  std::size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc0);
    acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), acc1);
  }
  for (; i + 8 <= n; i += 8) acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc0);
  float s = hsum(_mm256_add_ps(acc0, acc1));
  for (; i < n; ++i) s += a[i] * b[i];
  return s;
}

}  // namespace
}  // namespace avx2

const KernelTable& avx2_kernels() {
  static const KernelTable table{"avx2",         avx2::quantize_activations, avx2::gemm_q8_0, avx2::gemm_q4_0,
                                 avx2::gemm_float<DType::F16>, avx2::gemm_float<DType::BF16>, avx2::gemm_float<DType::F32>, avx2::Isa::dot_f32, avx2::attention,
                                 gemm_q4_0_x16_reference, gemm_q8_0_x16_reference,
                                 gemm_q4_k_x16_reference, gemm_q5_k_x16_reference, gemm_q6_k_x16_reference, gemm_iq4_xs_x16_reference, gemm_q3_k_x16_reference,
                                 gemm_f16_x4_reference,
                                 gemm_bf16_x4_reference, avx2::gemm_dequant,
                                 attention_tile_each<avx2::attention>, false, false, silu_mul_reference,
                                 gelu_tanh_mul_reference, nullptr};
  return table;
}

}  // namespace promptly::kernels
