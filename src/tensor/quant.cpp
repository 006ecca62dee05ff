#include "tensor/quant.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <string>

#include <immintrin.h>

#include "util/cpu_features.h"
#include "util/error.h"
#include "util/fp16.h"
#include "tensor/quant-inl.h"

namespace promptly {
namespace {

// F16 rows through F16C, 8 values per instruction, where the CPU has it (every x86-64 of the last
// decade; this file is built for the baseline, so the functions carry their own target). Every key
// and value the model computes enters the KV cache through quantize_row, on the thread that runs
// the step while the others wait: converted one bit-twiddled value at a time it cost ~4% of a 125m
// model's decode step. Same rounding (to nearest even) and the same results for every finite value
// and infinity; a NaN stays a NaN.
bool has_f16c() { return cpu_features().avx && cpu_features().f16c; }

__attribute__((target("avx,f16c"))) void fp32_to_fp16_row(const float* src, std::uint16_t* dst, std::size_t n) {
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i), _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
  }
  for (; i < n; ++i) dst[i] = fp32_to_fp16(src[i]);
}

__attribute__((target("avx,f16c"))) void fp16_to_fp32_row(const std::uint16_t* src, float* dst, std::size_t n) {
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i))));
  for (; i < n; ++i) dst[i] = fp16_to_fp32(src[i]);
}

int nearest_int(float v) { return static_cast<int>(std::lrintf(v)); }

void dequantize_q8_0(const BlockQ8_0* b, float* y, std::size_t nb) {
  for (std::size_t i = 0; i < nb; ++i) {
    const float d = fp16_to_fp32(b[i].d);
    for (int j = 0; j < kQK8_0; ++j) y[i * kQK8_0 + j] = d * static_cast<float>(b[i].qs[j]);
  }
}

void dequantize_q4_0(const BlockQ4_0* b, float* y, std::size_t nb) {
  for (std::size_t i = 0; i < nb; ++i) {
    const float d = fp16_to_fp32(b[i].d);
    float* out = y + i * kQK4_0;
    for (int j = 0; j < kQK4_0 / 2; ++j) {
      out[j] = d * static_cast<float>((b[i].qs[j] & 0x0f) - 8);
      out[j + kQK4_0 / 2] = d * static_cast<float>((b[i].qs[j] >> 4) - 8);
    }
  }
}

// ggml's reference Q8_0: symmetric, scale = max|x| / 127.
void quantize_q8_0(const float* x, BlockQ8_0* b, std::size_t nb) {
  for (std::size_t i = 0; i < nb; ++i, x += kQK8_0) {
    float amax = 0.0f;
    for (int j = 0; j < kQK8_0; ++j) amax = std::max(amax, std::fabs(x[j]));
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    b[i].d = fp32_to_fp16(d);
    for (int j = 0; j < kQK8_0; ++j) b[i].qs[j] = static_cast<std::int8_t>(std::round(x[j] * id));
  }
}

// The first of x's n values with the largest magnitude, with its sign.
float largest_magnitude(const float* x, int n) {
  float amax = 0.0f, max = 0.0f;
  for (int j = 0; j < n; ++j) {
    if (amax < std::fabs(x[j])) {
      amax = std::fabs(x[j]);
      max = x[j];
    }
  }
  return max;
}

// ggml's reference Q4_0: the largest-magnitude value maps to -8, so its sign picks the scale's sign
// and the asymmetric range [-8, 7] is used in full.
void quantize_q4_0(const float* x, BlockQ4_0* b, std::size_t nb) {
  for (std::size_t i = 0; i < nb; ++i, x += kQK4_0) {
    const float d = largest_magnitude(x, kQK4_0) / -8.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    b[i].d = fp32_to_fp16(d);
    for (int j = 0; j < kQK4_0 / 2; ++j) {
      const int x0 = std::min(15, static_cast<int>(static_cast<std::int8_t>(x[j] * id + 8.5f)));
      const int x1 = std::min(15, static_cast<int>(static_cast<std::int8_t>(x[j + kQK4_0 / 2] * id + 8.5f)));
      b[i].qs[j] = static_cast<std::uint8_t>(x0 | (x1 << 4));
    }
  }
}

