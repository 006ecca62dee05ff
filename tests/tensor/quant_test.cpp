#include "tensor/quant.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "util/error.h"
#include "util/fp16.h"

namespace promptly {
namespace {

std::vector<float> dequant(DType t, const void* block, std::size_t n) {
  std::vector<float> out(n);
  dequantize_row(t, block, out.data(), n);
  return out;
}

TEST(Dequantize, Q8_0HandBlock) {
  BlockQ8_0 b{};
  b.d = 0x3800;  // 0.5
  for (int j = 0; j < 32; ++j) b.qs[j] = static_cast<std::int8_t>(j - 16);
  const auto y = dequant(DType::Q8_0, &b, 32);
  for (int j = 0; j < 32; ++j) EXPECT_EQ(y[j], 0.5f * (j - 16)) << j;
}

TEST(Dequantize, Q4_0HandBlock) {
  BlockQ4_0 b{};
  b.d = 0x4000;  // 2.0
  for (int j = 0; j < 16; ++j) b.qs[j] = static_cast<std::uint8_t>(j | ((15 - j) << 4));
  const auto y = dequant(DType::Q4_0, &b, 32);
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(y[j], 2.0f * (j - 8)) << j;
    EXPECT_EQ(y[j + 16], 2.0f * ((15 - j) - 8)) << j;
  }
}

// A Q4_K or Q5_K block with d 1, dmin 0.5, sub-block j's scale j + 1 and min j (all < 16, so no
// high bits are needed), and nibbles l % 16 (low) and 15 - l % 16 (high) in each chunk's byte l.
template <typename Block>
Block k_hand_block() {
  Block b{};
  b.d = 0x3c00;
  b.dmin = 0x3800;
  const std::uint8_t scales[12] = {1, 2, 3, 4, 0, 1, 2, 3, 5 | (4 << 4), 6 | (5 << 4), 7 | (6 << 4), 8 | (7 << 4)};
  std::memcpy(b.scales, scales, 12);
  for (int c = 0; c < 4; ++c)
    for (int l = 0; l < 32; ++l) b.qs[32 * c + l] = static_cast<std::uint8_t>((l % 16) | ((15 - l % 16) << 4));
  return b;
}

TEST(Dequantize, Q4_KHandBlockLowScales) {
  const BlockQ4_K b = k_hand_block<BlockQ4_K>();
  const auto y = dequant(DType::Q4_K, &b, 256);
  for (int e = 0; e < 256; ++e) {
    const int c = e / 64, w = e % 64;
    const int sub = w < 32 ? 2 * c : 2 * c + 1;
    const int q = w < 32 ? w % 16 : 15 - (w - 32) % 16;
    EXPECT_EQ(y[e], 1.0f * (sub + 1) * q - 0.5f * sub) << e;
  }
}

TEST(Dequantize, Q4_KHandBlockHighScaleBits) {
  BlockQ4_K b{};
  b.d = 0x3c00;
  b.dmin = 0x3c00;
  std::memset(b.scales, 0xff, 12);  // every 6-bit scale and min is 63
  std::memset(b.qs, 0x3a, sizeof b.qs);  // low nibble 10, high nibble 3
  const auto y = dequant(DType::Q4_K, &b, 256);
  for (int e = 0; e < 256; ++e) EXPECT_EQ(y[e], 63.0f * ((e % 64) < 32 ? 10 : 3) - 63.0f) << e;
}

// Q5_0: element j's fifth bit is bit j of qh (elements 16..31 in bits 16..31), levels -16..15.
TEST(Dequantize, Q5_0HandBlock) {
  BlockQ5_0 b{};
  b.d = 0x4000;  // 2.0
  const std::uint32_t qh = 0xa5f00f3cu;
  std::memcpy(b.qh, &qh, 4);
  for (int j = 0; j < 16; ++j) b.qs[j] = static_cast<std::uint8_t>(j | ((15 - j) << 4));
  const auto y = dequant(DType::Q5_0, &b, 32);
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(y[j], 2.0f * ((j | static_cast<int>(((qh >> j) & 1) << 4)) - 16)) << j;
    EXPECT_EQ(y[j + 16], 2.0f * (((15 - j) | static_cast<int>(((qh >> (j + 16)) & 1) << 4)) - 16)) << j;
  }
}

