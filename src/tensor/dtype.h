#pragma once
// ggml tensor types as stored in GGUF: ids, block sizes and bytes per block. The table covers every
// type GGUF files may carry so that any file can be bounds-checked and described; `is_supported`
// says which ones Promptly can compute with.
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace promptly {

enum class DType : std::uint32_t {
  F32 = 0, F16 = 1, Q4_0 = 2, Q4_1 = 3, Q5_0 = 6, Q5_1 = 7, Q8_0 = 8, Q8_1 = 9,
  Q2_K = 10, Q3_K = 11, Q4_K = 12, Q5_K = 13, Q6_K = 14, Q8_K = 15,
  IQ2_XXS = 16, IQ2_XS = 17, IQ3_XXS = 18, IQ1_S = 19, IQ4_NL = 20, IQ3_S = 21, IQ2_S = 22,
  IQ4_XS = 23, I8 = 24, I16 = 25, I32 = 26, I64 = 27, F64 = 28, IQ1_M = 29, BF16 = 30,
  TQ1_0 = 34, TQ2_0 = 35, MXFP4 = 39,
};

struct DTypeInfo {
  std::string_view name;
  std::uint32_t block_size;   // elements per block
  std::uint32_t block_bytes;  // bytes per block
  bool supported;             // Promptly can dequantize and compute with it
};

// nullopt for ids no known ggml version uses.
std::optional<DTypeInfo> dtype_info(std::uint32_t id);
const DTypeInfo& dtype_info(DType t);
inline std::string_view dtype_name(DType t) { return dtype_info(t).name; }
std::optional<DType> dtype_from_name(std::string_view name);
// "F32, F16, BF16, Q8_0, Q4_0, Q4_K, Q6_K" for error messages.
std::string supported_dtype_list();

// Bytes of one row of `n` elements; n must be a multiple of the block size.
inline std::size_t row_bytes(DType t, std::size_t n) {
  const DTypeInfo& info = dtype_info(t);
  return n / info.block_size * info.block_bytes;
}

// Block layouts, exactly as ggml stores them (little-endian, no padding).
constexpr int kQK8_0 = 32;
struct BlockQ8_0 {
  std::uint16_t d;  // fp16 scale
  std::int8_t qs[kQK8_0];
};
static_assert(sizeof(BlockQ8_0) == 34);

constexpr int kQK4_0 = 32;
struct BlockQ4_0 {
  std::uint16_t d;               // fp16 scale
  std::uint8_t qs[kQK4_0 / 2];   // element j in the low nibble of qs[j], element j+16 in the high
};
static_assert(sizeof(BlockQ4_0) == 18);

constexpr int kQK5_0 = 32;
struct BlockQ5_0 {
  std::uint16_t d;               // fp16 scale
  std::uint8_t qh[4];            // element j's fifth bit in bit j (little-endian 32 bits)
  std::uint8_t qs[kQK5_0 / 2];   // low 4 bits: element j in the low nibble of qs[j], element j+16 in the high
};
static_assert(sizeof(BlockQ5_0) == 22);

constexpr int kQK_K = 256;
constexpr int kKScaleBytes = 12;
struct BlockQ3_K {
  std::uint8_t hmask[kQK_K / 8];       // the levels' third bits: element 32c + l's in bit c of hmask[l]
  std::uint8_t qs[kQK_K / 4];          // their low 2 bits: element 128h + 32c + l's in bits 2c of qs[32h + l]
  std::uint8_t scales[kKScaleBytes];   // 16 sub-block scales, 6 bits each (stored + 32; see q3k_scale)
  std::uint16_t d;                     // fp16 super-block scale
};
static_assert(sizeof(BlockQ3_K) == 110);

struct BlockQ4_K {
  std::uint16_t d;                     // fp16 super-block scale for the sub-block scales
  std::uint16_t dmin;                  // fp16 super-block scale for the sub-block mins
  std::uint8_t scales[kKScaleBytes];   // 8 scales and 8 mins, 6 bits each
  std::uint8_t qs[kQK_K / 2];          // 4-bit quants
};
static_assert(sizeof(BlockQ4_K) == 144);

struct BlockQ5_K {
  std::uint16_t d;                     // fp16 super-block scale for the sub-block scales
  std::uint16_t dmin;                  // fp16 super-block scale for the sub-block mins
  std::uint8_t scales[kKScaleBytes];   // 8 scales and 8 mins, 6 bits each, packed as Q4_K's
  std::uint8_t qh[kQK_K / 8];          // the quants' fifth bits: element 64c + l's in bit 2c of qh[l], 64c + 32 + l's in bit 2c + 1
  std::uint8_t qs[kQK_K / 2];          // their low 4 bits, packed as Q4_K's quants
};
static_assert(sizeof(BlockQ5_K) == 176);

struct BlockQ6_K {
  std::uint8_t ql[kQK_K / 2];      // low 4 bits
  std::uint8_t qh[kQK_K / 4];      // high 2 bits
  std::int8_t scales[kQK_K / 16];  // 8-bit sub-block scales
  std::uint16_t d;                 // fp16 super-block scale
};
static_assert(sizeof(BlockQ6_K) == 210);

// The non-linear 4-bit formats: each 4-bit index selects one of 16 int8 levels (kIQ4Levels, ggml's
// kvalues_iq4nl), denser near zero where most weights are.
constexpr std::int8_t kIQ4Levels[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};

constexpr int kQK4_NL = 32;
struct BlockIQ4_NL {
  std::uint16_t d;                // fp16 scale
  std::uint8_t qs[kQK4_NL / 2];   // level indices: element j in the low nibble of qs[j], element j+16 in the high
};
static_assert(sizeof(BlockIQ4_NL) == 18);

struct BlockIQ4_XS {
  std::uint16_t d;                  // fp16 super-block scale
  std::uint16_t scales_h;           // sub-block j's scale's high 2 bits in bits 2j
  std::uint8_t scales_l[kQK_K / 64];  // its low 4 bits in the low (even j) or high nibble of scales_l[j / 2]; stored + 32
  std::uint8_t qs[kQK_K / 2];       // per 32-element sub-block, 16 bytes packed as an IQ4_NL block's
};
static_assert(sizeof(BlockIQ4_XS) == 136);

}  // namespace promptly