// A Q5_0 block's 32 levels, -16..15: the low 4 bits from qs, the fifth from qh.
void q5_0_levels(const BlockQ5_0& b, std::int8_t* levels) {
  std::uint32_t qh;
  std::memcpy(&qh, b.qh, sizeof qh);
  for (int j = 0; j < kQK5_0 / 2; ++j) {
    levels[j] = static_cast<std::int8_t>(((b.qs[j] & 0x0f) | (((qh >> j) & 1) << 4)) - 16);
    levels[j + kQK5_0 / 2] = static_cast<std::int8_t>(((b.qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4)) - 16);
  }
}

// Q3_K: 16-element sub-blocks, each with its own scale.
void dequantize_q3_k(const BlockQ3_K* b, float* y, std::size_t nb) {
  for (std::size_t i = 0; i < nb; ++i, y += kQK_K) {
    const float d = fp16_to_fp32(b[i].d);
    std::int8_t levels[kQK_K];
    q3_k_levels(b[i], levels);
    for (int j = 0; j < 16; ++j) {
      const float dl = d * static_cast<float>(q3k_scale(j, b[i].scales));
      for (int l = 0; l < 16; ++l) y[16 * j + l] = dl * static_cast<float>(levels[16 * j + l]);
    }
  }
}

void dequantize_q5_0(const BlockQ5_0* b, float* y, std::size_t nb) {
  for (std::size_t i = 0; i < nb; ++i) {
    const float d = fp16_to_fp32(b[i].d);
    std::int8_t levels[kQK5_0];
    q5_0_levels(b[i], levels);
    for (int j = 0; j < kQK5_0; ++j) y[i * kQK5_0 + j] = d * static_cast<float>(levels[j]);
  }
}

// ggml's reference Q5_0: Q4_0's with levels -16..15 (the largest-magnitude value maps to -16).
void quantize_q5_0(const float* x, BlockQ5_0* b, std::size_t nb) {
  for (std::size_t i = 0; i < nb; ++i, x += kQK5_0) {
    const float d = largest_magnitude(x, kQK5_0) / -16.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    b[i].d = fp32_to_fp16(d);
    std::uint32_t qh = 0;
    for (int j = 0; j < kQK5_0 / 2; ++j) {
      const int x0 = std::min(31, static_cast<int>(static_cast<std::int8_t>(x[j] * id + 16.5f)));
      const int x1 = std::min(31, static_cast<int>(static_cast<std::int8_t>(x[j + kQK5_0 / 2] * id + 16.5f)));
      b[i].qs[j] = static_cast<std::uint8_t>((x0 & 0x0f) | ((x1 & 0x0f) << 4));
      qh |= static_cast<std::uint32_t>((x0 >> 4) & 1) << j;
      qh |= static_cast<std::uint32_t>((x1 >> 4) & 1) << (j + 16);
    }
    std::memcpy(b[i].qh, &qh, sizeof qh);
  }
}

// Squared error of x ~= s * l + m with l the nearest level in 0..nmax.
float fit_error(const float* x, int n, int nmax, float s, float m) {
  float err = 0;
  for (int i = 0; i < n; ++i) {
    const int l = s > 0 ? std::clamp(nearest_int((x[i] - m) / s), 0, nmax) : 0;
    const float diff = s * l + m - x[i];
    err += diff * diff;
  }
  return err;
}