// Q5_K: Q4_K's scales, mins and nibbles; element 64c + l's fifth bit is bit 2c of qh[l], element
// 64c + 32 + l's bit 2c + 1.
TEST(Dequantize, Q5_KHandBlock) {
  BlockQ5_K b = k_hand_block<BlockQ5_K>();
  for (int l = 0; l < 32; ++l) b.qh[l] = static_cast<std::uint8_t>(l * 37 + 11);
  const auto y = dequant(DType::Q5_K, &b, 256);
  for (int e = 0; e < 256; ++e) {
    const int c = e / 64, w = e % 64, l = w % 32;
    const int sub = w < 32 ? 2 * c : 2 * c + 1;
    const int high = (b.qh[l] >> sub) & 1;
    const int q = (w < 32 ? w % 16 : 15 - (w - 32) % 16) | (high << 4);
    EXPECT_EQ(y[e], 1.0f * (sub + 1) * q - 0.5f * sub) << e;
  }
}

// Q3_K: scale j's low 4 bits in the low (j < 8) or high nibble of byte j % 8, its high 2 bits in
// bits 2 (j / 4) of byte 8 + j % 4, stored + 32; element 128h + 32c + m's low 2 bits in bits 2c of
// qs[32h + m], its third bit (clear: minus 4) in bit 4h + c of hmask[m].
TEST(Dequantize, Q3_KHandBlock) {
  BlockQ3_K b{};
  b.d = 0x3800;  // 0.5
  const std::uint8_t scales[12] = {0x21, 0x21, 0x21, 0x21, 0x21, 0x21, 0x21, 0x21, 0xe4, 0xe4, 0xe4, 0xe4};
  std::memcpy(b.scales, scales, 12);
  const int scale_of[16] = {-31, -31, -31, -31, -15, -15, -15, -15, 2, 2, 2, 2, 18, 18, 18, 18};
  for (int i = 0; i < 64; ++i) b.qs[i] = static_cast<std::uint8_t>(i * 37 + 5);
  for (int m = 0; m < 32; ++m) b.hmask[m] = static_cast<std::uint8_t>(m * 53 + 7);
  const auto y = dequant(DType::Q3_K, &b, 256);
  for (int e = 0; e < 256; ++e) {
    const int h = e / 128, c = e % 128 / 32, m = e % 32;
    const int level = ((b.qs[32 * h + m] >> (2 * c)) & 3) - ((b.hmask[m] >> (4 * h + c)) & 1 ? 0 : 4);
    EXPECT_EQ(y[e], 0.5f * static_cast<float>(scale_of[e / 16]) * static_cast<float>(level)) << e;
  }
}

// IQ4_NL: each nibble indexes the 16 levels (-127 .. 113); element j in the low nibble of qs[j],
// element j + 16 in the high.
TEST(Dequantize, IQ4_NLHandBlock) {
  BlockIQ4_NL b{};
  b.d = 0x3800;  // 0.5
  for (int j = 0; j < 16; ++j) b.qs[j] = static_cast<std::uint8_t>(j | ((15 - j) << 4));
  const auto y = dequant(DType::IQ4_NL, &b, 32);
  const float levels[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(y[j], 0.5f * levels[j]) << j;
    EXPECT_EQ(y[j + 16], 0.5f * levels[15 - j]) << j;
  }
}

