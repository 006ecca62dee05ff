#include "kernels/ops.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/matmul.h"
#include "tensor/quant.h"

namespace promptly::kernels {
namespace {

TEST(Ops, RmsNorm) {
  const float x[4] = {1, -2, 3, -4};
  const float w[4] = {1, 1, 2, 0.5f};
  float out[4];
  rmsnorm(x, w, 4, 0.0f, out);
  const float rms = std::sqrt((1 + 4 + 9 + 16) / 4.0f);
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(out[i], x[i] / rms * w[i], 1e-6);
}

TEST(Ops, SiluMul) {
  float g[2] = {0.0f, 2.0f};
  const float u[2] = {3.0f, 0.5f};
  silu_mul(g, u, 2);
  EXPECT_NEAR(g[0], 0.0f, 1e-7);
  EXPECT_NEAR(g[1], 2.0f / (1.0f + std::exp(-2.0f)) * 0.5f, 1e-6);
}

TEST(Ops, RopeNormalAndNeoxPairings) {
  const float inv_freq[2] = {1.0f, 0.5f};
  const auto rope = [&](float* x, std::size_t n_rot, const float* freq, float position, bool neox) {
    float cos[2], sin[2];
    rope_angles(n_rot, freq, position, cos, sin);
    kernels::rope(x, n_rot, cos, sin, neox);
  };
  float a[4] = {1, 0, 1, 0};
  rope(a, 4, inv_freq, 1.0f, false);  // pairs (0,1) by 1 rad and (2,3) by 0.5 rad
  EXPECT_NEAR(a[0], std::cos(1.0f), 1e-6);
  EXPECT_NEAR(a[1], std::sin(1.0f), 1e-6);
  EXPECT_NEAR(a[2], std::cos(0.5f), 1e-6);
  EXPECT_NEAR(a[3], std::sin(0.5f), 1e-6);
  float b[4] = {1, 1, 0, 0};
  rope(b, 4, inv_freq, 1.0f, true);  // pairs (0,2) by 1 rad and (1,3) by 0.5 rad
  EXPECT_NEAR(b[0], std::cos(1.0f), 1e-6);
  EXPECT_NEAR(b[2], std::sin(1.0f), 1e-6);
  EXPECT_NEAR(b[1], std::cos(0.5f), 1e-6);
  EXPECT_NEAR(b[3], std::sin(0.5f), 1e-6);
  float c[6] = {1, 2, 3, 4, 5, 6};  // partial rotary: the last two values are untouched
  rope(c, 4, inv_freq, 0.0f, false);
  EXPECT_EQ(c[4], 5.0f);
  EXPECT_EQ(c[5], 6.0f);
  EXPECT_NEAR(c[0], 1.0f, 1e-7);
}

// The matmul against every supported weight type must equal a plain double-precision product with
// the dequantized weights, for awkward shapes and several thread counts.
TEST(Matmul, MatchesDequantizedReference) {
  std::mt19937 rng(3);
  std::normal_distribution<float> dist;
  for (DType type : {DType::F32, DType::F16, DType::BF16, DType::Q8_0, DType::Q4_0, DType::Q4_K, DType::Q6_K}) {
    const std::size_t cols = dtype_info(type).block_size == 256 ? 512 : 96;
    for (std::size_t rows : {1u, 17u, 70u}) {
      for (std::size_t n_tokens : {1u, 3u, 9u}) {
        std::vector<float> wf(rows * cols), x(n_tokens * cols);
        for (float& v : wf) v = dist(rng);
        for (float& v : x) v = dist(rng);
        std::vector<std::uint8_t> wq(rows * row_bytes(type, cols));
        for (std::size_t r = 0; r < rows; ++r) quantize_row(type, &wf[r * cols], &wq[r * row_bytes(type, cols)], cols);
        std::vector<float> deq(rows * cols);
        for (std::size_t r = 0; r < rows; ++r) dequantize_row(type, &wq[r * row_bytes(type, cols)], &deq[r * cols], cols);
        for (int threads : {1, 2}) {
          ThreadPool pool(threads);
          std::vector<float> y(n_tokens * rows);
          matmul({type, wq.data(), rows, cols}, x.data(), n_tokens, y.data(), pool);
          // Q8_0/Q4_0 weights run on int8 activations (as ggml does): each activation moves by at most
          // half its block's step amax/127, which bounds the difference per output exactly.
          const bool int8_path = type == DType::Q8_0 || type == DType::Q4_0;
          for (std::size_t t = 0; t < n_tokens; ++t) {
            for (std::size_t r = 0; r < rows; ++r) {
              double ref = 0, bound = 1e-4 * std::sqrt(static_cast<double>(cols));
              for (std::size_t b = 0; b < cols / 32; ++b) {
                double amax = 0, wsum = 0;
                for (std::size_t c = 32 * b; c < 32 * b + 32; ++c) {
                  amax = std::max(amax, std::fabs(static_cast<double>(x[t * cols + c])));
                  wsum += std::fabs(static_cast<double>(deq[r * cols + c]));
                }
                if (int8_path) bound += 0.5 * amax / 127.0 * wsum * 1.01;
              }
              for (std::size_t c = 0; c < cols; ++c) ref += static_cast<double>(deq[r * cols + c]) * x[t * cols + c];
              ASSERT_NEAR(y[t * rows + r], ref, bound) << dtype_name(type) << " rows " << rows << " t " << t << " r " << r;
            }
          }
        }
      }
    }
  }
}

// One parallel job over several matrices' rows gives each matrix exactly what its own call gives,
// whatever the mix of types and layouts and however the threads split the rows.
TEST(Matmul, FusedMatchesSeparateCalls) {
  std::mt19937 rng(11);
  std::normal_distribution<float> dist;
  const std::size_t cols = 1024;
  struct Spec {
    DType type;
    std::size_t rows;
    bool repack;
  };
  // The second set has a matrix whose rows are not whole 16-row tiles (the fallback).
  for (const std::vector<Spec>& specs : {std::vector<Spec>{{DType::Q4_0, 96, true}, {DType::Q8_0, 32, false}, {DType::F16, 48, false}},
                                         std::vector<Spec>{{DType::Q8_0, 64, true}, {DType::F32, 20, false}}}) {
    std::vector<std::vector<std::uint8_t>> storage;
    std::vector<WeightMatrix> ws;
    for (const Spec& spec : specs) {
      std::vector<float> wf(spec.rows * cols);
      for (float& v : wf) v = dist(rng);
      const std::size_t stride = row_bytes(spec.type, cols);
      std::vector<std::uint8_t> plain(spec.rows * stride);
      for (std::size_t r = 0; r < spec.rows; ++r) quantize_row(spec.type, &wf[r * cols], &plain[r * stride], cols);
      WeightMatrix w{spec.type, plain.data(), spec.rows, cols};
      if (spec.repack) {
        std::vector<std::uint8_t> packed(repacked_bytes(w));
        w.layout = repack_x16(w, packed.data());
        storage.push_back(std::move(packed));
      } else {
        storage.push_back(std::move(plain));
      }
      w.data = storage.back().data();
      ws.push_back(w);
    }
    for (std::size_t n_tokens : {1u, 5u, 130u}) {
      std::vector<float> x(n_tokens * cols);
      for (float& v : x) v = dist(rng);
      for (int threads : {1, 2}) {
        ThreadPool pool(threads);
        std::vector<std::vector<float>> separate, fused;
        std::vector<const WeightMatrix*> w_ptrs;
        std::vector<float*> y_ptrs;
        for (const WeightMatrix& w : ws) {
          separate.emplace_back(n_tokens * w.rows);
          matmul(w, x.data(), n_tokens, separate.back().data(), pool);
          fused.emplace_back(n_tokens * w.rows, -1.0f);
        }
        for (std::size_t i = 0; i < ws.size(); ++i) {
          w_ptrs.push_back(&ws[i]);
          y_ptrs.push_back(fused[i].data());
        }
        Activations a(x.data(), n_tokens, cols);
        matmul_fused(w_ptrs, a, y_ptrs, pool);
        for (std::size_t i = 0; i < ws.size(); ++i) {
          EXPECT_EQ(separate[i], fused[i]) << "matrix " << i << " (" << dtype_name(ws[i].type) << "), " << n_tokens << " tokens, "
                                           << threads << " threads";
        }
      }
    }
  }
}

// An input quantized into its ActivationBlocks alone leaves the other forms' pointers null, and a
// later call that wants every form quantizes it again, to the same blocks.
TEST(Matmul, ActivationBlocksOnlyThenEveryForm) {
  std::mt19937 rng(13);
  std::normal_distribution<float> dist;
  const std::size_t n_tokens = 5, k = 96;
  std::vector<float> x(n_tokens * k);
  for (float& v : x) v = dist(rng);
  ThreadPool pool(2);
  Activations a(x.data(), n_tokens, k);
  a.quantize(pool, true);
  QuantizedRows r = a.rows(k / 32);
  EXPECT_EQ(r.blocks, nullptr);
  EXPECT_EQ(r.sums, nullptr);
  EXPECT_EQ(r.half_sums, nullptr);
  std::vector<ActivationBlock> only(r.act, r.act + r.act_stride * (k / 32));
  a.quantize(pool, true);  // already there: nothing to do
  a.quantize(pool, false);
  r = a.rows(k / 32);
  ASSERT_NE(r.blocks, nullptr);
  ASSERT_NE(r.sums, nullptr);
  ASSERT_NE(r.half_sums, nullptr);
  EXPECT_EQ(0, std::memcmp(only.data(), r.act, only.size() * sizeof(ActivationBlock)));
  Activations b(x.data(), n_tokens, k);
  b.quantize(pool);
  const QuantizedRows want = b.rows(k / 32);
  EXPECT_EQ(0, std::memcmp(want.blocks, r.blocks, n_tokens * (k / 32) * sizeof(BlockQ8_0)));
  EXPECT_EQ(0, std::memcmp(want.half_sums, r.half_sums, 2 * n_tokens * (k / 32) * sizeof(float)));
}

}  // namespace
}  // namespace promptly::kernels