// Fits x ~= scale * q - min (q in 0..nmax) for one sub-block: the min/max fit, then 21 scales
// around it (+-1 level over the range, as llama.cpp's make_qkx2_quants tries), each with the
// least-squares refit of scale and min for the rounding it produces; the least squared error wins.
// (Trying only +-0.4 levels left our Q4_K 1.1% above llama.cpp's RMS error on the code model;
// with the wider search it is 0.2% below.)
void fit_scale_min(const float* x, int n, int nmax, float& scale, float& min) {
  float lo = x[0], hi = x[0];
  for (int i = 1; i < n; ++i) {
    lo = std::min(lo, x[i]);
    hi = std::max(hi, x[i]);
  }
  lo = std::min(lo, 0.0f);
  if (hi <= lo) {
    scale = 0.0f;
    min = -lo;
    return;
  }
  scale = (hi - lo) / nmax;
  min = -lo;
  float best_err = fit_error(x, n, nmax, scale, lo);
  for (int step = -10; step <= 10; ++step) {
    const float iscale = (nmax + 0.1f * step) / (hi - lo);
    if (iscale <= 0) continue;
    // Least-squares refit of scale and min for the rounding this iscale produces.
    float sum_l = 0, sum_l2 = 0, sum_xl = 0, sum_x = 0;
    for (int i = 0; i < n; ++i) {
      const int l = std::clamp(nearest_int(iscale * (x[i] - lo)), 0, nmax);
      sum_l += l;
      sum_l2 += static_cast<float>(l) * l;
      sum_xl += x[i] * l;
      sum_x += x[i];
    }
    const float det = n * sum_l2 - sum_l * sum_l;
    if (det <= 0) continue;
    float s = (n * sum_xl - sum_x * sum_l) / det;
    float m = (sum_l2 * sum_x - sum_l * sum_xl) / det;  // offset, x ~= s*l + m
    if (m > 0) {  // the format needs min <= 0 offset; fall back to a pure-scale fit
      m = 0;
      s = sum_l2 > 0 ? sum_xl / sum_l2 : 0;
    }
    if (s <= 0) continue;
    const float err = fit_error(x, n, nmax, s, m);
    if (err < best_err) {
      best_err = err;
      scale = s;
      min = -m;
    }
  }
}

// One super-block of Q4_K or Q5_K (levels 0..nmax, 15 or 31): per 32-element sub-block a fitted
// scale and min, both stored as 6 bits of the super-block's fp16 d and dmin, and each element's level
// against the scales as they will be decoded. Writes d, dmin and the packed scales; levels to L.
template <typename Block>
void quantize_k_super_block(const float* x, int nmax, Block& b, std::uint8_t* L) {
  float scales[8], mins[8];
  float max_scale = 0, max_min = 0;
  for (int j = 0; j < 8; ++j) {
    fit_scale_min(x + 32 * j, 32, nmax, scales[j], mins[j]);
    max_scale = std::max(max_scale, scales[j]);
    max_min = std::max(max_min, mins[j]);
  }
  const float inv_scale = max_scale > 0 ? 63.0f / max_scale : 0.0f;
  const float inv_min = max_min > 0 ? 63.0f / max_min : 0.0f;
  std::uint8_t ls[8], lm[8];
  for (int j = 0; j < 8; ++j) {
    ls[j] = static_cast<std::uint8_t>(std::min(63, nearest_int(inv_scale * scales[j])));
    lm[j] = static_cast<std::uint8_t>(std::min(63, nearest_int(inv_min * mins[j])));
  }
  std::memset(b.scales, 0, sizeof b.scales);
  for (int j = 0; j < 8; ++j) {
    if (j < 4) {
      b.scales[j] = ls[j];
      b.scales[j + 4] = lm[j];
    } else {
      b.scales[j + 4] = static_cast<std::uint8_t>((ls[j] & 0xf) | ((lm[j] & 0xf) << 4));
      b.scales[j - 4] |= static_cast<std::uint8_t>((ls[j] >> 4) << 6);
      b.scales[j] |= static_cast<std::uint8_t>((lm[j] >> 4) << 6);
    }
  }
  b.d = fp32_to_fp16(max_scale / 63.0f);
  b.dmin = fp32_to_fp16(max_min / 63.0f);
  const float d = fp16_to_fp32(b.d), dmin = fp16_to_fp32(b.dmin);
  for (int j = 0; j < 8; ++j) {
    std::uint8_t sc, m;
    q4k_scale_min(j, b.scales, sc, m);
    const float ds = d * sc, dm = dmin * m;
    for (int l = 0; l < 32; ++l) {
      const int q = ds != 0 ? nearest_int((x[32 * j + l] + dm) / ds) : 0;
      L[32 * j + l] = static_cast<std::uint8_t>(std::clamp(q, 0, nmax));
    }
  }
}