// IQ4_XS: sub-block j's scale has its low 4 bits in the low (even j) or high nibble of
// scales_l[j / 2], its high 2 bits in bits 2j of scales_h, stored + 32; each 32-element sub-block's
// 16 bytes of qs are an IQ4_NL block's.
TEST(Dequantize, IQ4_XSHandBlock) {
  BlockIQ4_XS b{};
  b.d = 0x3400;  // 0.25
  const int scale_of[8] = {-32, -1, 0, 31, 5, -20, 17, 1};
  for (int j = 0; j < 8; ++j) {
    const int stored = scale_of[j] + 32;
    b.scales_l[j / 2] |= static_cast<std::uint8_t>((stored & 0xf) << (4 * (j % 2)));
    b.scales_h |= static_cast<std::uint16_t>((stored >> 4) << (2 * j));
  }
  EXPECT_EQ(b.scales_l[0], 0xf0);  // scales -32 (stored 0) and -1 (stored 31 = 0b01'1111)
  EXPECT_EQ(b.scales_h & 0xf, 0x4);
  for (int i = 0; i < 128; ++i) b.qs[i] = static_cast<std::uint8_t>(i * 37 + 11);
  const auto y = dequant(DType::IQ4_XS, &b, 256);
  for (int e = 0; e < 256; ++e) {
    const int sub = e / 32, at = e % 32;
    const std::uint8_t byte = b.qs[16 * sub + at % 16];
    const int index = at < 16 ? byte & 0xf : byte >> 4;
    EXPECT_EQ(y[e], 0.25f * static_cast<float>(scale_of[sub]) * static_cast<float>(kIQ4Levels[index])) << e;
  }
}

TEST(Dequantize, Q6_KHandBlocks) {
  BlockQ6_K b{};
  b.d = 0x3400;  // 0.25
  for (int i = 0; i < 16; ++i) b.scales[i] = static_cast<std::int8_t>(i - 8);
  auto scale_of = [](int e) { return e / 16 - 8; };

  auto y = dequant(DType::Q6_K, &b, 256);  // all bits zero: q = -32
  for (int e = 0; e < 256; ++e) EXPECT_EQ(y[e], 0.25f * scale_of(e) * -32) << e;

  std::memset(b.ql, 0xff, sizeof b.ql);
  std::memset(b.qh, 0xff, sizeof b.qh);  // q = 63 - 32 = 31
  y = dequant(DType::Q6_K, &b, 256);
  for (int e = 0; e < 256; ++e) EXPECT_EQ(y[e], 0.25f * scale_of(e) * 31) << e;

  // ql = 0x21 (low 1, high 2); qh = 0b11'10'01'00 gives the four 32-element quarters of each
  // 128-element half the high bits 0, 1, 2, 3: q = 1-32, (1|16)-32, (2|32)-32, (2|48)-32.
  std::memset(b.ql, 0x21, sizeof b.ql);
  std::memset(b.qh, 0xe4, sizeof b.qh);
  y = dequant(DType::Q6_K, &b, 256);
  const int expected_q[4] = {-31, -15, 2, 18};
  for (int e = 0; e < 256; ++e) EXPECT_EQ(y[e], 0.25f * scale_of(e) * expected_q[(e % 128) / 32]) << e;
}

TEST(Dequantize, HalfTypes) {
  const std::uint16_t f16[2] = {0x3c00, 0xc100};  // 1, -2.5
  auto y = dequant(DType::F16, f16, 2);
  EXPECT_EQ(y[0], 1.0f);
  EXPECT_EQ(y[1], -2.5f);
  const std::uint16_t bf16[2] = {0x3f80, 0xc020};  // 1, -2.5
  y = dequant(DType::BF16, bf16, 2);
  EXPECT_EQ(y[0], 1.0f);
  EXPECT_EQ(y[1], -2.5f);
}

