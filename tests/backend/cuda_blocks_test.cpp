// The GPU kernels' format decoders (backend/cuda/blocks.h) run here on the host: every format's
// 32-element chunks must equal tensor/quant.h's reference dequantization, so a decoding mistake is
// caught on machines without a GPU.
#include "backend/cuda/blocks.h"

#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "tensor/quant.h"

namespace promptly::backend::cuda {
namespace {

struct Case {
  DType dtype;
  WeightFormat format;
};

class BlocksTest : public ::testing::TestWithParam<Case> {};

TEST_P(BlocksTest, ChunksEqualTheReferenceDequantization) {
  const auto [dtype, format] = GetParam();
  std::mt19937 rng(1234 + static_cast<int>(format));
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (const std::size_t n : {std::size_t{256}, std::size_t{768}, std::size_t{2048}}) {
    std::vector<float> x(n);
    for (float& v : x) v = normal(rng) * (1.0f + static_cast<float>(rng() % 8));  // scales vary block to block
    std::vector<std::uint8_t> row(row_bytes(dtype, n));
    quantize_row(dtype, x.data(), row.data(), n);
    std::vector<float> reference(n);
    dequantize_row(dtype, row.data(), reference.data(), n);
    ASSERT_EQ(format_row_bytes(format, n), row.size());
    float chunk[32];
    for (std::size_t c = 0; c < n / 32; ++c) {
      decode_chunk(format, row.data(), static_cast<int>(c), chunk);
      for (int l = 0; l < 32; ++l) {
        ASSERT_EQ(chunk[l], reference[c * 32 + l]) << dtype_name(dtype) << " n " << n << " chunk " << c << " element " << l;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Formats, BlocksTest,
                         ::testing::Values(Case{DType::F32, WeightFormat::F32}, Case{DType::F16, WeightFormat::F16},
                                           Case{DType::BF16, WeightFormat::BF16}, Case{DType::Q8_0, WeightFormat::Q8_0},
                                           Case{DType::Q4_0, WeightFormat::Q4_0}, Case{DType::Q4_K, WeightFormat::Q4_K},
                                           Case{DType::Q5_K, WeightFormat::Q5_K}, Case{DType::Q6_K, WeightFormat::Q6_K},
                                           Case{DType::IQ4_XS, WeightFormat::IQ4_XS}, Case{DType::Q3_K, WeightFormat::Q3_K}),
                         [](const auto& info) { return std::string(dtype_name(info.param.dtype)); });

TEST(Blocks, IQ4LevelsAreTheTensorModules) {
  for (int i = 0; i < 16; ++i) EXPECT_EQ(iq4_level(i), kIQ4Levels[i]) << i;
}

TEST(Blocks, HalfConversionCoversSubnormalsInfinitiesAndSigns) {
  // Every 16-bit pattern but NaNs converts as the reference does.
  for (std::uint32_t h = 0; h < 0x10000; ++h) {
    if ((h & 0x7c00) == 0x7c00 && (h & 0x3ff)) continue;
    const std::uint16_t bits = static_cast<std::uint16_t>(h);
    float reference;
    dequantize_row(DType::F16, &bits, &reference, 1);
    ASSERT_EQ(half_to_float(bits), reference) << std::hex << h;
  }
}

}  // namespace
}  // namespace promptly::backend::cuda