void quantize_q4_k(const float* x, BlockQ4_K* b, std::size_t nb) {
  for (std::size_t i = 0; i < nb; ++i, x += kQK_K) {
    std::uint8_t L[kQK_K];
    quantize_k_super_block(x, 15, b[i], L);
    std::uint8_t* q = b[i].qs;
    for (int j = 0; j < kQK_K; j += 64) {
      for (int l = 0; l < 32; ++l) q[l] = static_cast<std::uint8_t>(L[j + l] | (L[j + l + 32] << 4));
      q += 32;
    }
  }
}

void quantize_q5_k(const float* x, BlockQ5_K* b, std::size_t nb) {
  for (std::size_t i = 0; i < nb; ++i, x += kQK_K) {
    std::uint8_t L[kQK_K];
    quantize_k_super_block(x, 31, b[i], L);
    std::memset(b[i].qh, 0, sizeof b[i].qh);
    std::uint8_t* q = b[i].qs;
    for (int j = 0, bit = 0; j < kQK_K; j += 64, bit += 2) {
      for (int l = 0; l < 32; ++l) {
        q[l] = static_cast<std::uint8_t>((L[j + l] & 0xf) | ((L[j + l + 32] & 0xf) << 4));
        b[i].qh[l] |= static_cast<std::uint8_t>(((L[j + l] >> 4) << bit) | ((L[j + l + 32] >> 4) << (bit + 1)));
      }
      q += 32;
    }
  }
}

// A Q6_K block's quants from its 256 levels stored + 32 (0..63): element 128n + 32k + l's low 4 bits
// in ql[64n + l] (k = 0, 2: low and high nibble) or ql[64n + 32 + l] (k = 1, 3), its high 2 bits in
// bits 2k of qh[32n + l].
void pack_q6_k_levels(const std::uint8_t* L, BlockQ6_K& b) {
  std::uint8_t* ql = b.ql;
  std::uint8_t* qh = b.qh;
  for (int j = 0; j < kQK_K; j += 128) {
    for (int l = 0; l < 32; ++l) {
      const int q1 = L[j + l] & 0xf, q2 = L[j + l + 32] & 0xf, q3 = L[j + l + 64] & 0xf, q4 = L[j + l + 96] & 0xf;
      ql[l] = static_cast<std::uint8_t>(q1 | (q3 << 4));
      ql[l + 32] = static_cast<std::uint8_t>(q2 | (q4 << 4));
      qh[l] = static_cast<std::uint8_t>((L[j + l] >> 4) | ((L[j + l + 32] >> 4) << 2) | ((L[j + l + 64] >> 4) << 4) |
                                        ((L[j + l + 96] >> 4) << 6));
    }
    ql += 64;
    qh += 32;
  }
}

// A 16-element sub-block's scale for levels -nmax..nmax-1: the scale that maps the largest-magnitude
// value to -nmax (as Q4_0 does with -8), and 18 scales around it (+-0.9 levels), each refitted by
// least squares for the levels it rounds to; the one with the least squared error wins (llama.cpp's
// make_qx_quants search, unweighted). For Q6_K the plain -32 mapping alone left our RMS error 5.6%
// above llama.cpp's and the mean KL divergence 12% above on the code model.
float fit_symmetric_scale(const float* xb, int nmax) {
  const float mx = largest_magnitude(xb, 16);
  float scale = mx / -static_cast<float>(nmax);
  // Maximising (sum x l)^2 / sum l^2 over the candidates minimises sum (x - s l)^2 with the best
  // s = sum x l / sum l^2 for each candidate's levels.
  float best = 0;
  for (int step = -9; step <= 9 && mx != 0; ++step) {
    const float iscale = -(static_cast<float>(nmax) + 0.1f * step) / mx;
    float sum_xl = 0, sum_l2 = 0;
    for (int l = 0; l < 16; ++l) {
      const int q = std::clamp(nearest_int(iscale * xb[l]), -nmax, nmax - 1);
      sum_xl += xb[l] * q;
      sum_l2 += static_cast<float>(q) * q;
    }
    if (sum_l2 > 0 && sum_xl * sum_xl > best * sum_l2) {
      best = sum_xl * sum_xl / sum_l2;
      scale = sum_xl / sum_l2;
    }
  }
  return scale;
}