// F16 rows convert with vector instructions where the CPU has them; every finite value, infinity,
// subnormal and tie must come out as the scalar conversion gives it, in both directions.
TEST(Quantize, F16RowsMatchScalarConversion) {
  std::mt19937 rng(5);
  std::vector<float> src;
  for (float v : {0.0f, -0.0f, 1.0f, 65504.0f, 65520.0f, 1e6f, -1e6f, 5.9604645e-08f, 2.9802322e-08f, 1e-9f, 1.0f + 1.0f / 2048,
                  1.0f + 3.0f / 2048, INFINITY, -INFINITY}) {
    src.push_back(v);
  }
  std::uniform_int_distribution<std::uint32_t> bits;
  while (src.size() < 4099) {  // random bit patterns over all exponents, not a multiple of 8
    const float f = std::bit_cast<float>(bits(rng));
    if (!std::isnan(f)) src.push_back(f);
  }
  std::vector<std::uint16_t> h(src.size());
  quantize_row(DType::F16, src.data(), h.data(), src.size());
  for (std::size_t i = 0; i < src.size(); ++i) ASSERT_EQ(h[i], fp32_to_fp16(src[i])) << "value " << src[i];
  std::vector<std::uint16_t> all(1 << 16);
  for (std::size_t i = 0; i < all.size(); ++i) all[i] = static_cast<std::uint16_t>(i);
  std::vector<float> back(all.size());
  dequantize_row(DType::F16, all.data(), back.data(), all.size());
  for (std::size_t i = 0; i < all.size(); ++i) {
    const float want = fp16_to_fp32(all[i]);
    if (std::isnan(want)) {
      ASSERT_TRUE(std::isnan(back[i])) << "bits " << i;
    } else {
      ASSERT_EQ(std::bit_cast<std::uint32_t>(back[i]), std::bit_cast<std::uint32_t>(want)) << "bits " << i;
    }
  }
  const float nan = NAN;
  std::uint16_t h_nan;
  quantize_row(DType::F16, &nan, &h_nan, 1);
  EXPECT_TRUE(std::isnan(fp16_to_fp32(h_nan)));
}

TEST(Quantize, Q8_0MatchesGgmlReference) {
  float x[32];
  for (int j = 0; j < 32; ++j) x[j] = static_cast<float>(j - 16);
  BlockQ8_0 b;
  quantize_row(DType::Q8_0, x, &b, 32);
  EXPECT_EQ(b.d, fp32_to_fp16(16.0f / 127.0f));
  for (int j = 0; j < 32; ++j) EXPECT_EQ(b.qs[j], static_cast<int>(std::round((j - 16) * 127.0f / 16.0f))) << j;
}

TEST(Quantize, Q4_0MatchesGgmlReference) {
  float x[32];
  for (int j = 0; j < 32; ++j) x[j] = static_cast<float>(j) - 8.0f;  // max magnitude is +23 at j = 31
  BlockQ4_0 b;
  quantize_row(DType::Q4_0, x, &b, 32);
  const float d = 23.0f / -8.0f, id = 1.0f / d;
  EXPECT_EQ(b.d, fp32_to_fp16(d));
  for (int j = 0; j < 16; ++j) {
    const int lo = std::min(15, static_cast<int>(static_cast<std::int8_t>(x[j] * id + 8.5f)));
    const int hi = std::min(15, static_cast<int>(static_cast<std::int8_t>(x[j + 16] * id + 8.5f)));
    EXPECT_EQ(b.qs[j], lo | (hi << 4)) << j;
  }
}

// ggml's reference Q5_0: Q4_0's with 32 levels, the largest magnitude at -16.
TEST(Quantize, Q5_0MatchesGgmlReference) {
  float x[32];
  for (int j = 0; j < 32; ++j) x[j] = 0.75f * static_cast<float>(j) - 9.0f;  // max magnitude is +14.25 at j = 31
  BlockQ5_0 b;
  quantize_row(DType::Q5_0, x, &b, 32);
  const float d = 14.25f / -16.0f, id = 1.0f / d;
  EXPECT_EQ(b.d, fp32_to_fp16(d));
  std::uint32_t qh;
  std::memcpy(&qh, b.qh, 4);
  for (int j = 0; j < 16; ++j) {
    const int lo = std::min(31, static_cast<int>(static_cast<std::int8_t>(x[j] * id + 16.5f)));
    const int hi = std::min(31, static_cast<int>(static_cast<std::int8_t>(x[j + 16] * id + 16.5f)));
    EXPECT_EQ(b.qs[j], (lo & 15) | ((hi & 15) << 4)) << j;
    EXPECT_EQ((qh >> j) & 1, static_cast<std::uint32_t>(lo >> 4)) << j;
    EXPECT_EQ((qh >> (j + 16)) & 1, static_cast<std::uint32_t>(hi >> 4)) << j;
  }
}

