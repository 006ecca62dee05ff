#pragma once
// The file's weight formats, decoded 32 elements at a time, as functions both the GPU kernels and
// the host compile: the kernels read GGUF blocks exactly as the file stores them (uploaded byte for
// byte), and the host tests check these decoders against tensor/quant.h's reference on random
// blocks, so a format's arithmetic is tested on machines without a GPU.
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#include <cuda_fp16.h>
#define PROMPTLY_HD __host__ __device__ __forceinline__
#else
#define PROMPTLY_HD inline
#endif

namespace promptly::backend::cuda {

// The formats the device kernels decode (a subset of DType, numbered apart so that this header
// needs nothing from the host-only code).
enum class WeightFormat : int { F32, F16, BF16, Q8_0, Q4_0, Q4_K, Q5_K, Q6_K, IQ4_XS, Q3_K };

PROMPTLY_HD std::uint16_t load_u16(const std::uint8_t* p) { return static_cast<std::uint16_t>(p[0] | (p[1] << 8)); }

PROMPTLY_HD float half_to_float(std::uint16_t h) {
#if defined(__CUDA_ARCH__)
  return __half2float(__ushort_as_half(h));
#else
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000) << 16;
  std::uint32_t exp = (h >> 10) & 0x1f, mant = h & 0x3ff, bits;
  if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (mant << 13);
  } else if (exp != 0) {
    bits = sign | ((exp + 112) << 23) | (mant << 13);
  } else if (mant == 0) {
    bits = sign;
  } else {  // subnormal: normalise
    exp = 113;
    while (!(mant & 0x400)) mant <<= 1, --exp;
    bits = sign | (exp << 23) | ((mant & 0x3ff) << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
#endif
}

PROMPTLY_HD float bf16_to_float(std::uint16_t h) {
  const std::uint32_t bits = static_cast<std::uint32_t>(h) << 16;
#if defined(__CUDA_ARCH__)
  return __uint_as_float(bits);
#else
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
#endif
}

// Elements and bytes of one block of each format; a row is whole blocks.
struct FormatSize {
  int block_elems;
  int block_bytes;
};
PROMPTLY_HD FormatSize format_size(WeightFormat f) {
  switch (f) {
    case WeightFormat::F32: return {32, 128};
    case WeightFormat::F16: return {32, 64};
    case WeightFormat::BF16: return {32, 64};
    case WeightFormat::Q8_0: return {32, 34};
    case WeightFormat::Q4_0: return {32, 18};
    case WeightFormat::Q4_K: return {256, 144};
    case WeightFormat::Q5_K: return {256, 176};
    case WeightFormat::Q6_K: return {256, 210};
    case WeightFormat::IQ4_XS: return {256, 136};
    case WeightFormat::Q3_K: return {256, 110};
  }
  return {32, 0};
}

// Q4_K's packed 6-bit scale and min of sub-block j (0..7), from its 12 packed bytes: byte(k) gives
// byte k (from memory, or from registers where a lane must not index an array dynamically).
template <typename ScaleByte>
PROMPTLY_HD void q4k_scale_min_of(int j, const ScaleByte& byte, int& sc, int& m) {
  if (j < 4) {
    sc = byte(j) & 63;
    m = byte(j + 4) & 63;
  } else {
    sc = (byte(j + 4) & 0xf) | ((byte(j - 4) >> 6) << 4);
    m = (byte(j + 4) >> 4) | ((byte(j) >> 6) << 4);
  }
}
struct BytesAt {
  const std::uint8_t* p;
  PROMPTLY_HD int operator()(int k) const { return p[k]; }
};
PROMPTLY_HD void q4k_scale_min(int j, const std::uint8_t* q, int& sc, int& m) { q4k_scale_min_of(j, BytesAt{q}, sc, m); }

// The 16 IQ4 levels (tensor/dtype.h's kIQ4Levels), four to a word: byte k of kIQ4LevelsFrom4w is
// level 4w + k. Scalars, which device code can read as immediates (an array would be host memory).
constexpr std::uint32_t kIQ4LevelsFrom0 = 0xbfad9881u, kIQ4LevelsFrom4 = 0xf6eaddcfu, kIQ4LevelsFrom8 = 0x26190d01u,
                        kIQ4LevelsFrom12 = 0x71594535u;
// Level i (0..15): the word chosen by comparisons, not an array a lane would index dynamically.
PROMPTLY_HD int iq4_level(int i) {
  const std::uint32_t word = i < 8 ? (i < 4 ? kIQ4LevelsFrom0 : kIQ4LevelsFrom4) : (i < 12 ? kIQ4LevelsFrom8 : kIQ4LevelsFrom12);
  return static_cast<std::int8_t>((word >> (8 * (i % 4))) & 0xffu);
}

// Q3_K sub-block j's (0..15) scale, -32..31, from its 12 packed bytes: the low 4 bits in the low
// (j < 8) or high nibble of byte j % 8, the high 2 bits in bits 2 (j / 4) of byte 8 + j % 4.
PROMPTLY_HD int q3k_scale_of(int j, const std::uint8_t* s) {
  const int low = j < 8 ? s[j] & 0xf : s[j - 8] >> 4;
  return (low | (((s[8 + j % 4] >> (2 * (j / 4))) & 3) << 4)) - 32;
}

// IQ4_XS sub-block j's (0..7) scale, -32..31, from its block's bytes 2..7.
PROMPTLY_HD int iq4_xs_scale_of(const std::uint8_t* block, int j) {
  return (((block[4 + j / 2] >> (4 * (j % 2))) & 0xf) | (((load_u16(block + 2) >> (2 * j)) & 3) << 4)) - 32;
}

// Elements [32 * chunk, 32 * chunk + 32) of the row starting at `row`, as floats.
template <WeightFormat F>
PROMPTLY_HD void decode_chunk(const std::uint8_t* row, int chunk, float* out) {
  if constexpr (F == WeightFormat::F32) {
    const std::uint8_t* p = row + chunk * 128;
    for (int l = 0; l < 32; ++l) std::memcpy(&out[l], p + 4 * l, 4);
  } else if constexpr (F == WeightFormat::F16) {
    const std::uint8_t* p = row + chunk * 64;
    for (int l = 0; l < 32; ++l) out[l] = half_to_float(load_u16(p + 2 * l));
  } else if constexpr (F == WeightFormat::BF16) {
    const std::uint8_t* p = row + chunk * 64;
    for (int l = 0; l < 32; ++l) out[l] = bf16_to_float(load_u16(p + 2 * l));
  } else if constexpr (F == WeightFormat::Q8_0) {
    const std::uint8_t* b = row + chunk * 34;
    const float d = half_to_float(load_u16(b));
    for (int l = 0; l < 32; ++l) out[l] = d * static_cast<float>(static_cast<std::int8_t>(b[2 + l]));
  } else if constexpr (F == WeightFormat::Q4_0) {
    const std::uint8_t* b = row + chunk * 18;
    const float d = half_to_float(load_u16(b));
    for (int l = 0; l < 16; ++l) {
      out[l] = d * static_cast<float>((b[2 + l] & 0xf) - 8);
      out[l + 16] = d * static_cast<float>((b[2 + l] >> 4) - 8);
    }
  } else if constexpr (F == WeightFormat::Q4_K || F == WeightFormat::Q5_K) {
    // Q5_K is Q4_K's super-block with 32 bytes of fifth bits between the scales and the nibbles:
    // bit j of byte l is element l of sub-block j's.
    constexpr bool kFifthBit = F == WeightFormat::Q5_K;
    const std::uint8_t* b = row + (chunk / 8) * (kFifthBit ? 176 : 144);
    const int j = chunk % 8;
    const float d = half_to_float(load_u16(b)), dmin = half_to_float(load_u16(b + 2));
    int sc, m;
    q4k_scale_min(j, b + 4, sc, m);
    const float scale = d * static_cast<float>(sc), min = dmin * static_cast<float>(m);
    const std::uint8_t* q = b + (kFifthBit ? 48 : 16) + 32 * (j / 2);
    const std::uint8_t* fifth = b + 16;
    const int shift = (j % 2) * 4;
    for (int l = 0; l < 32; ++l) {
      const int level = ((q[l] >> shift) & 0xf) | (kFifthBit ? ((fifth[l] >> j) & 1) << 4 : 0);
      out[l] = scale * static_cast<float>(level) - min;
    }
  } else if constexpr (F == WeightFormat::Q6_K) {
    const std::uint8_t* b = row + (chunk / 8) * 210;
    const int j = chunk % 8, half = j / 4, g = j % 4;
    const std::uint8_t* ql = b + 64 * half + (g & 1) * 32;
    const std::uint8_t* qh = b + 128 + 32 * half;
    const std::int8_t* sc = reinterpret_cast<const std::int8_t*>(b + 192) + 8 * half + 2 * g;
    const float d = half_to_float(load_u16(b + 208));
    const int low_shift = (g / 2) * 4, high_shift = 2 * g;
    for (int l = 0; l < 32; ++l) {
      const int q = (((ql[l] >> low_shift) & 0xf) | (((qh[l] >> high_shift) & 3) << 4)) - 32;
      out[l] = d * static_cast<float>(sc[l / 16]) * static_cast<float>(q);
    }
  } else if constexpr (F == WeightFormat::Q3_K) {
    // hmask (32 bytes), qs (64), scales (12), d: element 128h + 32c + l's low 2 bits in bits 2c of
    // qs[32h + l], its third bit (clear: minus 4) in bit 4h + c of hmask[l]; a scale per 16.
    const std::uint8_t* b = row + (chunk / 8) * 110;
    const int j = chunk % 8, h = j / 4, c = j % 4;
    const float d = half_to_float(load_u16(b + 108));
    const float scale0 = d * static_cast<float>(q3k_scale_of(2 * j, b + 96)), scale1 = d * static_cast<float>(q3k_scale_of(2 * j + 1, b + 96));
    for (int l = 0; l < 32; ++l) {
      const int level = ((b[32 + 32 * h + l] >> (2 * c)) & 3) - (((b[l] >> (4 * h + c)) & 1) ? 0 : 4);
      out[l] = (l < 16 ? scale0 : scale1) * static_cast<float>(level);
    }
  } else if constexpr (F == WeightFormat::IQ4_XS) {
    const std::uint8_t* b = row + (chunk / 8) * 136;
    const int j = chunk % 8;
    const float scale = half_to_float(load_u16(b)) * static_cast<float>(iq4_xs_scale_of(b, j));
    const std::uint8_t* q = b + 8 + 16 * j;  // element l in the low nibble of q[l], l + 16 in the high
    for (int l = 0; l < 16; ++l) {
      out[l] = scale * static_cast<float>(iq4_level(q[l] & 0xf));
      out[l + 16] = scale * static_cast<float>(iq4_level(q[l] >> 4));
    }
  }
}

// The same for a format known only at run time (host tests, the embedding lookup).
PROMPTLY_HD void decode_chunk(WeightFormat f, const std::uint8_t* row, int chunk, float* out) {
  switch (f) {
    case WeightFormat::F32: decode_chunk<WeightFormat::F32>(row, chunk, out); break;
    case WeightFormat::F16: decode_chunk<WeightFormat::F16>(row, chunk, out); break;
    case WeightFormat::BF16: decode_chunk<WeightFormat::BF16>(row, chunk, out); break;
    case WeightFormat::Q8_0: decode_chunk<WeightFormat::Q8_0>(row, chunk, out); break;
    case WeightFormat::Q4_0: decode_chunk<WeightFormat::Q4_0>(row, chunk, out); break;
    case WeightFormat::Q4_K: decode_chunk<WeightFormat::Q4_K>(row, chunk, out); break;
    case WeightFormat::Q5_K: decode_chunk<WeightFormat::Q5_K>(row, chunk, out); break;
    case WeightFormat::Q6_K: decode_chunk<WeightFormat::Q6_K>(row, chunk, out); break;
    case WeightFormat::IQ4_XS: decode_chunk<WeightFormat::IQ4_XS>(row, chunk, out); break;
    case WeightFormat::Q3_K: decode_chunk<WeightFormat::Q3_K>(row, chunk, out); break;
  }
}

// Element k of a row of a float format (F32, F16, BF16: rows of any length, not only whole
// 32-element chunks); 0 for the block formats, which never need it.
PROMPTLY_HD float decode_element(WeightFormat f, const std::uint8_t* row, int k) {
  switch (f) {
    case WeightFormat::F32: {
      float v;
      std::memcpy(&v, row + 4 * k, 4);
      return v;
    }
    case WeightFormat::F16: return half_to_float(load_u16(row + 2 * k));
    case WeightFormat::BF16: return bf16_to_float(load_u16(row + 2 * k));
    default: return 0.0f;
  }
}
PROMPTLY_HD bool is_float_format(WeightFormat f) { return f == WeightFormat::F32 || f == WeightFormat::F16 || f == WeightFormat::BF16; }

// Bytes of a row of n elements (n a multiple of the block; any n for the float formats).
PROMPTLY_HD std::size_t format_row_bytes(WeightFormat f, std::size_t n) {
  if (f == WeightFormat::F32) return 4 * n;
  if (f == WeightFormat::F16 || f == WeightFormat::BF16) return 2 * n;
  const FormatSize s = format_size(f);
  return n / static_cast<std::size_t>(s.block_elems) * static_cast<std::size_t>(s.block_bytes);
}

}  // namespace promptly::backend::cuda