// The 16 sub-block scales of a super-block (fit_symmetric_scale); returns the one of the largest
// magnitude, with its sign (0 where every scale is 0).
float fit_sub_block_scales(const float* x, int nmax, float (&scales)[16]) {
  float max_scale = 0, max_abs_scale = 0;
  for (int ib = 0; ib < 16; ++ib) {
    scales[ib] = fit_symmetric_scale(x + 16 * ib, nmax);
    if (std::fabs(scales[ib]) > max_abs_scale) {
      max_abs_scale = std::fabs(scales[ib]);
      max_scale = scales[ib];
    }
  }
  return max_scale;
}

// Q3_K: the sub-block scales as 6 bits of the fp16 d (the largest-magnitude one at -32), each
// element's level -4..3 against its scale as it will be decoded.
void quantize_q3_k(const float* x, BlockQ3_K* b, std::size_t nb) {
  for (std::size_t i = 0; i < nb; ++i, x += kQK_K) {
    float scales[16];
    const float max_scale = fit_sub_block_scales(x, 4, scales);
    std::memset(&b[i], 0, sizeof b[i]);
    if (max_scale == 0) continue;  // d = 0 decodes every element to 0
    const float iscale = -32.0f / max_scale;
    b[i].d = fp32_to_fp16(1.0f / iscale);
    for (int j = 0; j < 16; ++j) {
      const int stored = std::clamp(nearest_int(iscale * scales[j]), -32, 31) + 32;
      b[i].scales[j % 8] |= static_cast<std::uint8_t>((stored & 0xf) << (j < 8 ? 0 : 4));
      b[i].scales[8 + j % 4] |= static_cast<std::uint8_t>((stored >> 4) << (2 * (j / 4)));
    }
    const float d = fp16_to_fp32(b[i].d);
    for (int j = 0; j < 16; ++j) {
      const float ds = d * static_cast<float>(q3k_scale(j, b[i].scales));
      for (int l = 0; l < 16; ++l) {
        const int e = 16 * j + l;  // element 128h + 32c + m
        const int level = ds != 0 ? std::clamp(nearest_int(x[e] / ds), -4, 3) + 4 : 4;
        const int h = e / 128, c = e % 128 / 32, m = e % 32;
        b[i].qs[32 * h + m] |= static_cast<std::uint8_t>((level & 3) << (2 * c));
        if (level > 3) b[i].hmask[m] |= static_cast<std::uint8_t>(1 << (4 * h + c));
      }
    }
  }
}

void quantize_q6_k(const float* x, BlockQ6_K* b, std::size_t nb) {
  for (std::size_t i = 0; i < nb; ++i, x += kQK_K) {
    float scales[16];
    const float max_scale = fit_sub_block_scales(x, 32, scales);
    std::memset(&b[i], 0, sizeof b[i]);
    if (max_scale == 0) continue;  // d = 0 decodes every element to 0
    const float iscale = -128.0f / max_scale;
    b[i].d = fp32_to_fp16(1.0f / iscale);
    for (int ib = 0; ib < 16; ++ib) b[i].scales[ib] = static_cast<std::int8_t>(std::min(127, nearest_int(iscale * scales[ib])));
    std::uint8_t L[kQK_K];
    const float d = fp16_to_fp32(b[i].d);
    for (int ib = 0; ib < 16; ++ib) {
      const float ds = d * b[i].scales[ib];
      for (int l = 0; l < 16; ++l) {
        const int q = ds != 0 ? nearest_int(x[16 * ib + l] / ds) : 0;
        L[16 * ib + l] = static_cast<std::uint8_t>(std::clamp(q, -32, 31) + 32);
      }
    }
    pack_q6_k_levels(L, b[i]);
  }
}