// Blocks of `from` and their conversion to `to` decode to the same floats, bit for bit.
void expect_same_values(DType from, const void* src, DType to, const void* converted, std::size_t n) {
  const auto want = dequant(from, src, n), got = dequant(to, converted, n);
  for (std::size_t i = 0; i < n; ++i) ASSERT_EQ(std::bit_cast<std::uint32_t>(got[i]), std::bit_cast<std::uint32_t>(want[i])) << i;
}

// Q5_0 loads as Q8_0 (model.cpp): the same values, bit for bit, for every level and fifth bit.
TEST(Quantize, Q5_0BecomesQ8_0Exactly) {
  std::mt19937 rng(3);
  std::vector<BlockQ5_0> q5(64);
  for (BlockQ5_0& b : q5) {
    b.d = fp32_to_fp16(std::uniform_real_distribution<float>(-3.0f, 3.0f)(rng));
    for (std::uint8_t& v : b.qh) v = static_cast<std::uint8_t>(rng());
    for (std::uint8_t& v : b.qs) v = static_cast<std::uint8_t>(rng());
  }
  std::vector<BlockQ8_0> q8(q5.size());
  const std::size_t n = q5.size() * 32;
  q5_0_to_q8_0(q5.data(), q8.data(), n);
  expect_same_values(DType::Q5_0, q5.data(), DType::Q8_0, q8.data(), n);
  EXPECT_THROW(q5_0_to_q8_0(q5.data(), q8.data(), 48), Error);
}

// Q3_K loads as Q6_K (model.cpp): the same values, bit for bit, for every level, third bit and scale.
TEST(Quantize, Q3_KBecomesQ6_KExactly) {
  std::mt19937 rng(4);
  std::vector<BlockQ3_K> q3(64);
  for (BlockQ3_K& b : q3) {
    b.d = fp32_to_fp16(std::uniform_real_distribution<float>(-3.0f, 3.0f)(rng));
    for (std::uint8_t& v : b.hmask) v = static_cast<std::uint8_t>(rng());
    for (std::uint8_t& v : b.qs) v = static_cast<std::uint8_t>(rng());
    for (std::uint8_t& v : b.scales) v = static_cast<std::uint8_t>(rng());
  }
  std::memset(q3[0].scales, 0, sizeof q3[0].scales);  // every scale -32, the most negative
  std::vector<BlockQ6_K> q6(q3.size());
  const std::size_t n = q3.size() * 256;
  q3_k_to_q6_k(q3.data(), q6.data(), n);
  expect_same_values(DType::Q3_K, q3.data(), DType::Q6_K, q6.data(), n);
  EXPECT_THROW(q3_k_to_q6_k(q3.data(), q6.data(), 128), Error);
}

// IQ4_NL loads as Q8_0 (model.cpp): the same values, bit for bit, for every index.
TEST(Quantize, IQ4_NLBecomesQ8_0Exactly) {
  std::mt19937 rng(6);
  std::vector<BlockIQ4_NL> q4(64);
  for (BlockIQ4_NL& b : q4) {
    b.d = fp32_to_fp16(std::uniform_real_distribution<float>(-3.0f, 3.0f)(rng));
    for (std::uint8_t& v : b.qs) v = static_cast<std::uint8_t>(rng());
  }
  std::vector<BlockQ8_0> q8(q4.size());
  const std::size_t n = q4.size() * 32;
  iq4_nl_to_q8_0(q4.data(), q8.data(), n);
  expect_same_values(DType::IQ4_NL, q4.data(), DType::Q8_0, q8.data(), n);
  EXPECT_THROW(iq4_nl_to_q8_0(q4.data(), q8.data(), 48), Error);
}

