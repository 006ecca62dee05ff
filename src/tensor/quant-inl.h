// Reference dequantization of the K-quant formats as inline functions, so that each kernel
// translation unit compiles them with its own instruction set (the compiler vectorizes them there).
// No include guard on purpose: each includer gets its own copy inside its own namespace.
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "tensor/dtype.h"
#include "util/fp16.h"

namespace promptly {
namespace {

// Sub-block j's 6-bit scale and min from the 12 packed bytes of a Q4_K block.
inline void q4k_scale_min(int j, const std::uint8_t* q, std::uint8_t& sc, std::uint8_t& m) {
  if (j < 4) {
    sc = q[j] & 63;
    m = q[j + 4] & 63;
  } else {
    sc = static_cast<std::uint8_t>((q[j + 4] & 0xf) | ((q[j - 4] >> 6) << 4));
    m = static_cast<std::uint8_t>((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
  }
}

// Q4_K, or Q5_K: the same scales, mins and nibbles, and Q5_K's fifth bit of each quant from qh
// (bits 2c and 2c + 1 of qh[l] for the 64-element chunk c).
template <typename Block>
inline void dequantize_k(const Block* b, float* y, std::size_t nb) {
  constexpr bool kQ5 = std::is_same_v<Block, BlockQ5_K>;
  for (std::size_t i = 0; i < nb; ++i) {
    const float d = fp16_to_fp32(b[i].d);
    const float dmin = fp16_to_fp32(b[i].dmin);
    const std::uint8_t* q = b[i].qs;
    for (int j = 0, is = 0; j < kQK_K; j += 64, is += 2) {
      std::uint8_t sc, m;
      q4k_scale_min(is, b[i].scales, sc, m);
      const float d1 = d * sc, m1 = dmin * m;
      q4k_scale_min(is + 1, b[i].scales, sc, m);
      const float d2 = d * sc, m2 = dmin * m;
      const auto fifth_bit = [&](int l, int bit) -> int {
        if constexpr (kQ5) {
          return ((b[i].qh[l] >> bit) & 1) << 4;
        } else {
          return 0;
        }
      };
      for (int l = 0; l < 32; ++l) *y++ = d1 * static_cast<float>((q[l] & 0xf) | fifth_bit(l, is)) - m1;
      for (int l = 0; l < 32; ++l) *y++ = d2 * static_cast<float>((q[l] >> 4) | fifth_bit(l, is + 1)) - m2;
      q += 32;
    }
  }
}
inline void dequantize_q4_k(const BlockQ4_K* b, float* y, std::size_t nb) { dequantize_k(b, y, nb); }
inline void dequantize_q5_k(const BlockQ5_K* b, float* y, std::size_t nb) { dequantize_k(b, y, nb); }

inline void dequantize_q6_k(const BlockQ6_K* b, float* y, std::size_t nb) {
  for (std::size_t i = 0; i < nb; ++i) {
    const float d = fp16_to_fp32(b[i].d);
    const std::uint8_t* ql = b[i].ql;
    const std::uint8_t* qh = b[i].qh;
    const std::int8_t* sc = b[i].scales;
    for (int n = 0; n < kQK_K; n += 128) {
      for (int l = 0; l < 32; ++l) {
        const int is = l / 16;
        const int q1 = ((ql[l] & 0xf) | (((qh[l] >> 0) & 3) << 4)) - 32;
        const int q2 = ((ql[l + 32] & 0xf) | (((qh[l] >> 2) & 3) << 4)) - 32;
        const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
        const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
        y[l] = d * sc[is + 0] * static_cast<float>(q1);
        y[l + 32] = d * sc[is + 2] * static_cast<float>(q2);
        y[l + 64] = d * sc[is + 4] * static_cast<float>(q3);
        y[l + 96] = d * sc[is + 6] * static_cast<float>(q4);
      }
      y += 128;
      ql += 64;
      qh += 32;
      sc += 8;
    }
  }
}

// Sub-block j's (0..15) signed scale from a Q3_K block's 12 packed bytes: the low 4 bits in the
// low (j < 8) or high nibble of byte j % 8, the high 2 bits in bits 2 (j / 4) of byte 8 + j % 4;
// stored with 32 added.
inline int q3k_scale(int j, const std::uint8_t* s) {
  const int low = j < 8 ? s[j] & 0xf : s[j - 8] >> 4;
  const int high = (s[8 + j % 4] >> (2 * (j / 4))) & 3;
  return (low | (high << 4)) - 32;
}

// A Q3_K block's 256 levels, -4..3: element 128h + 32c + m's low 2 bits in bits 2c of qs[32h + m],
// its third bit (clear: minus 4) in bit 4h + c of hmask[m].
inline void q3_k_levels(const BlockQ3_K& b, std::int8_t* levels) {
  for (int e = 0; e < kQK_K; ++e) {
    const int h = e / 128, c = e % 128 / 32, m = e % 32;
    levels[e] = static_cast<std::int8_t>(((b.qs[32 * h + m] >> (2 * c)) & 3) - ((b.hmask[m] >> (4 * h + c)) & 1 ? 0 : 4));
  }
}

// Sub-block j's (0..7) signed scale, -32..31, from an IQ4_XS block.
inline int iq4_xs_scale(const BlockIQ4_XS& b, int j) {
  const int low = (b.scales_l[j / 2] >> (4 * (j % 2))) & 0xf;
  const int high = (b.scales_h >> (2 * j)) & 3;
  return (low | (high << 4)) - 32;
}

// 32 elements of IQ4_NL-packed indices (element j low nibble of qs[j], j + 16 high) times ds.
inline void dequantize_iq4_32(const std::uint8_t* qs, float ds, float* y) {
  for (int j = 0; j < 16; ++j) {
    y[j] = ds * static_cast<float>(kIQ4Levels[qs[j] & 0xf]);
    y[j + 16] = ds * static_cast<float>(kIQ4Levels[qs[j] >> 4]);
  }
}

inline void dequantize_iq4_nl(const BlockIQ4_NL* b, float* y, std::size_t nb) {
  for (std::size_t i = 0; i < nb; ++i) dequantize_iq4_32(b[i].qs, fp16_to_fp32(b[i].d), y + i * kQK4_NL);
}

inline void dequantize_iq4_xs(const BlockIQ4_XS* b, float* y, std::size_t nb) {
  for (std::size_t i = 0; i < nb; ++i) {
    const float d = fp16_to_fp32(b[i].d);
    for (int j = 0; j < kQK_K / 32; ++j) {
      dequantize_iq4_32(b[i].qs + 16 * j, d * static_cast<float>(iq4_xs_scale(b[i], j)), y + i * kQK_K + 32 * j);
    }
  }
}

}  // namespace
}  // namespace promptly