// The index of the IQ4 level nearest to v: how many of the midpoints between neighbouring levels
// (kIQ4Levels ascend) v reaches. Compares without branches, which the compiler vectorizes over a
// block's values; a binary search mispredicted about half its branches and made IQ4_XS 3.6x slower
// to quantize than Q4_K.
constexpr auto kIQ4Midpoints = [] {
  std::array<float, 15> mid{};
  for (int k = 0; k < 15; ++k) mid[k] = 0.5f * static_cast<float>(kIQ4Levels[k] + kIQ4Levels[k + 1]);
  return mid;
}();
int nearest_iq4_index(float v) {
  int index = 0;
  for (const float mid : kIQ4Midpoints) index += v >= mid;
  return index;
}

// 32 values' level indices against the scale ds, packed as IQ4_NL's (element j low nibble of
// qs[j], j + 16 high).
void pack_iq4_indices(const float* x, float ds, std::uint8_t* qs) {
  const float ids = ds != 0 ? 1.0f / ds : 0.0f;
  for (int j = 0; j < 16; ++j) {
    qs[j] = static_cast<std::uint8_t>(nearest_iq4_index(x[j] * ids) | (nearest_iq4_index(x[j + 16] * ids) << 4));
  }
}

// The scale of 32 values against the IQ4 levels that least-squares fits them best of the
// candidates tried: the largest-magnitude value mapped to a level at or near either end of the
// table (the levels are asymmetric, -127..113), each candidate's indices then refitted with
// s = sum x v / sum v^2, which maximising (sum x v)^2 / sum v^2 picks; the winner refitted on its
// own indices until that stops helping.
float fit_iq4_scale(const float* x) {
  const float mx = largest_magnitude(x, 32);
  if (mx == 0) return 0;
  float best = 0, scale = mx / kIQ4Levels[0];
  const auto try_scale = [&](float s) {
    const float is = 1.0f / s;
    float sum_xv = 0, sum_v2 = 0;
    for (int j = 0; j < 32; ++j) {
      const float v = kIQ4Levels[nearest_iq4_index(x[j] * is)];
      sum_xv += x[j] * v;
      sum_v2 += v * v;
    }
    if (sum_v2 > 0 && sum_xv * sum_xv > best * sum_v2) {
      best = sum_xv * sum_xv / sum_v2;
      scale = sum_xv / sum_v2;
      return true;
    }
    return false;
  };
  for (int step = -7; step <= 7; ++step) {
    try_scale(mx / static_cast<float>(kIQ4Levels[0] + step));
    try_scale(mx / static_cast<float>(kIQ4Levels[15] + step));
  }
  for (int round = 0; round < 4; ++round) {
    if (!try_scale(scale)) break;
  }
  return scale;
}

void quantize_iq4_nl(const float* x, BlockIQ4_NL* b, std::size_t nb) {
  for (std::size_t i = 0; i < nb; ++i, x += kQK4_NL) {
    b[i].d = fp32_to_fp16(fit_iq4_scale(x));
    pack_iq4_indices(x, fp16_to_fp32(b[i].d), b[i].qs);
  }
}