// Relative RMS error of quantize -> dequantize on Gaussian data, against each format's resolution.
struct RoundTripCase {
  DType type;
  double max_rel_rmse;
};

class RoundTrip : public ::testing::TestWithParam<RoundTripCase> {};

TEST_P(RoundTrip, ErrorWithinFormatResolution) {
  const auto [type, bound] = GetParam();
  std::mt19937 rng(7);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  const std::size_t n = 256 * 37;
  std::vector<float> x(n), y(n);
  for (float& v : x) v = dist(rng);
  x[5] = 9.0f;  // an outlier, as real weights have
  std::vector<std::uint8_t> q(row_bytes(type, n));
  quantize_row(type, x.data(), q.data(), n);
  dequantize_row(type, q.data(), y.data(), n);
  double err = 0, ref = 0;
  for (std::size_t i = 0; i < n; ++i) {
    err += (x[i] - y[i]) * (x[i] - y[i]);
    ref += x[i] * x[i];
  }
  const double rel = std::sqrt(err / ref);
  EXPECT_LT(rel, bound) << dtype_name(type);
  EXPECT_GT(rel, 0.0) << "lossy format reproduced exactly: suspicious";
}

// Bounds: step / sqrt(12) relative to the data's RMS, with the step set by each format's levels
// (Q8_0: 255 levels over +-2.5 sigma, Q4_0: 16, Q5_0: 32, Q3_K: 8 per 16 elements, Q4_K: 16 with a
// fitted min, Q5_K: 32 with a fitted min, Q6_K: 64).
INSTANTIATE_TEST_SUITE_P(Formats, RoundTrip,
                         ::testing::Values(RoundTripCase{DType::F16, 1e-3}, RoundTripCase{DType::BF16, 5e-3},
                                           RoundTripCase{DType::Q8_0, 0.012}, RoundTripCase{DType::Q4_0, 0.13},
                                           RoundTripCase{DType::Q5_0, 0.065}, RoundTripCase{DType::Q3_K, 0.18}, RoundTripCase{DType::Q4_K, 0.11},
                                           RoundTripCase{DType::Q5_K, 0.055}, RoundTripCase{DType::Q6_K, 0.035},
                                           RoundTripCase{DType::IQ4_NL, 0.12}, RoundTripCase{DType::IQ4_XS, 0.12}));

TEST(Quantize, ZeroBlocksStayZero) {
  for (DType t : {DType::Q8_0, DType::Q4_0, DType::Q5_0, DType::Q3_K, DType::Q4_K, DType::Q5_K, DType::Q6_K, DType::IQ4_NL, DType::IQ4_XS}) {
    std::vector<float> x(256, 0.0f), y(256, 1.0f);
    std::vector<std::uint8_t> q(row_bytes(t, 256));
    quantize_row(t, x.data(), q.data(), 256);
    dequantize_row(t, q.data(), y.data(), 256);
    for (float v : y) ASSERT_EQ(v, 0.0f) << dtype_name(t);
  }
}

TEST(Quantize, RejectsPartialBlocksAndUnsupportedTypes) {
  std::vector<float> x(48);
  std::vector<std::uint8_t> q(1024);
  EXPECT_THROW(quantize_row(DType::Q8_0, x.data(), q.data(), 48), Error);
  EXPECT_THROW(quantize_row(DType::Q2_K, x.data(), q.data(), 256), Error);
  try {
    dequantize_row(DType::Q2_K, q.data(), x.data(), 0);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("supported: F32, F16"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace promptly