// IQ4_XS: the eight sub-block scales as 6 bits of the fp16 d (the largest-magnitude one at -32),
// each element's index against its scale as it will be decoded.
void quantize_iq4_xs(const float* x, BlockIQ4_XS* b, std::size_t nb) {
  for (std::size_t i = 0; i < nb; ++i, x += kQK_K) {
    float scales[8];
    for (int j = 0; j < 8; ++j) scales[j] = fit_iq4_scale(x + 32 * j);
    const float max_scale = largest_magnitude(scales, 8);
    std::memset(&b[i], 0, sizeof b[i]);
    if (max_scale == 0) continue;  // d = 0 decodes every element to 0
    b[i].d = fp32_to_fp16(max_scale / -32.0f);
    const float d = fp16_to_fp32(b[i].d);
    if (d == 0) continue;  // below fp16's range: the block decodes to 0
    for (int j = 0; j < 8; ++j) {
      const int stored = std::clamp(nearest_int(scales[j] / d), -32, 31) + 32;
      b[i].scales_l[j / 2] |= static_cast<std::uint8_t>((stored & 0xf) << (4 * (j % 2)));
      b[i].scales_h |= static_cast<std::uint16_t>((stored >> 4) << (2 * j));
      pack_iq4_indices(x + 32 * j, d * static_cast<float>(stored - 32), b[i].qs + 16 * j);
    }
  }
}

void check_row(DType type, std::size_t n) {
  const DTypeInfo& info = dtype_info(type);
  if (n % info.block_size != 0) {
    throw Error("row of " + std::to_string(n) + " elements is not a multiple of the " + std::string(info.name) +
                " block size " + std::to_string(info.block_size));
  }
}

}  // namespace

void dequantize_row(DType type, const void* src, float* dst, std::size_t n) {
  check_row(type, n);
  switch (type) {
    case DType::F32: std::memcpy(dst, src, n * sizeof(float)); return;
    case DType::F16: {
      const auto* h = static_cast<const std::uint16_t*>(src);
      if (has_f16c()) {
        fp16_to_fp32_row(h, dst, n);
        return;
      }
      for (std::size_t i = 0; i < n; ++i) dst[i] = fp16_to_fp32(h[i]);
      return;
    }
    case DType::BF16: {
      const auto* h = static_cast<const std::uint16_t*>(src);
      for (std::size_t i = 0; i < n; ++i) dst[i] = bf16_to_fp32(h[i]);
      return;
    }
    case DType::Q8_0: dequantize_q8_0(static_cast<const BlockQ8_0*>(src), dst, n / kQK8_0); return;
    case DType::Q4_0: dequantize_q4_0(static_cast<const BlockQ4_0*>(src), dst, n / kQK4_0); return;
    case DType::Q5_0: dequantize_q5_0(static_cast<const BlockQ5_0*>(src), dst, n / kQK5_0); return;
    case DType::Q3_K: dequantize_q3_k(static_cast<const BlockQ3_K*>(src), dst, n / kQK_K); return;
    case DType::Q4_K: dequantize_q4_k(static_cast<const BlockQ4_K*>(src), dst, n / kQK_K); return;
    case DType::Q5_K: dequantize_q5_k(static_cast<const BlockQ5_K*>(src), dst, n / kQK_K); return;
    case DType::Q6_K: dequantize_q6_k(static_cast<const BlockQ6_K*>(src), dst, n / kQK_K); return;
    case DType::IQ4_NL: dequantize_iq4_nl(static_cast<const BlockIQ4_NL*>(src), dst, n / kQK4_NL); return;
    case DType::IQ4_XS: dequantize_iq4_xs(static_cast<const BlockIQ4_XS*>(src), dst, n / kQK_K); return;
    default:
      throw Error("unsupported tensor type " + std::string(dtype_name(type)) + "; supported: " + supported_dtype_list());
  }
}

void q5_0_to_q8_0(const void* src, void* dst, std::size_t n) {
  check_row(DType::Q5_0, n);
  const auto* in = static_cast<const BlockQ5_0*>(src);
  auto* out = static_cast<BlockQ8_0*>(dst);
  for (std::size_t i = 0; i < n / kQK5_0; ++i) {
    out[i].d = in[i].d;
    q5_0_levels(in[i], out[i].qs);
  }
}

void q3_k_to_q6_k(const void* src, void* dst, std::size_t n) {
  check_row(DType::Q3_K, n);
  const auto* in = static_cast<const BlockQ3_K*>(src);
  auto* out = static_cast<BlockQ6_K*>(dst);
  for (std::size_t i = 0; i < n / kQK_K; ++i) {
    out[i].d = in[i].d;
    for (int j = 0; j < 16; ++j) out[i].scales[j] = static_cast<std::int8_t>(q3k_scale(j, in[i].scales));
    std::int8_t levels[kQK_K];
    q3_k_levels(in[i], levels);
    std::uint8_t stored[kQK_K];
    for (int e = 0; e < kQK_K; ++e) stored[e] = static_cast<std::uint8_t>(levels[e] + 32);
    pack_q6_k_levels(stored, out[i]);
  }
}

void iq4_nl_to_q8_0(const void* src, void* dst, std::size_t n) {
  check_row(DType::IQ4_NL, n);
  const auto* in = static_cast<const BlockIQ4_NL*>(src);
  auto* out = static_cast<BlockQ8_0*>(dst);
  for (std::size_t i = 0; i < n / kQK4_NL; ++i) {
    out[i].d = in[i].d;
    for (int j = 0; j < kQK4_NL / 2; ++j) {
      out[i].qs[j] = kIQ4Levels[in[i].qs[j] & 0xf];
      out[i].qs[j + kQK4_NL / 2] = kIQ4Levels[in[i].qs[j] >> 4];
    }
  }
}

bool can_quantize_to(DType type) {
  switch (type) {
    case DType::F32: case DType::F16: case DType::BF16: case DType::Q8_0: case DType::Q4_0: case DType::Q5_0:
    case DType::Q3_K: case DType::Q4_K: case DType::Q5_K: case DType::Q6_K: case DType::IQ4_NL: case DType::IQ4_XS:
      return true;
    default:
      return false;
  }
}

void quantize_row(DType type, const float* src, void* dst, std::size_t n) {
  check_row(type, n);
  switch (type) {
    case DType::F32: std::memcpy(dst, src, n * sizeof(float)); return;
    case DType::F16: {
      auto* h = static_cast<std::uint16_t*>(dst);
      if (has_f16c()) {
        fp32_to_fp16_row(src, h, n);
        return;
      }
      for (std::size_t i = 0; i < n; ++i) h[i] = fp32_to_fp16(src[i]);
      return;
    }
    case DType::BF16: {
      auto* h = static_cast<std::uint16_t*>(dst);
      for (std::size_t i = 0; i < n; ++i) h[i] = fp32_to_bf16(src[i]);
      return;
    }
    case DType::Q8_0: quantize_q8_0(src, static_cast<BlockQ8_0*>(dst), n / kQK8_0); return;
    case DType::Q4_0: quantize_q4_0(src, static_cast<BlockQ4_0*>(dst), n / kQK4_0); return;
    case DType::Q5_0: quantize_q5_0(src, static_cast<BlockQ5_0*>(dst), n / kQK5_0); return;
    case DType::Q3_K: quantize_q3_k(src, static_cast<BlockQ3_K*>(dst), n / kQK_K); return;
    case DType::Q4_K: quantize_q4_k(src, static_cast<BlockQ4_K*>(dst), n / kQK_K); return;
    case DType::Q5_K: quantize_q5_k(src, static_cast<BlockQ5_K*>(dst), n / kQK_K); return;
    case DType::Q6_K: quantize_q6_k(src, static_cast<BlockQ6_K*>(dst), n / kQK_K); return;
    case DType::IQ4_NL: quantize_iq4_nl(src, static_cast<BlockIQ4_NL*>(dst), n / kQK4_NL); return;
    case DType::IQ4_XS: quantize_iq4_xs(src, static_cast<BlockIQ4_XS*>(dst), n / kQK_K); return;
    default:
      throw Error("cannot quantize to " + std::string(dtype_name(type)) + "; supported: " + supported_dtype_list());
  }
}

}  // namespace promptly
