// The CUDA backend against the CPU: each kernel on random data of awkward sizes, and whole models'
// greedy output and logits. Every test skips, saying why, where no GPU is usable (CI, and any
// machine without one); tools/gpu-check.sh runs them on a GPU machine.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <future>

#include <algorithm>
#include <bit>
#include <cstdio>
#include <cstdlib>
#include <cfloat>
#include <cmath>
#include <filesystem>
#include <functional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include <unistd.h>

#include "backend/cuda/kernels.cuh"
#include "backend/cuda/sampling.cuh"
#include "backend/device.h"
#include "backend/gpu_stats.h"
#include "convert/quantize.h"
#include "convert/synthetic_model.h"
#include "engine/engine.h"
#include "engine/generate.h"
#include "kv/spool.h"
#include "spec/proposer.h"
#include "tokenizer/tokenizer.h"
#include "model/model.h"
#include "model/moe.h"
#include "sampling/sampler.h"
#include "tensor/quant.h"
#include "util/error.h"
#include "util/fp16.h"
#include "../test_util.h"
#include "../model/split_model.h"

namespace promptly::backend::cuda {
namespace {

#define REQUIRE_GPU()                                                                  \
  do {                                                                                 \
    std::string why;                                                                   \
    if (!device_usable(parse_device("cuda"), why)) GTEST_SKIP() << "no GPU: " << why;  \
  } while (0)

#define CUDA_OK(call) ASSERT_EQ((call), cudaSuccess) << #call << ": " << cudaGetErrorString(cudaGetLastError())

template <typename T>
struct Device {
  T* p = nullptr;
  std::size_t n = 0;
  explicit Device(std::size_t count) : n(count) {
    if (cudaMalloc(&p, std::max<std::size_t>(count, 1) * sizeof(T)) != cudaSuccess) p = nullptr;
  }
  Device(const std::vector<T>& v) : Device(v.size()) { cudaMemcpy(p, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice); }
  ~Device() { cudaFree(p); }
  std::vector<T> read() const {
    std::vector<T> v(n);
    cudaMemcpy(v.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost);
    return v;
  }
};

// A fused launch's counters, every one back to zero for the next launch (kernels.cuh: GatedTail).
void expect_counters_left_zero(const Device<int>& arrivals, const std::string& what) {
  const std::vector<int> left = arrivals.read();
  EXPECT_EQ(std::count(left.begin(), left.end(), 0), static_cast<long>(left.size())) << what << ": counters left set";
}

// The first `blocks` int8 blocks (values, then scales and sums) of two Q8Out buffers, equal.
void expect_same_q8(const Device<std::int8_t>& got_q, const Device<float2>& got_scales, const Device<std::int8_t>& want_q,
                    const Device<float2>& want_scales, std::size_t blocks, const std::string& what) {
  const std::vector<std::int8_t> gq = got_q.read(), wq = want_q.read();
  EXPECT_TRUE(std::equal(gq.begin(), gq.begin() + static_cast<std::ptrdiff_t>(32 * blocks), wq.begin())) << what << ": int8 values";
  const std::vector<float2> got = got_scales.read(), want = want_scales.read();
  for (std::size_t b = 0; b < blocks; ++b) EXPECT_TRUE(got[b].x == want[b].x && got[b].y == want[b].y) << what << " block " << b;
}

double relative_error(const std::vector<float>& got, const std::vector<double>& want) {
  double num = 0, den = 0;
  for (std::size_t i = 0; i < want.size(); ++i) {
    if (!std::isfinite(got[i])) return INFINITY;
    num += (got[i] - want[i]) * (got[i] - want[i]);
    den += want[i] * want[i];
  }
  return std::sqrt(num / std::max(den, 1e-30));
}

struct FormatCase {
  DType dtype;
  WeightFormat format;
  int cols;
};

class GemvTest : public ::testing::TestWithParam<FormatCase> {};

TEST_P(GemvTest, MatchesTheDequantizedProductForEveryTokenCount) {
  REQUIRE_GPU();
  const auto [dtype, format, cols] = GetParam();
  std::mt19937 rng(7);
  std::normal_distribution<float> normal;
  const int rows = 37;  // not a multiple of the warps a block takes
  std::vector<float> w(static_cast<std::size_t>(rows) * cols);
  for (float& v : w) v = normal(rng);
  std::vector<std::uint8_t> packed(row_bytes(dtype, cols) * rows);
  for (int r = 0; r < rows; ++r) quantize_row(dtype, &w[static_cast<std::size_t>(r) * cols], &packed[row_bytes(dtype, cols) * r], cols);
  std::vector<float> dequantized(w.size());
  for (int r = 0; r < rows; ++r) dequantize_row(dtype, &packed[row_bytes(dtype, cols) * r], &dequantized[static_cast<std::size_t>(r) * cols], cols);
  Device<std::uint8_t> dw(packed);
  for (int T = 1; T <= kGemvMaxTokens; ++T) {
    std::vector<float> x(static_cast<std::size_t>(T) * cols);
    for (float& v : x) v = normal(rng);
    Device<float> dx(x), dy(static_cast<std::size_t>(T) * rows);
    CUDA_OK(cudaMemset(dy.p, 0xff, dy.n * sizeof(float)));  // NaN: every output must be written
    gemv(dw.p, format, rows, cols, dx.p, T, dy.p, nullptr);
    CUDA_OK(cudaDeviceSynchronize());
    std::vector<double> want(static_cast<std::size_t>(T) * rows);
    for (int t = 0; t < T; ++t) {
      for (int r = 0; r < rows; ++r) {
        double s = 0;
        for (int k = 0; k < cols; ++k) s += static_cast<double>(dequantized[static_cast<std::size_t>(r) * cols + k]) * x[static_cast<std::size_t>(t) * cols + k];
        want[static_cast<std::size_t>(t) * rows + r] = s;
      }
    }
    EXPECT_LT(relative_error(dy.read(), want), 1e-5) << dtype_name(dtype) << " T " << T;
  }
}

INSTANTIATE_TEST_SUITE_P(Formats, GemvTest,
                         ::testing::Values(FormatCase{DType::F32, WeightFormat::F32, 96}, FormatCase{DType::F16, WeightFormat::F16, 288},
                                           FormatCase{DType::BF16, WeightFormat::BF16, 96}, FormatCase{DType::Q8_0, WeightFormat::Q8_0, 352},
                                           FormatCase{DType::Q4_0, WeightFormat::Q4_0, 160}, FormatCase{DType::Q4_K, WeightFormat::Q4_K, 768},
                                           FormatCase{DType::Q5_K, WeightFormat::Q5_K, 512}, FormatCase{DType::Q6_K, WeightFormat::Q6_K, 512},
                                           FormatCase{DType::IQ4_XS, WeightFormat::IQ4_XS, 768}, FormatCase{DType::Q3_K, WeightFormat::Q3_K, 512},
                                           // float rows that are not whole 32-element chunks (stories260K's FFN is 172 wide)
                                           FormatCase{DType::F32, WeightFormat::F32, 172}, FormatCase{DType::F16, WeightFormat::F16, 37}),
                         [](const auto& info) { return std::string(dtype_name(info.param.dtype)) + "_" + std::to_string(info.param.cols); });

// The integer GEMV (decode's Q4_K, Q5_K, Q6_K, Q3_K, IQ4_XS, Q8_0 and Q4_0 products, and batches past decode's in
// rounds): exact against the product with x quantized the same way on the host (blocks of 32,
// scale max|x| / 127, round to nearest even), and within int8's rounding of the float product.
TEST(CudaKernels, IntegerGemvMatchesTheProductWithXInInt8) {
  REQUIRE_GPU();
  EXPECT_FALSE(gemv_q8_takes(WeightFormat::F16, 256));
  EXPECT_FALSE(gemv_q8_takes(WeightFormat::Q4_K, 288));
  std::mt19937 rng(8);
  std::normal_distribution<float> normal;
  const int rows = 37;
  struct Case {
    DType dtype;
    WeightFormat format;
    std::vector<int> widths;
  };
  for (const Case& c : {Case{DType::Q4_K, WeightFormat::Q4_K, {256, 768, 2304}}, Case{DType::Q5_K, WeightFormat::Q5_K, {256, 768, 2304}},
                        Case{DType::Q6_K, WeightFormat::Q6_K, {256, 768, 2304}}, Case{DType::IQ4_XS, WeightFormat::IQ4_XS, {256, 768, 2304}},
                        Case{DType::Q3_K, WeightFormat::Q3_K, {256, 768, 2304}},
                        Case{DType::Q8_0, WeightFormat::Q8_0, {96, 352, 2304}}, Case{DType::Q4_0, WeightFormat::Q4_0, {96, 352, 2304}}}) {
  const DType dtype = c.dtype;
  const WeightFormat format = c.format;
  for (const int cols : c.widths) {
    ASSERT_TRUE(gemv_q8_takes(format, cols));
    std::vector<float> w(static_cast<std::size_t>(rows) * cols);
    for (float& v : w) v = normal(rng);
    const std::size_t rb = row_bytes(dtype, cols);
    std::vector<std::uint8_t> packed(rb * rows);
    for (int r = 0; r < rows; ++r) quantize_row(dtype, &w[static_cast<std::size_t>(r) * cols], &packed[rb * r], cols);
    std::vector<float> dequantized(w.size());
    for (int r = 0; r < rows; ++r) dequantize_row(dtype, &packed[rb * r], &dequantized[static_cast<std::size_t>(r) * cols], cols);
    Device<std::uint8_t> dw(packed);
    // Every decode batch size, then batches past it (rounds of kGemvMaxTokens, the last one short).
    for (const int T : {1, 2, 3, 4, 5, 6, 7, 8, 9, 16, 21}) {
      std::vector<float> x(static_cast<std::size_t>(T) * cols);
      for (float& v : x) v = normal(rng) * (1.0f + static_cast<float>(rng() % 100));  // blocks of unlike scales
      std::fill(x.begin() + 32, x.begin() + 64, 0.0f);                              // and a block of zeros
      std::vector<float> x_int8(x.size());  // x as the kernel sees it: d * q
      for (std::size_t b = 0; b < x.size() / 32; ++b) {
        float amax = 0.0f;
        for (int l = 0; l < 32; ++l) amax = std::max(amax, std::abs(x[32 * b + l]));
        const float d = amax / 127.0f;
        for (int l = 0; l < 32; ++l) x_int8[32 * b + l] = d > 0.0f ? d * std::nearbyint(x[32 * b + l] / d) : 0.0f;
      }
      Device<float> dx(x), dy(static_cast<std::size_t>(T) * rows);
      Device<std::int8_t> q(x.size());
      Device<float2> scales(x.size() / 32);
      CUDA_OK(cudaMemset(dy.p, 0xff, dy.n * sizeof(float)));  // NaN: every output must be written
      quantize_q8(dx.p, T, cols, q.p, scales.p, nullptr);
      CUDA_OK(cudaDeviceSynchronize());  // x's int8 form complete first, whatever a runtime's default stream orders
      GemvParts parts{};
      parts.n = 1, parts.cols = cols, parts.part[0] = {dw.p, format, rows, dy.p};
      gemv_q8(parts, q.p, scales.p, T, nullptr);
      CUDA_OK(cudaDeviceSynchronize());
      std::vector<double> exact(static_cast<std::size_t>(T) * rows), unquantized(exact.size());
      for (int t = 0; t < T; ++t) {
        for (int r = 0; r < rows; ++r) {
          double s = 0, f = 0;
          for (int k = 0; k < cols; ++k) {
            const double wk = dequantized[static_cast<std::size_t>(r) * cols + k];
            s += wk * x_int8[static_cast<std::size_t>(t) * cols + k];
            f += wk * x[static_cast<std::size_t>(t) * cols + k];
          }
          exact[static_cast<std::size_t>(t) * rows + r] = s;
          unquantized[static_cast<std::size_t>(t) * rows + r] = f;
        }
      }
      const std::vector<float> got = dy.read();
      EXPECT_LT(relative_error(got, exact), 1e-5) << dtype_name(dtype) << " cols " << cols << " T " << T;
      EXPECT_LT(relative_error(got, unquantized), 2e-2) << dtype_name(dtype) << " cols " << cols << " T " << T;
    }
  }
  }
}

// The gate/up launch with the gated activation at its end (GatedTail): gate = act(gate) * up and
// its int8 form, as gemv_q8 then gated_activation compute them (the same arithmetic: equal), for
// SiLU and GELU, every decode batch size, rows in whole groups of 32 (int8 written) and not (floats
// only), twice each (the counters left zero for the next launch).
TEST(CudaKernels, GateUpGemvEndsWithTheGatedActivation) {
  REQUIRE_GPU();
  std::mt19937 rng(12);
  std::normal_distribution<float> normal;
  const int cols = 512;
  for (const int rows : {96, 44}) {
    const std::size_t rb = row_bytes(DType::Q4_K, cols);
    const auto random_matrix = [&] {
      std::vector<float> w(static_cast<std::size_t>(rows) * cols);
      for (float& v : w) v = normal(rng);
      std::vector<std::uint8_t> packed(rb * rows);
      for (int r = 0; r < rows; ++r) quantize_row(DType::Q4_K, &w[static_cast<std::size_t>(r) * cols], &packed[rb * r], cols);
      return packed;
    };
    Device<std::uint8_t> gate_w(random_matrix()), up_w(random_matrix());
    Device<int> arrivals(std::vector<int>(gated_arrivals_needed(rows), 0));
    for (const bool gelu : {false, true}) {
      for (int T = 1; T <= kGemvMaxTokens; ++T) {
        std::vector<float> x(static_cast<std::size_t>(T) * cols);
        for (float& v : x) v = normal(rng);
        Device<float> dx(x), gate(static_cast<std::size_t>(T) * rows), up(gate.n), fused_gate(gate.n), fused_up(gate.n);
        Device<std::int8_t> q(x.size()), act_q(gate.n), fused_act_q(gate.n);
        Device<float2> scales(x.size() / 32), act_scales(gate.n / 32 + 1), fused_act_scales(gate.n / 32 + 1);
        const bool whole_groups = rows % 32 == 0;
        const Q8Out act_q8 = whole_groups ? Q8Out{act_q.p, act_scales.p} : Q8Out{};
        const Q8Out fused_act_q8 = whole_groups ? Q8Out{fused_act_q.p, fused_act_scales.p} : Q8Out{};
        quantize_q8(dx.p, T, cols, q.p, scales.p, nullptr);
        CUDA_OK(cudaDeviceSynchronize());
        GemvParts parts{};
        parts.n = 2, parts.cols = cols;
        parts.part[0] = {gate_w.p, WeightFormat::Q4_K, rows, gate.p};
        parts.part[1] = {up_w.p, WeightFormat::Q4_K, rows, up.p};
        gemv_q8(parts, q.p, scales.p, T, nullptr);
        CUDA_OK(cudaDeviceSynchronize());
        gated_activation(gate.p, up.p, gate.n, gelu, nullptr, act_q8);
        CUDA_OK(cudaDeviceSynchronize());
        parts.part[0].y = fused_gate.p, parts.part[1].y = fused_up.p;
        parts.gated = {arrivals.p, fused_act_q8, gelu};
        for (int launch = 0; launch < 2; ++launch) {
          CUDA_OK(cudaMemset(fused_gate.p, 0xff, fused_gate.n * sizeof(float)));
          gemv_q8(parts, q.p, scales.p, T, nullptr);
          CUDA_OK(cudaDeviceSynchronize());
          const std::string what = std::string(gelu ? "GELU" : "SiLU") + " rows " + std::to_string(rows) + " T " + std::to_string(T);
          EXPECT_EQ(fused_up.read(), up.read()) << what;
          EXPECT_EQ(fused_gate.read(), gate.read()) << what;
          if (whole_groups) expect_same_q8(fused_act_q, fused_act_scales, act_q, act_scales, gate.n / 32, what);
          expect_counters_left_zero(arrivals, what);
        }
      }
    }
  }
}

// The q/k/v launch with rope and the KV write at its end (gemv_q8_qkv): q rotated and the cache's
// keys and values as gemv_q8 then qkv_post leave them (the same arithmetic: equal), with q/k/v in
// three formats, plain and NeoX rope over whole and half heads, biases (Qwen2) and head norms
// (Qwen3), every decode batch size, twice each (the counters left zero for the next launch).
TEST(CudaKernels, QkvGemvEndsWithRopeAndTheKvWrite) {
  REQUIRE_GPU();
  std::mt19937 rng(13);
  std::normal_distribution<float> normal;
  const int cols = 256, n_head = 4, n_head_kv = 2, hd = 64, n_layer = 2, layer = 1, bt = 16;
  const std::vector<std::int32_t> table = {3, 1};  // one sequence, 32 positions of room
  const auto random_matrix = [&](DType type, int rows) {
    std::vector<float> w(static_cast<std::size_t>(rows) * cols);
    for (float& v : w) v = normal(rng);
    const std::size_t rb = row_bytes(type, cols);
    std::vector<std::uint8_t> packed(rb * rows);
    for (int r = 0; r < rows; ++r) quantize_row(type, &w[static_cast<std::size_t>(r) * cols], &packed[rb * r], cols);
    return packed;
  };
  const auto random_vector = [&](std::size_t n) {
    std::vector<float> v(n);
    for (float& x : v) x = normal(rng);
    return v;
  };
  Device<std::uint8_t> wq(random_matrix(DType::Q4_K, n_head * hd)), wk(random_matrix(DType::Q8_0, n_head_kv * hd)),
      wv(random_matrix(DType::Q6_K, n_head_kv * hd));
  Device<float> bq(random_vector(n_head * hd)), bk(random_vector(n_head_kv * hd)), bv(random_vector(n_head_kv * hd));
  Device<float> q_norm(random_vector(hd)), k_norm(random_vector(hd));
  std::vector<float> speeds(hd / 2);
  for (int i = 0; i < hd / 2; ++i) speeds[i] = std::pow(10000.0f, -2.0f * i / hd);
  Device<float> inv_freq(speeds);
  DeviceKv kv{nullptr, n_layer, n_head_kv, hd, bt};
  const std::size_t store_elems = 4 * static_cast<std::size_t>(n_layer) * 2 * kv.part_elems();
  std::vector<__half> store(store_elems);
  for (auto& h : store) h = __float2half(normal(rng));
  Device<int> arrivals(std::vector<int>(qkv_arrivals_needed(n_head, n_head_kv), 0));
  struct Case {
    const char* name;
    bool neox, biases, norms;
    int n_rot;
  };
  for (const Case c : {Case{"plain", false, false, false, hd}, Case{"neox, biases", true, true, false, hd},
                       Case{"neox, head norms", true, false, true, hd}, Case{"half rotary", true, false, false, hd / 2}}) {
    for (int T = 1; T <= kGemvMaxTokens; ++T) {
      std::vector<std::int32_t> meta_host(static_cast<std::size_t>(8 * T), 0);
      for (int t = 0; t < T; ++t) {
        meta_host[T + t] = 20 + t;      // positions
        meta_host[2 * T + t] = 20 + t;  // slots
        meta_host[5 * T + t] = -1;      // no tree
      }
      meta_host.insert(meta_host.end(), table.begin(), table.end());
      Device<std::int32_t> meta_dev(meta_host);
      const StepMeta meta{meta_dev.p,         meta_dev.p + T,     meta_dev.p + 2 * T,
                          meta_dev.p + 3 * T, meta_dev.p + 8 * T, meta_dev.p + 5 * T,
                          reinterpret_cast<const std::uint32_t*>(meta_dev.p + 6 * T), nullptr, nullptr};
      const std::vector<float> x = random_vector(static_cast<std::size_t>(T) * cols);
      Device<float> dx(x);
      Device<std::int8_t> xq(x.size());
      Device<float2> xds(x.size() / 32);
      quantize_q8(dx.p, T, cols, xq.p, xds.p, nullptr);
      CUDA_OK(cudaDeviceSynchronize());
      const auto run = [&](bool fused, Device<int>* counters) {
        Device<float> q(static_cast<std::size_t>(T) * n_head * hd), k(static_cast<std::size_t>(T) * n_head_kv * hd), v(k.n);
        Device<__half> dstore(store);
        DeviceKv at = kv;
        at.data = dstore.p;
        GemvParts parts{};
        parts.n = 3, parts.cols = cols;
        parts.part[0] = {wq.p, WeightFormat::Q4_K, n_head * hd, q.p};
        parts.part[1] = {wk.p, WeightFormat::Q8_0, n_head_kv * hd, k.p};
        parts.part[2] = {wv.p, WeightFormat::Q6_K, n_head_kv * hd, v.p};
        const QkvPost post{q.p, k.p, v.p, c.biases ? bq.p : nullptr, c.biases ? bk.p : nullptr, c.biases ? bv.p : nullptr,
                           c.norms ? q_norm.p : nullptr, c.norms ? k_norm.p : nullptr, inv_freq.p, n_head, n_head_kv, hd, c.n_rot,
                           c.neox, 1.0f, 1e-6f, layer};
        if (fused) {
          EXPECT_TRUE(gemv_q8_qkv_takes(parts, post));
          gemv_q8_qkv(parts, xq.p, xds.p, T, post, meta, at, counters->p, nullptr);
        } else {
          gemv_q8(parts, xq.p, xds.p, T, nullptr);
          EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
          qkv_post(post, meta, T, at, nullptr);
        }
        EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        return std::make_pair(q.read(), dstore.read());
      };
      const auto want = run(false, nullptr);
      for (int launch = 0; launch < 2; ++launch) {
        const auto got = run(true, &arrivals);
        const std::string what = std::string(c.name) + " T " + std::to_string(T) + " launch " + std::to_string(launch);
        EXPECT_EQ(got.first, want.first) << what;
        std::size_t differing = 0;
        for (std::size_t i = 0; i < store_elems; ++i) differing += __half2float(got.second[i]) != __half2float(want.second[i]);
        EXPECT_EQ(differing, 0u) << what << ": cache elements differing";
        expect_counters_left_zero(arrivals, what);
      }
    }
  }
}

// Device routing (route_experts) against model/moe.h's: the same experts, in expert order, with the
// same weights, for both routers, with ties (logits on a coarse grid: the lower index first),
// -inf and NaN logits; then moe_combine's weighted sums.
TEST(CudaKernels, RoutesExpertsAsTheCpuDoes) {
  // A lane holds 8 experts: more, or k past a warp's lanes, is refused before any launch (the
  // model routes those on the host: experts_routable_on_device).
  EXPECT_THROW(route_experts(nullptr, 1, kMaxRoutedExperts + 1, 8, false, ExpertRoutes{}, nullptr), Error);
  EXPECT_THROW(route_experts(nullptr, 1, 64, 33, false, ExpertRoutes{}, nullptr), Error);
  EXPECT_THROW(route_experts(nullptr, 1, 4, 5, false, ExpertRoutes{}, nullptr), Error);
  REQUIRE_GPU();
  std::mt19937 rng(11);
  const int T = 5;
  struct Case {
    int n_expert, k;
  };
  // 256: every lane's 8 experts; 200: some lanes' last past the row.
  for (const Case c : {Case{4, 2}, Case{8, 1}, Case{37, 3}, Case{128, 8}, Case{40, 32}, Case{256, 8}, Case{200, 6}}) {
    for (const arch::Router router : {arch::Router::TopKThenSoftmax, arch::Router::SoftmaxThenTopK}) {
      for (const bool renormalize : {false, true}) {
        std::vector<float> logits(static_cast<std::size_t>(T) * c.n_expert);
        for (float& l : logits) l = static_cast<float>(static_cast<int>(rng() % 16)) * 0.25f - 2.0f;  // many ties
        logits[1] = -INFINITY;
        logits[static_cast<std::size_t>(c.n_expert) + 2] = NAN;
        // The last token has one finite logit, at its last expert: the rest of its k are chosen
        // among equals (-inf, and a NaN read as -inf) by the lower index.
        float* last = logits.data() + static_cast<std::size_t>(T - 1) * c.n_expert;
        std::fill(last, last + c.n_expert, -INFINITY);
        last[0] = NAN;
        last[c.n_expert - 1] = 1.0f;
        Device<float> dl(logits);
        Device<std::int32_t> experts(static_cast<std::size_t>(T) * c.k);
        Device<float> weights(static_cast<std::size_t>(T) * c.k);
        const bool softmax_over_all = router == arch::Router::SoftmaxThenTopK && !renormalize;
        route_experts(dl.p, T, c.n_expert, c.k, softmax_over_all, ExpertRoutes{experts.p, weights.p}, nullptr);
        CUDA_OK(cudaDeviceSynchronize());
        const std::vector<std::int32_t> got_experts = experts.read();
        const std::vector<float> got_weights = weights.read();
        const std::string what = "experts " + std::to_string(c.n_expert) + " k " + std::to_string(c.k) + " router " +
                                 std::to_string(static_cast<int>(router)) + " renormalize " + std::to_string(renormalize);
        for (int t = 0; t < T; ++t) {
          std::vector<float> row(logits.begin() + static_cast<std::ptrdiff_t>(t) * c.n_expert, logits.begin() + static_cast<std::ptrdiff_t>(t + 1) * c.n_expert);
          for (float& l : row) l = std::isnan(l) ? -INFINITY : l;  // as the kernel reads a NaN
          std::vector<ExpertChoice> want(static_cast<std::size_t>(c.k));
          promptly::route_experts(row.data(), static_cast<std::uint32_t>(c.n_expert), static_cast<std::uint32_t>(c.k), router, renormalize, want.data());
          std::sort(want.begin(), want.end(), [](const ExpertChoice& a, const ExpertChoice& b) { return a.expert < b.expert; });
          for (int i = 0; i < c.k; ++i) {
            const std::size_t at = static_cast<std::size_t>(t) * c.k + i;
            ASSERT_EQ(got_experts[at], static_cast<std::int32_t>(want[i].expert)) << what << " token " << t << " choice " << i;
            EXPECT_NEAR(got_weights[at], want[i].weight, 1e-6f * std::max(1.0f, want[i].weight)) << what << " token " << t << " choice " << i;
          }
        }
        const int d = 70;
        std::normal_distribution<float> normal;
        std::vector<float> y(static_cast<std::size_t>(T) * c.k * d);
        for (float& v : y) v = normal(rng);
        Device<float> dy(y), out(static_cast<std::size_t>(T) * d);
        moe_combine(dy.p, ExpertRoutes{experts.p, weights.p}, T, c.k, d, out.p, nullptr);
        CUDA_OK(cudaDeviceSynchronize());
        std::vector<double> want(out.n, 0.0);
        for (int t = 0; t < T; ++t) {
          for (int i = 0; i < c.k; ++i) {
            const std::size_t pair = static_cast<std::size_t>(t) * c.k + i;
            for (int j = 0; j < d; ++j) want[static_cast<std::size_t>(t) * d + j] += static_cast<double>(got_weights[pair]) * y[pair * d + j];
          }
        }
        EXPECT_LT(relative_error(out.read(), want), 1e-6) << what;
      }
    }
  }
}

// Each (token, expert) pair through its expert's matrix (gemv_experts), two parts in one launch
// (gate and up), x rows shared by a token's pairs or each pair's own (down): against the product
// with the pair's expert, x as the kernel sees it (int8 blocks for the quantized formats).
TEST(CudaKernels, ExpertGemvTakesEachPairsExpert) {
  REQUIRE_GPU();
  std::mt19937 rng(12);
  std::normal_distribution<float> normal;
  const int rows = 37, n_expert = 5, T = 3, k = 2, pairs = T * k;
  const std::vector<std::int32_t> chosen = {0, 4, 2, 4, 1, 3};  // expert 4 twice, 0..4 all used
  struct Case {
    DType first, second;
    WeightFormat first_format, second_format;
    int cols;
  };
  for (const Case c : {Case{DType::Q4_K, DType::Q4_K, WeightFormat::Q4_K, WeightFormat::Q4_K, 512},
                       Case{DType::Q6_K, DType::Q4_K, WeightFormat::Q6_K, WeightFormat::Q4_K, 256},
                       Case{DType::Q8_0, DType::Q4_0, WeightFormat::Q8_0, WeightFormat::Q4_0, 96},
                       Case{DType::F16, DType::BF16, WeightFormat::F16, WeightFormat::BF16, 96},
                       Case{DType::F32, DType::F32, WeightFormat::F32, WeightFormat::F32, 64},
                       Case{DType::Q8_0, DType::F16, WeightFormat::Q8_0, WeightFormat::F16, 160}}) {  // two kinds: two launches
    ASSERT_TRUE(gemv_experts_takes(c.first_format, c.cols));
    for (const int pairs_per_x : {k, 1}) {
      const int x_rows = pairs / pairs_per_x;
      std::vector<float> x(static_cast<std::size_t>(x_rows) * c.cols);
      for (float& v : x) v = normal(rng) * (1.0f + static_cast<float>(rng() % 50));
      std::vector<float> x_int8(x.size());
      for (std::size_t b = 0; b < x.size() / 32; ++b) {
        float amax = 0.0f;
        for (int l = 0; l < 32; ++l) amax = std::max(amax, std::abs(x[32 * b + l]));
        const float d = amax / 127.0f;
        for (int l = 0; l < 32; ++l) x_int8[32 * b + l] = d > 0.0f ? d * std::nearbyint(x[32 * b + l] / d) : 0.0f;
      }
      Device<float> dx(x);
      Device<std::int8_t> q(x.size());
      Device<float2> scales(x.size() / 32);
      quantize_q8(dx.p, x_rows, c.cols, q.p, scales.p, nullptr);
      CUDA_OK(cudaDeviceSynchronize());
      Device<std::int32_t> experts(chosen);
      std::vector<std::vector<float>> dequantized(2);
      std::vector<std::unique_ptr<Device<std::uint8_t>>> weights;
      std::vector<std::unique_ptr<Device<float>>> outputs;
      ExpertGemv g{};
      g.n = 2, g.rows = rows, g.cols = c.cols, g.pairs_per_x = pairs_per_x;
      for (int part = 0; part < 2; ++part) {
        const DType dtype = part == 0 ? c.first : c.second;
        const std::size_t rb = row_bytes(dtype, c.cols), stride = rb * rows;
        std::vector<std::uint8_t> packed(stride * n_expert);
        dequantized[part].resize(static_cast<std::size_t>(n_expert) * rows * c.cols);
        for (int r = 0; r < n_expert * rows; ++r) {
          std::vector<float> w(static_cast<std::size_t>(c.cols));
          for (float& v : w) v = normal(rng);
          quantize_row(dtype, w.data(), &packed[rb * r], c.cols);
          dequantize_row(dtype, &packed[rb * r], &dequantized[part][static_cast<std::size_t>(r) * c.cols], c.cols);
        }
        weights.push_back(std::make_unique<Device<std::uint8_t>>(packed));
        outputs.push_back(std::make_unique<Device<float>>(static_cast<std::size_t>(pairs) * rows));
        CUDA_OK(cudaMemset(outputs.back()->p, 0xff, outputs.back()->n * sizeof(float)));  // NaN: every output must be written
        g.part[part] = {weights.back()->p, stride, part == 0 ? c.first_format : c.second_format, outputs.back()->p};
      }
      gemv_experts(g, experts.p, pairs, dx.p, q.p, scales.p, nullptr);
      CUDA_OK(cudaDeviceSynchronize());
      for (int part = 0; part < 2; ++part) {
        const bool as_int8 = !is_float_format(g.part[part].format);
        std::vector<double> want(static_cast<std::size_t>(pairs) * rows);
        for (int p = 0; p < pairs; ++p) {
          const float* xr = (as_int8 ? x_int8 : x).data() + static_cast<std::size_t>(p / pairs_per_x) * c.cols;
          for (int r = 0; r < rows; ++r) {
            const float* wr = &dequantized[part][(static_cast<std::size_t>(chosen[p]) * rows + r) * c.cols];
            double s = 0;
            for (int j = 0; j < c.cols; ++j) s += static_cast<double>(wr[j]) * xr[j];
            want[static_cast<std::size_t>(p) * rows + r] = s;
          }
        }
        EXPECT_LT(relative_error(outputs[part]->read(), want), 1e-5)
            << dtype_name(part == 0 ? c.first : c.second) << " cols " << c.cols << " part " << part << " pairs per x " << pairs_per_x;
      }
    }
  }
}

// The experts' gate/up launch with the gated activation at its end, pair by pair: as
// gemv_experts then gated_activation leave gate (and its int8 form where the rows are whole groups
// of 32), bit for bit; quantized and float experts, SiLU and GELU, twice (the counters left zero).
TEST(CudaKernels, ExpertGemvEndsWithTheGatedActivation) {
  REQUIRE_GPU();
  std::mt19937 rng(14);
  std::normal_distribution<float> normal;
  const int n_expert = 4, T = 3, k = 2, pairs = T * k, cols = 256;
  const std::vector<std::int32_t> chosen = {0, 3, 2, 3, 1, 2};
  Device<std::int32_t> experts(chosen);
  for (const DType type : {DType::Q4_K, DType::F16}) {
    for (const int rows : {64, 44}) {
      const std::size_t rb = row_bytes(type, cols), stride = rb * rows;
      const auto random_experts = [&] {
        std::vector<std::uint8_t> packed(stride * n_expert);
        for (int r = 0; r < n_expert * rows; ++r) {
          std::vector<float> w(static_cast<std::size_t>(cols));
          for (float& v : w) v = normal(rng);
          quantize_row(type, w.data(), &packed[rb * r], cols);
        }
        return packed;
      };
      Device<std::uint8_t> gate_w(random_experts()), up_w(random_experts());
      std::vector<float> x(static_cast<std::size_t>(T) * cols);
      for (float& v : x) v = normal(rng);
      Device<float> dx(x);
      Device<std::int8_t> q(x.size());
      Device<float2> scales(x.size() / 32);
      quantize_q8(dx.p, T, cols, q.p, scales.p, nullptr);
      CUDA_OK(cudaDeviceSynchronize());
      const WeightFormat format = type == DType::Q4_K ? WeightFormat::Q4_K : WeightFormat::F16;
      const std::size_t n = static_cast<std::size_t>(pairs) * rows;
      Device<int> arrivals(std::vector<int>(pairs * gated_arrivals_needed(rows), 0));
      for (const bool gelu : {false, true}) {
        const std::string what = std::string(dtype_name(type)) + " rows " + std::to_string(rows) + (gelu ? " GELU" : " SiLU");
        Device<float> gate(n), up(n), fused_gate(n), fused_up(n);
        Device<std::int8_t> act_q(n), fused_act_q(n);
        Device<float2> act_scales(n / 32 + 1), fused_act_scales(n / 32 + 1);
        const bool whole_groups = rows % 32 == 0;
        ExpertGemv g{};
        g.n = 2, g.rows = rows, g.cols = cols, g.pairs_per_x = k;
        g.part[0] = {gate_w.p, stride, format, gate.p};
        g.part[1] = {up_w.p, stride, format, up.p};
        ASSERT_TRUE(gemv_experts_gated_takes(g));
        gemv_experts(g, experts.p, pairs, dx.p, q.p, scales.p, nullptr);
        CUDA_OK(cudaDeviceSynchronize());
        gated_activation(gate.p, up.p, n, gelu, nullptr, whole_groups ? Q8Out{act_q.p, act_scales.p} : Q8Out{});
        CUDA_OK(cudaDeviceSynchronize());
        g.part[0].y = fused_gate.p, g.part[1].y = fused_up.p;
        g.gated = {arrivals.p, whole_groups ? Q8Out{fused_act_q.p, fused_act_scales.p} : Q8Out{}, gelu};
        for (int launch = 0; launch < 2; ++launch) {
          CUDA_OK(cudaMemset(fused_gate.p, 0xff, n * sizeof(float)));
          gemv_experts(g, experts.p, pairs, dx.p, q.p, scales.p, nullptr);
          CUDA_OK(cudaDeviceSynchronize());
          EXPECT_EQ(fused_gate.read(), gate.read()) << what;
          if (whole_groups) expect_same_q8(fused_act_q, fused_act_scales, act_q, act_scales, n / 32, what);
          expect_counters_left_zero(arrivals, what);
        }
      }
    }
  }
}

TEST(CudaKernels, DequantizeToHalfMatchesTheReference) {
  REQUIRE_GPU();
  std::mt19937 rng(3);
  std::normal_distribution<float> normal;
  const int rows = 5, cols = 512;
  std::vector<float> w(rows * cols);
  for (float& v : w) v = normal(rng);
  std::vector<std::uint8_t> packed(row_bytes(DType::Q4_K, cols) * rows);
  quantize_row(DType::Q4_K, w.data(), packed.data(), w.size());
  std::vector<float> reference(w.size());
  dequantize_row(DType::Q4_K, packed.data(), reference.data(), w.size());
  Device<std::uint8_t> dw(packed);
  Device<__half> out(w.size());
  dequantize_to_half(dw.p, WeightFormat::Q4_K, rows, cols, out.p, nullptr);
  CUDA_OK(cudaDeviceSynchronize());
  std::vector<__half> got = out.read();
  for (std::size_t i = 0; i < w.size(); ++i) {
    std::uint16_t bits;
    std::memcpy(&bits, &got[i], 2);
    ASSERT_NEAR(fp16_to_fp32(bits), reference[i], std::abs(reference[i]) * 1e-3 + 1e-4) << i;
  }
}

// Attention over a paged cache whose blocks are scattered, with GQA, a window and a soft cap, and
// token-tree nodes (their tree's context, then only their ancestors' slots), against the softmax
// computed here in double: the per-token kernel split several ways, its merge in a launch of its
// own and in the attention launch, and the tiled kernel of prefill under several tilings.
struct AttentionQuery {
  std::int32_t position, tree;
  std::uint64_t ancestors;
};
using Tiling = std::vector<std::pair<int, int>>;  // (first token, count)

TEST(CudaKernels, PagedAttentionMatchesTheReference) {
  REQUIRE_GPU();
  std::mt19937 rng(11);
  std::normal_distribution<float> normal;
  const int n_layer = 2, n_head = 6, n_head_kv = 2, bt = 16, n_blocks = 12, layer = 1;
  const std::vector<int> table = {7, 2, 9, 0, 11, 4, 5};  // one sequence, 112 positions of room
  // Three ordinary tokens, then three nodes of a tree after 100 positions: the first level's first
  // node (slot 100), a node two levels down from it (slot 103, ancestors 100 and 102) and one whose
  // ancestors reach the tree's last slot (111). Tiled as pack_step would (the ordinary tokens, then
  // the tree), one token a tile, and in tiles that mix the two kinds.
  std::vector<AttentionQuery> mixed = {{0, -1, 0}, {45, -1, 0}, {111, -1, 0}, {100, 100, 0b1}, {102, 100, 0b1101}, {101, 100, 0b100000000010}};
  // A prompt of 37 tokens after 70 cached positions: in tiles of 16, 16 and 5, and of 7, 16 and 14
  // (the kernel takes any count up to its tile size); with heads of 256, whose tiles hold 8, in
  // pack_step's 8, 8, 7, 7 and 7, and in 5, 8, 1, 8, 8 and 7.
  std::vector<AttentionQuery> prompt;
  for (int i = 0; i < 37; ++i) prompt.push_back({70 + i, -1, 0});
  struct Set {
    const char* name;
    std::vector<AttentionQuery> queries;
    std::vector<Tiling> tilings;
  };
  const std::vector<Tiling> mixed_tilings = {{{0, 3}, {3, 3}}, {{0, 1}, {1, 1}, {2, 1}, {3, 1}, {4, 1}, {5, 1}}, {{0, 6}}, {{0, 4}, {4, 2}}};
  // Heads of 20 take the per-token kernel's 4-byte loads (not a multiple of 8 halves); of 80, 16-byte
  // loads that do not divide evenly among a position's lanes.
  for (const int hd : {20, 80, 128, 256}) {
    const std::vector<Set> sets = {
        {"mixed", mixed, mixed_tilings},
        {"prompt", prompt,
         attention_tile_tokens(hd) == 16 ? std::vector<Tiling>{{{0, 16}, {16, 16}, {32, 5}}, {{0, 7}, {7, 16}, {23, 14}}}
                                         : std::vector<Tiling>{{{0, 8}, {8, 8}, {16, 7}, {23, 7}, {30, 7}}, {{0, 5}, {5, 8}, {13, 1}, {14, 8}, {22, 8}, {30, 7}}}}};
    DeviceKv kv{nullptr, n_layer, n_head_kv, hd, bt};
    std::vector<__half> store(static_cast<std::size_t>(n_blocks) * n_layer * 2 * kv.part_elems());
    for (auto& h : store) h = __float2half(normal(rng));
    Device<__half> dstore(store);
    kv.data = dstore.p;
    const auto at = [&](int pos, int head, int which) {
      const int block = table[pos / bt];
      return ((static_cast<std::size_t>(block) * n_layer + layer) * 2 + which) * kv.part_elems() +
             (static_cast<std::size_t>(head) * bt + pos % bt) * hd;
    };
    for (const Set& set : sets) {
      const std::vector<AttentionQuery>& queries = set.queries;
      const int T = static_cast<int>(queries.size());
      for (const int window : {0, 37}) {
        for (const float cap : {0.0f, 20.0f}) {
          const std::string what = std::string(set.name) + ", heads of " + std::to_string(hd) + ", window " + std::to_string(window) +
                                   ", cap " + std::to_string(cap);
          // StepMeta's arrays: tokens, positions, slots, table starts, rows, tree contexts (T each),
          // tree ancestors (2T), then the block table (the tiles: below).
          std::vector<std::int32_t> meta_host(static_cast<std::size_t>(8 * T), 0);
          for (int t = 0; t < T; ++t) {
            const AttentionQuery& qt = queries[static_cast<std::size_t>(t)];
            meta_host[T + t] = qt.position;
            meta_host[2 * T + t] = qt.tree < 0 ? qt.position : qt.tree + static_cast<int>(std::bit_width(qt.ancestors)) - 1;  // its own bit is its last
            meta_host[5 * T + t] = qt.tree;
            meta_host[6 * T + 2 * t] = static_cast<std::int32_t>(static_cast<std::uint32_t>(qt.ancestors));
            meta_host[6 * T + 2 * t + 1] = static_cast<std::int32_t>(static_cast<std::uint32_t>(qt.ancestors >> 32));
          }
          meta_host.insert(meta_host.end(), table.begin(), table.end());
          Device<std::int32_t> meta_dev(meta_host);
          const StepMeta meta{meta_dev.p,         meta_dev.p + T,
                              meta_dev.p + 2 * T, meta_dev.p + 3 * T,
                              meta_dev.p + 8 * T, meta_dev.p + 5 * T,
                              reinterpret_cast<const std::uint32_t*>(meta_dev.p + 6 * T), nullptr, nullptr};
          std::vector<float> q(static_cast<std::size_t>(T) * n_head * hd);
          for (float& v : q) v = normal(rng);
          Device<float> dq(q), out(q.size());
          const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
          std::vector<double> want(q.size());
          for (int t = 0; t < T; ++t) {
            const AttentionQuery& qt = queries[static_cast<std::size_t>(t)];
            const int end = qt.tree < 0 ? qt.position + 1 : qt.tree, first = window && end > window ? end - window : 0;
            std::vector<int> seen;
            for (int p = first; p < end; ++p) seen.push_back(p);
            for (int j = 0; j < 64; ++j) {
              if (qt.tree >= 0 && (qt.ancestors >> j & 1)) seen.push_back(qt.tree + j);
            }
            for (int h = 0; h < n_head; ++h) {
              const int kh = h / (n_head / n_head_kv);
              std::vector<double> score;
              for (const int p : seen) {
                double sc = 0;
                for (int d = 0; d < hd; ++d) sc += q[(static_cast<std::size_t>(t) * n_head + h) * hd + d] * __half2float(store[at(p, kh, 0) + d]);
                sc *= scale;
                if (cap > 0) sc = cap * std::tanh(sc / cap);
                score.push_back(sc);
              }
              const double top = *std::max_element(score.begin(), score.end());
              double sum = 0;
              for (double& sc : score) sum += (sc = std::exp(sc - top));
              for (int d = 0; d < hd; ++d) {
                double o = 0;
                for (std::size_t i = 0; i < seen.size(); ++i) o += score[i] * __half2float(store[at(seen[i], kh, 1) + d]);
                want[(static_cast<std::size_t>(t) * n_head + h) * hd + d] = o / sum;
              }
            }
          }
          for (const int chunk : {64, 16, 2}) {  // 2: 56 splits, more than a warp's lanes, for the merge
            const int n_splits = (112 + chunk - 1) / chunk;
            Device<float> partials(static_cast<std::size_t>(T) * n_head * n_splits * (hd + 2));
            AttentionArgs args{dq.p, out.p, partials.p, n_head, n_head_kv, hd, layer, window, scale, cap, chunk, n_splits};
            attention(args, meta, T, kv, nullptr);
            CUDA_OK(cudaDeviceSynchronize());
            const std::vector<float> separate = out.read();
            EXPECT_LT(relative_error(separate, want), 1e-5) << what << ", chunk " << chunk;
            // The merge in the same launch (the last split block of each (token, head)), twice: each
            // launch leaves its counters zero for the next. The same sums in the same order.
            Device<int> arrivals(std::vector<int>(attention_arrivals_needed(T, n_head), 0));
            args.arrivals = arrivals.p;
            for (int launch = 0; launch < 2; ++launch) {
              CUDA_OK(cudaMemset(out.p, 0xff, out.n * sizeof(float)));
              attention(args, meta, T, kv, nullptr);
              CUDA_OK(cudaDeviceSynchronize());
              EXPECT_EQ(out.read(), separate) << "merged in the attention launch: " << what << ", chunk " << chunk;
              expect_counters_left_zero(arrivals, "attention merged in its launch");
            }
            // A list of the tokens to attend for (a prefill-sized step's tokens in no tile), with
            // partials and counters for as many queries: their rows as before, the others'
            // untouched; merged in the launch and on their own.
            const std::vector<std::int32_t> listed = {T - 1, 0, T / 2};
            Device<std::int32_t> tokens(listed);
            Device<float> listed_partials(listed.size() * n_head * n_splits * (hd + 2));
            args.tokens = tokens.p, args.partials = listed_partials.p;
            for (int* counters : {arrivals.p, static_cast<int*>(nullptr)}) {
              args.arrivals = counters;
              CUDA_OK(cudaMemset(out.p, 0xff, out.n * sizeof(float)));
              attention(args, meta, static_cast<int>(listed.size()), kv, nullptr);
              CUDA_OK(cudaDeviceSynchronize());
              const std::vector<float> some = out.read();
              for (int t = 0; t < T; ++t) {
                const bool is_listed = std::find(listed.begin(), listed.end(), t) != listed.end();
                const std::size_t row = static_cast<std::size_t>(t) * n_head * hd, n = static_cast<std::size_t>(n_head) * hd;
                for (std::size_t i = row; i < row + n; ++i) {
                  if (is_listed ? some[i] != separate[i] : !std::isnan(some[i])) {
                    ADD_FAILURE() << "listed tokens: " << what << ", chunk " << chunk << ", token " << t << (is_listed ? "" : " (not listed)")
                                  << (counters ? ", merged in the launch" : "");
                    break;
                  }
                }
              }
            }
            expect_counters_left_zero(arrivals, "listed tokens' attention");
          }
          // The tiles (no splits, no partials); with heads of whole int8 blocks, the output as int8
          // too, as the o projection's integer GEMV reads it.
          ASSERT_TRUE(attention_tiles_take(hd));
          for (const Tiling& tiling : set.tilings) {
            std::vector<std::int32_t> tiles_host;
            for (const auto& [first, count] : tiling) {
              ASSERT_LE(count, attention_tile_tokens(hd)) << "a tile larger than its kernel holds";
              tiles_host.insert(tiles_host.end(), {first, count});
            }
            Device<std::int32_t> tiles(tiles_host);
            StepMeta tiled = meta;
            tiled.tiles = tiles.p;
            const AttentionArgs args{dq.p, out.p, nullptr, n_head, n_head_kv, hd, layer, window, scale, cap, 64, 1};
            Device<std::int8_t> got_q(q.size()), want_q(q.size());
            Device<float2> got_scales(q.size() / 32), want_scales(q.size() / 32);
            // On the CUDA cores in float; on the tensor cores (heads of 80 and 128) with queries and
            // softmax weights as halves, ~5e-4 from the exact sums (a key left out of a window of 37
            // moves a row by ~3%).
            for (const bool tensor_cores : {false, true}) {
              if (tensor_cores && !attention_tiles_mma_take(hd)) continue;
              CUDA_OK(cudaMemset(out.p, 0xff, out.n * sizeof(float)));
              attention_tiles(args, tiled, static_cast<int>(tiling.size()), kv, nullptr, Q8Out{got_q.p, got_scales.p}, tensor_cores);
              CUDA_OK(cudaDeviceSynchronize());
              const std::string tiles_what = what + ", " + std::to_string(tiling.size()) + " tiles" + (tensor_cores ? " on the tensor cores" : "");
              EXPECT_LT(relative_error(out.read(), want), tensor_cores ? 2e-3 : 1e-5) << tiles_what;
              if (attention_writes_q8(hd)) {
                quantize_q8(out.p, T * n_head, hd, want_q.p, want_scales.p, nullptr);
                CUDA_OK(cudaDeviceSynchronize());
                expect_same_q8(got_q, got_scales, want_q, want_scales, q.size() / 32, tiles_what);
              }
            }
          }
        }
      }
    }
  }
}

// ---- sampling --------------------------------------------------------------------------------

std::vector<std::int32_t> sample_on_device(const std::vector<float>& logits, int n_vocab, const std::vector<DeviceDraw>& draws) {
  Device<float> d(logits);
  Device<DeviceDraw> on_device(draws);
  Device<std::int32_t> out(draws.size());
  sample_rows(d.p, n_vocab, on_device.p, static_cast<int>(draws.size()), out.p, nullptr);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  return out.read();
}

TEST(CudaSampling, GreedyTakesTheFirstLargestLogit) {
  REQUIRE_GPU();
  const int n = 50000;
  std::vector<float> logits(4 * n, -1.0f);
  logits[123] = 5, logits[40000] = 5;                                          // row 0: a tie
  logits[n + 49999] = 3;                                                       // row 1: the last
  std::fill(logits.begin() + 2 * n, logits.begin() + 3 * n, -INFINITY);        // row 2: all -inf
  logits[3 * n + 7] = NAN, logits[3 * n + 9] = 2, logits[3 * n + 10] = 2;      // row 3: NaN never wins
  std::vector<DeviceDraw> draws;
  for (int r = 0; r < 4; ++r) draws.push_back({r, 0.0f, 40, 0.9f, 0.05f, 0.5});
  EXPECT_EQ(sample_on_device(logits, n, draws), (std::vector<std::int32_t>{123, 49999, 0, 9}));
  for (int r = 0; r < 4; ++r) {
    std::vector<float> row(logits.begin() + static_cast<std::ptrdiff_t>(r) * n, logits.begin() + static_cast<std::ptrdiff_t>(r + 1) * n);
    EXPECT_EQ(argmax(row.data(), row.size()), std::vector<std::int32_t>({123, 49999, 0, 9})[r]) << "row " << r;
  }
}

// Each draw lands where its uniform falls among the host Sampler's probabilities (distribution()),
// walked in id order: the same kept tokens, ties at the cuts included by id, and the same weights.
TEST(CudaSampling, DrawsFromTheSamplersDistribution) {
  REQUIRE_GPU();
  struct Case {
    const char* what;
    float temperature;
    int top_k;
    float top_p, min_p;
    float tie_step;  // > 0: logits rounded to multiples of it (ties at every cut)
    bool close = false;  // logits around 4 (sd 0.5), not 0 (sd 3): nearly all of a warp's in one bucket of the first byte
  };
  const Case cases[] = {
      {"top-k", 1.0f, 40, 1.0f, 0.0f, 0},
      {"the defaults", 0.8f, 40, 0.95f, 0.05f, 0},
      {"top-p over the whole row", 1.0f, 0, 0.9f, 0.0f, 0},
      {"min-p", 1.3f, 0, 1.0f, 0.1f, 0},
      {"no filter", 1.0f, 0, 1.0f, 0.0f, 0},
      {"top-k 1", 0.7f, 1, 1.0f, 0.0f, 0},
      {"top-k past the vocabulary", 1.0f, 1 << 30, 0.5f, 0.0f, 0},
      {"ties at top-k", 1.0f, 7, 1.0f, 0.0f, 1.0f},
      {"ties at top-p", 1.0f, 0, 0.5f, 0.0f, 1.0f},
      {"ties at top-k and top-p", 0.9f, 30, 0.6f, 0.0f, 0.5f},
      {"ties at min-p", 1.0f, 0, 0.98f, 0.1f, 0.25f},
      {"top-p over a row of close logits", 1.0f, 0, 0.9f, 0.0f, 0, true},
      {"top-k over a row of close logits", 1.0f, 50, 1.0f, 0.0f, 0, true},
  };
  std::mt19937 rng(11);
  for (const int n : {1000, 8229}) {
    for (const Case& c : cases) {
      std::normal_distribution<float> normal(c.close ? 4.0f : 0.0f, c.close ? 0.5f : 3.0f);
      std::vector<float> logits(static_cast<std::size_t>(n));
      for (float& l : logits) l = c.tie_step > 0 ? std::round(normal(rng) / c.tie_step) * c.tie_step : normal(rng);
      SamplingParams p;
      p.temperature = c.temperature, p.top_k = c.top_k, p.top_p = c.top_p, p.min_p = c.min_p;
      Sampler sampler(p);
      std::vector<float> copy = logits, probs;
      sampler.distribution(copy.data(), copy.size(), {}, probs);
      std::vector<double> below(probs.size() + 1, 0.0);  // below[i]: the probability of the tokens before i
      for (std::size_t i = 0; i < probs.size(); ++i) below[i + 1] = below[i] + probs[i];
      std::vector<DeviceDraw> draws;
      for (int j = 0; j < 96; ++j) draws.push_back({0, c.temperature, c.top_k, c.top_p, c.min_p, (j + 0.37) / 96});
      draws.push_back({0, c.temperature, c.top_k, c.top_p, c.min_p, 0.0});
      draws.push_back({0, c.temperature, c.top_k, c.top_p, c.min_p, 1.0 - 1e-12});
      const std::vector<std::int32_t> got = sample_on_device(logits, n, draws);
      for (std::size_t j = 0; j < draws.size(); ++j) {
        const double u = draws[j].uniform;
        const std::int32_t t = got[j];
        ASSERT_TRUE(t >= 0 && t < n) << c.what << ": token " << t;
        EXPECT_GT(probs[static_cast<std::size_t>(t)], 0.0f) << c.what << " (n " << n << "): drew token " << t << ", which the host's filters drop";
        EXPECT_LE(below[static_cast<std::size_t>(t)], u + 2e-6) << c.what << " (n " << n << "): u " << u << " drew " << t;
        EXPECT_GE(below[static_cast<std::size_t>(t) + 1], u - 2e-6) << c.what << " (n " << n << "): u " << u << " drew " << t;
      }
    }
  }
}

// ---- whole models ---------------------------------------------------------------------------

// The environment overrides the build's paths: tools/gpu-check.sh runs this binary on another machine.
std::string path_from(const char* variable, const char* built_in) {
  const char* v = std::getenv(variable);
  return v && *v ? v : built_in;
}
std::string shared_model(const std::string& name) { return path_from("PROMPTLY_SHARED_MODELS", PROMPTLY_SHARED_MODELS) + "/" + name; }

// The model as `--device cuda` loads it: the file's layouts, the forward pass on the GPU (tp: a
// tensor-parallel rank's share).
std::unique_ptr<Model> gpu_model(std::shared_ptr<const gguf::File> file, std::shared_ptr<parallel::Communicator> tp = nullptr) {
  ModelLoadOptions keep;
  keep.keep_file_layout = true;
  auto model = std::make_unique<Model>(std::move(file), std::move(tp), keep);
  place_on_device(*model, parse_device("cuda"));
  return model;
}

// The same with environment variables set while it loads (the backend reads its switches then).
std::unique_ptr<Model> gpu_model_with(std::shared_ptr<const gguf::File> file, std::initializer_list<std::pair<const char*, const char*>> variables) {
  struct Unset {  // also where the load throws
    std::initializer_list<std::pair<const char*, const char*>> variables;
    ~Unset() {
      for (const auto& [name, value] : variables) unsetenv(name);
    }
  } unset{variables};
  for (const auto& [name, value] : variables) setenv(name, value, 1);
  return gpu_model(std::move(file));
}

// A prompt of n tokens: BOS, then random ordinary ones.
std::vector<std::int32_t> random_prompt(std::mt19937& rng, std::size_t n) {
  std::vector<std::int32_t> prompt = {1};
  while (prompt.size() < n) prompt.push_back(static_cast<std::int32_t>(3 + rng() % 500));
  return prompt;
}

struct Greedy {
  std::vector<std::int32_t> tokens;
  std::vector<std::vector<float>> logits;  // each step's
};

// A prompt of `prompt` tokens (prefill: through cuBLAS on the GPU past 8 tokens), then `n` greedy steps.
Greedy run_greedy(const Model& model, const std::vector<std::int32_t>& prompt, int n, ThreadPool& pool) {
  KvCache cache = model.make_cache(prompt.size() + n + 1, KvType::F16);
  Greedy g;
  Batch b;
  for (std::size_t i = 0; i < prompt.size(); ++i) b.add(prompt[i], static_cast<std::int32_t>(i), 0, i + 1 == prompt.size());
  std::vector<float> logits;
  auto pos = static_cast<std::int32_t>(prompt.size());
  for (int step = 0; step < n; ++step) {
    model.forward(b, cache, pool, logits);
    const auto next = static_cast<std::int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
    g.tokens.push_back(next);
    g.logits.push_back(logits);
    b.clear();
    b.add(next, pos++, 0, true);
  }
  return g;
}

// Two runs of the same prompt: the same tokens, and each step's logits within `bound` of want's.
void expect_same_run(const Greedy& got, const Greedy& want, double bound, const std::string& what) {
  EXPECT_EQ(got.tokens, want.tokens) << what;
  for (std::size_t step = 0; step < want.logits.size() && step < got.logits.size(); ++step) {
    ASSERT_EQ(got.logits[step].size(), want.logits[step].size()) << what;
    EXPECT_LT(relative_error(got.logits[step], std::vector<double>(want.logits[step].begin(), want.logits[step].end())), bound)
        << what << " step " << step;
  }
}

void expect_same_greedy(const std::string& path, int prompt_len, int steps = 24) {
  if (!std::filesystem::exists(path)) GTEST_SKIP() << path << " is missing";
  const auto file = gguf::File::open(path);
  Model cpu(file);
  const std::unique_ptr<Model> on_gpu = gpu_model(file);
  Model& gpu = *on_gpu;
  ThreadPool pool(2);
  std::mt19937 rng(5);
  std::vector<std::int32_t> prompt(static_cast<std::size_t>(prompt_len));
  for (auto& t : prompt) t = static_cast<std::int32_t>(rng() % cpu.config().n_vocab);
  const Greedy want = run_greedy(cpu, prompt, steps, pool), got = run_greedy(gpu, prompt, steps, pool);
  // Same tokens, step by step. The GPU sums in another order (and prefill's matmuls take halves), so
  // a step whose two best logits the CPU finds within a hair may go the other way: that is allowed,
  // and the runs part there (each goes on from its own token).
  for (std::size_t s = 0; s < want.tokens.size(); ++s) {
    std::vector<double> ref(want.logits[s].begin(), want.logits[s].end());
    EXPECT_LT(relative_error(got.logits[s], ref), 2e-2) << path << " step " << s;
    if (got.tokens[s] == want.tokens[s]) continue;
    std::vector<float> sorted = want.logits[s];
    std::partial_sort(sorted.begin(), sorted.begin() + 2, sorted.end(), std::greater<>());
    EXPECT_LT(sorted[0] - sorted[1], 2e-2f * std::max(1.0f, std::abs(sorted[0])))
        << path << ": step " << s << " chose " << got.tokens[s] << " where the CPU's " << want.tokens[s] << " led by a clear margin";
    break;
  }
}

TEST(CudaModel, Stories260KDecodesAsOnTheCpu) {
  REQUIRE_GPU();
  expect_same_greedy(shared_model("stories260K.gguf"), 5);   // matrix-vector kernels and graphs only
  expect_same_greedy(shared_model("stories260K.gguf"), 40);  // a prefill through cuBLAS first
}

TEST(CudaModel, CodeModelsDecodeAsOnTheCpu) {
  REQUIRE_GPU();
  expect_same_greedy(shared_model("code/code-draft-f16.gguf"), 6);
  expect_same_greedy(shared_model("code/code-target-f16.gguf"), 64);
  // A long prompt: 19 attention tiles, the last ones scanning 10 blocks of 32 keys.
  expect_same_greedy(shared_model("code/code-target-f16.gguf"), 300, 8);
  expect_same_greedy(path_from("PROMPTLY_SOURCE_DIR", PROMPTLY_SOURCE_DIR) + "/models/promptly-code-23m-q8_0.gguf", 33);
}

// Q4_K_M and Q5_K_M (Q4_K or Q5_K, and Q6_K for the tied output and some layers' attn_v and
// ffn_down), Q3_K_M (Q3_K, with Q4_K and Q5_K) and IQ4_XS (its levels by table
// lookup, the output Q6_K): decode's products go through the integer GEMV. (The CPU runs them
// repacked, the GPU as the file stores them.)
TEST(CudaModel, QuantizedMixesDecodeAsOnTheCpu) {
  REQUIRE_GPU();
  const std::string f16 = shared_model("code/code-target-f16.gguf");
  if (!std::filesystem::exists(f16)) GTEST_SKIP() << f16 << " is missing";
  test::TempDir tmp;
  ThreadPool pool(2);
  for (const char* mix : {"Q3_K_M", "Q4_K_M", "Q5_K_M", "IQ4_XS"}) {
    const std::string path = tmp.file(std::string(mix) + ".gguf");
    quantize_model(f16, path, mix, pool);
    expect_same_greedy(path, 5);
    expect_same_greedy(path, 20);
  }
}

// A synthetic model of the preset's shape (random weights) in `type`, in `tmp`; its path.
std::string write_preset(const test::TempDir& tmp, const std::string& preset, DType type, ThreadPool& pool) {
  const std::string path = tmp.file(preset + "-" + std::string(dtype_name(type)) + ".gguf");
  write_synthetic_model(synthetic_preset(preset), type, 5, path, pool);
  return path;
}

// Every dense family the GPU runs, against the CPU (the other model tests hold one GPU path to
// another, or are Llamas): Qwen2's biases, Qwen3's head norms, Gemma 2's post-sublayer norms, soft
// caps and window, Gemma 3's local layers, Phi-3's joined tensors. And a Gemma 2 of 1056-wide
// embeddings, whose norms take a thread's elements in a whole turn of add_rmsnorm_row's 8 and a
// part of one (a block of 128 threads).
TEST(CudaModel, EveryFamilyDecodesAsOnTheCpu) {
  REQUIRE_GPU();
  test::TempDir tmp;
  ThreadPool pool(2);
  std::vector<std::string> paths;
  for (const auto& [preset, type] : {std::pair<std::string, DType>{"tiny-qwen2", DType::Q4_K}, {"tiny-qwen3", DType::Q8_0},
                                     {"tiny-gemma2", DType::Q8_0}, {"tiny-gemma3", DType::Q8_0}, {"tiny-phi3", DType::F16}}) {
    paths.push_back(write_preset(tmp, preset, type, pool));
  }
  SyntheticModelSpec wide = synthetic_preset("tiny-gemma2");
  wide.n_embd = 1056;
  paths.push_back(tmp.file("gemma2-wide.gguf"));
  write_synthetic_model(wide, DType::Q8_0, 5, paths.back(), pool);
  for (const std::string& path : paths) {
    expect_same_greedy(path, 5, 12);
    expect_same_greedy(path, 20, 12);
  }
}

// The tiny mixtures of experts (Mixtral's and Qwen3-MoE's routers), in F32 and Q8_0: paths and types.
std::vector<std::pair<std::string, DType>> write_moe_presets(const test::TempDir& tmp, ThreadPool& pool) {
  std::vector<std::pair<std::string, DType>> models;
  for (const std::string preset : {"tiny-mixtral", "tiny-qwen3moe"}) {
    for (const DType type : {DType::F32, DType::Q8_0}) models.emplace_back(write_preset(tmp, preset, type, pool), type);
  }
  return models;
}

// Mixtures of experts (Mixtral's router: top-k then softmax; Qwen3-MoE's: softmax, top-k,
// renormalised), decode steps routed on the device (a prompt of 5: its prefill too), longer prefills on
// the host from the GPU's router logits, each expert run over its tokens:
// greedy tokens and logits as the CPU's, in F32 (float GEMV, cuBLAS in FP32) and Q8_0 (the integer
// GEMV, prefill's experts through cuBLAS on halves). Routing is a discrete choice: with activations
// quantized to int8 on both sides (each its own way), a router whose k-th and next logits lie within
// ~1e-2 may choose another expert there, and the runs part (seen once in 24 steps of the random
// Q8_0 Mixtral, at a gap of 0.005). So the Q8_0 runs are held to the CPU for 6 steps, the F32 ones
// for 24.
TEST(CudaModel, MixturesOfExpertsDecodeAsOnTheCpu) {
  REQUIRE_GPU();
  test::TempDir tmp;
  ThreadPool pool(2);
  for (const auto& [path, type] : write_moe_presets(tmp, pool)) {
    const int steps = type == DType::F32 ? 24 : 6;
    expect_same_greedy(path, 5, steps);
    expect_same_greedy(path, 20, steps);
  }
}

// A decode step of a mixture of experts routed on the device (the default) gives the logits routed
// on the host gives (PROMPTLY_CUDA_MOE=host), and really is routed there (the profile's stretches).
TEST(CudaModel, MixturesOfExpertsRouteOnTheDeviceAsOnTheHost) {
  REQUIRE_GPU();
  test::TempDir tmp;
  ThreadPool pool(2);
  for (const auto& [path, type] : write_moe_presets(tmp, pool)) {
    const auto file = gguf::File::open(path);
    const std::unique_ptr<Model> on_host = gpu_model_with(file, {{"PROMPTLY_CUDA_MOE", "host"}});
    const std::unique_ptr<Model> on_device = gpu_model_with(file, {{"PROMPTLY_CUDA_PROFILE", "1"}});
    std::mt19937 rng(9);
    const std::vector<std::int32_t> prompt = random_prompt(rng, 12);  // past 8: the prefill routed on the host in both
    const Greedy want = run_greedy(*on_host, prompt, 8, pool), got = run_greedy(*on_device, prompt, 8, pool);
    EXPECT_EQ(got.tokens, want.tokens) << path;
    for (std::size_t s = 0; s < want.logits.size(); ++s) {
      EXPECT_LT(relative_error(got.logits[s], std::vector<double>(want.logits[s].begin(), want.logits[s].end())), 1e-5) << path << " step " << s;
    }
    const std::string report = on_device->device()->profile_report();
    EXPECT_NE(report.find("moe router (routed on the device)"), std::string::npos) << report;
    EXPECT_NE(report.find("moe router (routed on the host)"), std::string::npos) << report;
  }
}

// Tensor parallelism on the GPU: two ranks (threads here, both on cuda:0, as `mpirun -n 2 ... --tp 2
// --device cuda` runs on a machine with one GPU), each with its heads' and FFN (or experts')
// columns' slices on the device, the sublayers' shares summed through the host. Greedy tokens and
// logits as the whole model's on the GPU (the sums in another order: within rounding), prefill
// and decode; and under the engine, prompts sharing a prefix that ends inside a block (rank 0's
// copy-on-write copy, which the other rank's device must repeat): the whole model's answers.
TEST(CudaModel, TensorParallelRanksOnTheGpuComputeWhatTheWholeModelDoes) {
  REQUIRE_GPU();
  test::TempDir tmp;
  ThreadPool pool(2);
  for (const auto& [preset, type] : {std::pair{std::string("tiny"), DType::F32}, std::pair{std::string("tiny-qwen3"), DType::Q8_0},
                                     std::pair{std::string("tiny-mixtral"), DType::F32}}) {
    const std::string path = write_preset(tmp, preset, type, pool);
    const auto file = gguf::File::open(path);
    const std::unique_ptr<Model> whole = gpu_model(file);
    test::SplitModel split(file, 2, [](auto f, auto comm) { return gpu_model(std::move(f), std::move(comm)); });
    EXPECT_NE(split.model().device(), nullptr);
    EXPECT_FALSE(split.model().samples_on_device());
    std::mt19937 rng(3);
    for (const std::size_t prompt_len : {std::size_t{5}, std::size_t{20}}) {
      const std::vector<std::int32_t> prompt = random_prompt(rng, prompt_len);
      const Greedy want = run_greedy(*whole, prompt, 8, pool), got = run_greedy(split.model(), prompt, 8, pool);
      expect_same_run(got, want, type == DType::F32 ? 1e-4 : 2e-2, path + " prompt " + std::to_string(prompt_len));
    }
    if (preset == "tiny") {
      EXPECT_EQ(test::answers_with_shared_prefixes(split.model()), test::answers_with_shared_prefixes(*whole));
    }
  }
}

// Two sequences decoding in one batch see only their own blocks.
TEST(CudaModel, BatchedSequencesMatchTheirSoloRuns) {
  REQUIRE_GPU();
  const std::unique_ptr<Model> on_gpu = gpu_model(gguf::File::open(shared_model("stories260K.gguf")));
  Model& gpu = *on_gpu;
  ThreadPool pool(1);
  const std::vector<std::int32_t> a = {1, 50, 60, 70, 80, 90, 100, 110, 120, 130}, b = {1, 7, 8};
  const Greedy solo_a = run_greedy(gpu, a, 8, pool), solo_b = run_greedy(gpu, b, 8, pool);
  KvCache cache = gpu.make_cache(64, KvType::F16, 2);
  Batch batch;
  for (std::size_t i = 0; i < a.size(); ++i) batch.add(a[i], static_cast<std::int32_t>(i), 0, i + 1 == a.size());
  for (std::size_t i = 0; i < b.size(); ++i) batch.add(b[i], static_cast<std::int32_t>(i), 1, i + 1 == b.size());
  std::vector<float> logits;
  std::vector<std::int32_t> got_a, got_b;
  auto pa = static_cast<std::int32_t>(a.size()), pb = static_cast<std::int32_t>(b.size());
  const std::size_t V = gpu.config().n_vocab;
  for (int step = 0; step < 8; ++step) {
    gpu.forward(batch, cache, pool, logits);
    ASSERT_EQ(logits.size(), 2 * V);
    const auto na = static_cast<std::int32_t>(std::max_element(logits.begin(), logits.begin() + V) - logits.begin());
    const auto nb = static_cast<std::int32_t>(std::max_element(logits.begin() + V, logits.end()) - logits.begin() - V);
    got_a.push_back(na), got_b.push_back(nb);
    batch.clear();
    batch.add(na, pa++, 0, true);
    batch.add(nb, pb++, 1, true);
  }
  EXPECT_EQ(got_a, solo_a.tokens);
  EXPECT_EQ(got_b, solo_b.tokens);
}

TEST(CudaModel, ReportsItsDeviceAndMeasuresItsBandwidth) {
  REQUIRE_GPU();
  const std::unique_ptr<Model> on_gpu = gpu_model(gguf::File::open(shared_model("stories260K.gguf")));
  Model& gpu = *on_gpu;
  ASSERT_NE(gpu.device(), nullptr);
  EXPECT_EQ(gpu.device()->name().rfind("cuda:0 (", 0), 0u) << gpu.device()->name();
  EXPECT_GT(gpu.device()->weight_bytes(), gpu.file().file_size() / 2);
  EXPECT_GT(gpu.device()->measure_bandwidth_gbs(), 1.0);
  // NVML finds the same card by its PCI bus id (serve's /metrics reads it so).
  const std::string bus = gpu.device()->pci_bus_id();
  EXPECT_FALSE(bus.empty());
  std::string why;
  if (const auto stats = read_gpu_stats(bus, &why)) {
    EXPECT_GT(stats->memory_used_bytes, gpu.device()->weight_bytes());
    EXPECT_GE(stats->utilization_perc, 0.0);
    EXPECT_LE(stats->utilization_perc, 100.0);
    EXPECT_LE(stats->memory_used_bytes, stats->memory_total_bytes);
    EXPECT_FALSE(read_gpu_stats("ffff:ff:1f.7", &why));  // no such device
    EXPECT_NE(why.find("NVML has no GPU at ffff:ff:1f.7"), std::string::npos) << why;
  } else {
    std::printf("no NVML statistics for %s: %s\n", bus.c_str(), why.c_str());
  }
}

// PROMPTLY_CUDA_PROFILE=1: each pass's time by stretch of kernels, decode and prefill apart.
TEST(CudaModel, ProfileSplitsEachPassByStretch) {
  REQUIRE_GPU();
  const auto file = gguf::File::open(shared_model("stories260K.gguf"));
  const std::unique_ptr<Model> gpu = gpu_model_with(file, {{"PROMPTLY_CUDA_PROFILE", "1"}});
  EXPECT_EQ(gpu->device()->profile_report(), "");
  ThreadPool pool(1);
  std::vector<std::int32_t> prompt(20);
  for (std::size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<std::int32_t>(3 + 7 * i);
  run_greedy(*gpu, prompt, 4, pool);  // one prefill pass, then three decode passes
  const std::string report = gpu->device()->profile_report();
  EXPECT_NE(report.find("decode passes (3, graphs off)"), std::string::npos) << report;
  EXPECT_NE(report.find("prefill passes (1, graphs off)"), std::string::npos) << report;
  for (const char* stretch : {"q/k/v matmuls", "attention", "down matmul", "output matmul", "logits to the host"}) {
    EXPECT_NE(report.find(stretch), std::string::npos) << stretch << "\n" << report;
  }
  // The matrix-vector stretches say how fast their weights streamed (decode's q/k/v products);
  // the GEMMs' do not (prefill's).
  const auto line_of = [&](const std::string& section, const std::string& stretch) {
    const std::size_t at = report.find("  " + stretch + " ", report.find(section));
    return at == std::string::npos ? std::string() : report.substr(at, report.find('\n', at) - at);
  };
  EXPECT_NE(line_of("decode passes", "q/k/v matmuls").find("GB/s of weights"), std::string::npos) << report;
  const std::string prefill_qkv = line_of("prefill passes", "q/k/v matmuls");
  EXPECT_FALSE(prefill_qkv.empty()) << report;
  EXPECT_EQ(prefill_qkv.find("GB/s"), std::string::npos) << report;
  const std::unique_ptr<Model> quiet = gpu_model(file);  // not asked: no profile
  run_greedy(*quiet, prompt, 2, pool);
  EXPECT_EQ(quiet->device()->profile_report(), "");
}

// Programmatic dependent launches (on by default where the device takes them: sm_90 and later) give
// the very logits ordinary launches give (PROMPTLY_CUDA_PDL=0), in graphs (decode) and out of them
// (prefill, cuBLAS between); the device's name says which way it launches.
TEST(CudaModel, DependentLaunchesComputeWhatOrdinaryOnesDo) {
  REQUIRE_GPU();
  cudaDeviceProp props{};
  CUDA_OK(cudaGetDeviceProperties(&props, 0));
  const auto file = gguf::File::open(shared_model("stories260K.gguf"));
  const std::unique_ptr<Model> ordinary = gpu_model_with(file, {{"PROMPTLY_CUDA_PDL", "0"}});
  const std::unique_ptr<Model> dependent = gpu_model(file);
  EXPECT_EQ(ordinary->device()->name().find("dependent launches"), std::string::npos) << ordinary->device()->name();
  if (props.major >= 9) {
    EXPECT_TRUE(dependent_launches_work(nullptr));
    EXPECT_NE(dependent->device()->name().find("; graphs, dependent launches"), std::string::npos) << dependent->device()->name();
  }
  ThreadPool pool(1);
  std::mt19937 rng(4);
  for (const std::size_t prompt_len : {std::size_t{5}, std::size_t{40}}) {
    const std::vector<std::int32_t> prompt = random_prompt(rng, prompt_len);
    const Greedy want = run_greedy(*ordinary, prompt, 12, pool), got = run_greedy(*dependent, prompt, 12, pool);
    expect_same_run(got, want, 1e-6, "prompt " + std::to_string(prompt_len));  // the same kernels in the same order
  }
}

// The fused launches (rope and the KV write in the q/k/v launch, the attention merge in the
// attention launch, the gated activation in the gate/up launch, and for a lone stream's decode
// steps the residual add and the next norm in the o and down launches) give the logits the
// separate ones give (PROMPTLY_CUDA_FUSE=0), bit for bit: the same arithmetic in the same order
// (Gemma 2's sublayer output norms included). Llama (SiLU) and
// Qwen2 (q/k/v biases) in Q4_K, Gemma 2 (GELU), Qwen3 (head norms) and Qwen3-MoE (the activation
// in the experts' gate/up launch) in Q8_0, through the integer GEMV; decode steps and prefills (the
// attention merge is fused at every batch size).
TEST(CudaModel, FusedLaunchesComputeWhatSeparateOnesDo) {
  REQUIRE_GPU();
  test::TempDir tmp;
  ThreadPool pool(2);
  for (const auto& [preset, type] :
       {std::pair<std::string, DType>{"tiny", DType::Q4_K}, {"tiny-gemma2", DType::Q8_0}, {"tiny-qwen3", DType::Q8_0}, {"tiny-qwen2", DType::Q4_K},
        {"tiny-qwen3moe", DType::Q8_0}}) {
    const std::string path = write_preset(tmp, preset, type, pool);
    const auto file = gguf::File::open(path);
    const std::unique_ptr<Model> separate = gpu_model_with(file, {{"PROMPTLY_CUDA_FUSE", "0"}});
    const std::unique_ptr<Model> fused = gpu_model_with(file, {{"PROMPTLY_CUDA_PROFILE", "1"}});
    std::mt19937 rng(6);
    for (const std::size_t prompt_len : {std::size_t{5}, std::size_t{40}}) {
      const std::vector<std::int32_t> prompt = random_prompt(rng, prompt_len);
      const Greedy want = run_greedy(*separate, prompt, 10, pool), got = run_greedy(*fused, prompt, 10, pool);
      EXPECT_EQ(got.tokens, want.tokens) << preset << " prompt " << prompt_len;
      for (std::size_t step = 0; step < want.logits.size(); ++step) EXPECT_EQ(got.logits[step], want.logits[step]) << preset << " step " << step;
    }
    const std::string report = fused->device()->profile_report();
    if (preset.find("moe") == std::string::npos) {  // the experts' activation has no stretch of its own
      EXPECT_NE(report.find("gate/up matmuls, gated activation"), std::string::npos) << preset << ": " << report;
    }
    EXPECT_NE(report.find("q/k/v matmuls, rope, kv write"), std::string::npos) << preset << ": " << report;
    EXPECT_NE(report.find("attention output matmul, norm"), std::string::npos) << preset << ": " << report;
    if (preset.find("moe") == std::string::npos) {  // the experts' FFN ends in its combine
      EXPECT_NE(report.find("down matmul, norm"), std::string::npos) << preset << ": " << report;
    }
  }
}

// Prefill's attention by tiles (the default for heads up to 256 elements) against the per-token
// kernel (PROMPTLY_CUDA_ATTENTION_TILES=0): Llama with heads of 64, Gemma 2 with a window of 4 and
// a soft cap, Qwen3 with head norms, and Gemma 2 with heads of 256 as the real ones have (tiles of
// 8 queries); prompts of 40 (tiles of 16, 16 and 8; or five of 8) and 13, then greedy steps
// (decode keeps the per-token kernel either way). In F32, whose matmuls take floats throughout: with
// halves or int8 between the layers, a sum in another order that rounds to the neighbouring half
// or int8 step moves later layers by 1e-3 of a logit, which would hide a real error of that size.
TEST(CudaModel, AttentionTilesComputeWhatThePerTokenKernelDoes) {
  REQUIRE_GPU();
  test::TempDir tmp;
  ThreadPool pool(2);
  SyntheticModelSpec wide_heads = synthetic_preset("tiny-gemma2");
  wide_heads.head_dim = 256;
  std::vector<std::pair<std::string, std::string>> models;  // (what, path)
  for (const std::string preset : {"tiny", "tiny-gemma2", "tiny-qwen3"}) models.emplace_back(preset, write_preset(tmp, preset, DType::F32, pool));
  models.emplace_back("tiny-gemma2, heads of 256", tmp.file("gemma2-heads-256.gguf"));
  write_synthetic_model(wide_heads, DType::F32, 5, models.back().second, pool);
  for (const auto& [preset, path] : models) {
    const auto file = gguf::File::open(path);
    const std::unique_ptr<Model> per_token = gpu_model_with(file, {{"PROMPTLY_CUDA_ATTENTION_TILES", "0"}});
    const std::unique_ptr<Model> tiled = gpu_model_with(file, {});
    ASSERT_TRUE(attention_tiles_take(static_cast<int>(tiled->config().head_dim))) << preset;
    std::mt19937 rng(8);
    for (const std::size_t prompt_len : {std::size_t{40}, std::size_t{13}}) {
      const std::vector<std::int32_t> prompt = random_prompt(rng, prompt_len);
      const Greedy want = run_greedy(*per_token, prompt, 4, pool), got = run_greedy(*tiled, prompt, 4, pool);
      expect_same_run(got, want, 1e-5, preset + " prompt " + std::to_string(prompt_len));
    }
  }
}

// The tiles on the tensor cores (the default where the file's matrices are not F32) against the
// same tiles in float on the CUDA cores (PROMPTLY_CUDA_ATTENTION_MMA=0): Llama with heads of 64,
// Gemma 2 with a window of 4 and a soft cap, Qwen3 with head norms, in F16; the prefill's logits
// (prompts of 40 and 13) within 5e-3 (queries and softmax weights as halves: ~5e-4 in each layer's
// attention, carried through two layers and the halves the GEMMs take). F32 files keep the CUDA
// cores, which the device's name says.
TEST(CudaModel, TensorCoreTilesComputeWhatTheFloatTilesDo) {
  REQUIRE_GPU();
  test::TempDir tmp;
  ThreadPool pool(2);
  for (const std::string preset : {"tiny", "tiny-gemma2", "tiny-qwen3"}) {
    const auto file = gguf::File::open(write_preset(tmp, preset, DType::F16, pool));
    const std::unique_ptr<Model> on_cuda_cores = gpu_model_with(file, {{"PROMPTLY_CUDA_ATTENTION_MMA", "0"}});
    const std::unique_ptr<Model> on_tensor_cores = gpu_model_with(file, {});
    EXPECT_EQ(on_cuda_cores->device()->name().find("tensor cores"), std::string::npos) << on_cuda_cores->device()->name();
    EXPECT_NE(on_tensor_cores->device()->name().find("prefill attention on tensor cores"), std::string::npos)
        << on_tensor_cores->device()->name();
    std::mt19937 rng(9);
    for (const std::size_t prompt_len : {std::size_t{40}, std::size_t{13}}) {
      const std::vector<std::int32_t> prompt = random_prompt(rng, prompt_len);
      const Greedy want = run_greedy(*on_cuda_cores, prompt, 1, pool), got = run_greedy(*on_tensor_cores, prompt, 1, pool);
      const double error = relative_error(got.logits[0], std::vector<double>(want.logits[0].begin(), want.logits[0].end()));
      EXPECT_LT(error, 5e-3) << preset << " prompt " << prompt_len;
      std::printf("%s, prompt %zu: prefill logits on the tensor cores within %.2g of the float tiles'\n", preset.c_str(), prompt_len, error);
    }
  }
  const auto f32 = gguf::File::open(write_preset(tmp, "tiny", DType::F32, pool));
  const std::unique_ptr<Model> full_precision = gpu_model_with(f32, {});
  EXPECT_EQ(full_precision->device()->name().find("tensor cores"), std::string::npos) << full_precision->device()->name();
}

// Quantized matrices kept as halves for prefill (the default where they fit in a quarter of the
// free memory) give the logits that decoding them on every prefill gives
// (PROMPTLY_CUDA_PREFILL_HALVES=0): the same halves into the same GEMMs. The profile shows the
// per-pass decoding gone, and the device's name says which way it runs.
TEST(CudaModel, KeptHalvesPrefillAsDecodingThemOnEveryPassDoes) {
  REQUIRE_GPU();
  test::TempDir tmp;
  ThreadPool pool(2);
  const auto file = gguf::File::open(write_preset(tmp, "tiny", DType::Q4_K, pool));
  const std::unique_ptr<Model> decoding = gpu_model_with(file, {{"PROMPTLY_CUDA_PREFILL_HALVES", "0"}, {"PROMPTLY_CUDA_PROFILE", "1"}});
  const std::unique_ptr<Model> kept = gpu_model_with(file, {{"PROMPTLY_CUDA_PROFILE", "1"}});
  EXPECT_EQ(decoding->device()->name().find("prefill from kept halves"), std::string::npos) << decoding->device()->name();
  EXPECT_NE(kept->device()->name().find("prefill from kept halves"), std::string::npos) << kept->device()->name();
  std::mt19937 rng(7);
  const std::vector<std::int32_t> prompt = random_prompt(rng, 40);
  const Greedy want = run_greedy(*decoding, prompt, 6, pool), got = run_greedy(*kept, prompt, 6, pool);
  expect_same_run(got, want, 1e-5, "kept halves");
  const std::string decoded = decoding->device()->profile_report(), read = kept->device()->profile_report();
  EXPECT_NE(decoded.find("prefill: weights decoded to halves"), std::string::npos) << decoded;
  EXPECT_EQ(read.find("prefill: weights decoded to halves"), std::string::npos) << read;
  EXPECT_NE(read.find("prefill: cuBLAS GEMMs"), std::string::npos) << read;
}

// Prefill's q/k/v products in one GEMM over wq, wk and wv one under the other, and its gate/up
// products in one over gate and up (F16 files' bytes, kept halves of quantized ones), give what
// separate GEMMs give (PROMPTLY_CUDA_JOINED_QKV=0, PROMPTLY_CUDA_JOINED_GATE_UP=0): biases
// (Qwen2), head norms (Qwen3) and rope read from the joined rows, and the activation from both
// halves of each. F32 files keep separate GEMMs in FP32. The batches past decode's all go to
// cuBLAS here (PROMPTLY_CUDA_GEMV_BATCH=8), whatever the integer GEMV's default reach.
TEST(CudaModel, JoinedGemmsComputeWhatSeparateOnesDo) {
  REQUIRE_GPU();
  test::TempDir tmp;
  ThreadPool pool(2);
  const std::pair<const char*, DType> models[] = {{"tiny", DType::F16}, {"tiny-qwen2", DType::F16}, {"tiny-qwen3", DType::F16},
                                                  {"tiny-gemma2", DType::F16}, {"tiny-phi3", DType::F16}, {"tiny", DType::Q4_K}, {"tiny-qwen2", DType::Q8_0},
                                                  {"tiny", DType::F32}};
  for (const auto& [preset, type] : models) {
    const std::string what = std::string(preset) + " " + std::string(dtype_name(type));
    const auto file = gguf::File::open(write_preset(tmp, preset, type, pool));
    const std::unique_ptr<Model> separate =
        gpu_model_with(file, {{"PROMPTLY_CUDA_JOINED_QKV", "0"}, {"PROMPTLY_CUDA_JOINED_GATE_UP", "0"}, {"PROMPTLY_CUDA_GEMV_BATCH", "8"}});
    const std::unique_ptr<Model> joined = gpu_model_with(file, {{"PROMPTLY_CUDA_GEMV_BATCH", "8"}});
    EXPECT_EQ(separate->device()->name().find("in one GEMM"), std::string::npos) << separate->device()->name();
    EXPECT_EQ(joined->device()->name().find("prefill q/k/v in one GEMM") != std::string::npos, type != DType::F32)
        << what << ": " << joined->device()->name();
    EXPECT_EQ(joined->device()->name().find("prefill gate/up in one GEMM") != std::string::npos, type != DType::F32)
        << what << ": " << joined->device()->name();
    std::mt19937 rng(21);
    const std::vector<std::int32_t> prompt = random_prompt(rng, 37);
    const Greedy want = run_greedy(*separate, prompt, 4, pool), got = run_greedy(*joined, prompt, 4, pool);
    expect_same_run(got, want, 1e-5, what);
  }
}

// Batches past a decode step's (many streams decoding at once, token trees, short prompts) go
// through the integer GEMV in rounds of kGemvMaxTokens tokens, up to PROMPTLY_CUDA_GEMV_BATCH: a
// 20-token prompt in one pass gives the logits of the same prompt fed 8, 8 and 4 tokens a pass
// (each token's int8 sums are the same either way), and no cuBLAS GEMM runs for it; with the batch
// at 8, the layers' products go through cuBLAS on halves as before, within int8's rounding of those.
// (The fused launches and the attention tiles are off in both: they are compared elsewhere, and a
// pass of 8 tokens would take the one and a pass of 20 the other.)
TEST(CudaModel, BatchesPastDecodeStepsTakeTheIntegerGemvInRounds) {
  REQUIRE_GPU();
  test::TempDir tmp;
  ThreadPool pool(2);
  const std::pair<const char*, DType> models[] = {{"tiny", DType::Q4_K}, {"tiny-qwen2", DType::Q8_0}, {"tiny-qwen3moe", DType::Q8_0}};
  for (const auto& [preset, type] : models) {
    const std::string what = std::string(preset) + " " + std::string(dtype_name(type));
    const auto file = gguf::File::open(write_preset(tmp, preset, type, pool));
    const std::unique_ptr<Model> rounds =
        gpu_model_with(file, {{"PROMPTLY_CUDA_FUSE", "0"}, {"PROMPTLY_CUDA_ATTENTION_TILES", "0"}, {"PROMPTLY_CUDA_PROFILE", "1"}});
    const std::unique_ptr<Model> cublas = gpu_model_with(
        file, {{"PROMPTLY_CUDA_GEMV_BATCH", "8"}, {"PROMPTLY_CUDA_FUSE", "0"}, {"PROMPTLY_CUDA_ATTENTION_TILES", "0"}, {"PROMPTLY_CUDA_PROFILE", "1"}});
    EXPECT_NE(rounds->device()->name().find("integer GEMV up to 32 tokens"), std::string::npos) << rounds->device()->name();
    EXPECT_NE(cublas->device()->name().find("integer GEMV up to 8 tokens"), std::string::npos) << cublas->device()->name();
    EXPECT_THROW(gpu_model_with(file, {{"PROMPTLY_CUDA_GEMV_BATCH", "lots"}}), Error);
    std::mt19937 rng(23);
    const std::vector<std::int32_t> prompt = random_prompt(rng, 20);
    // The prompt's last logits, the prompt fed `chunk` tokens a pass.
    const auto last_logits = [&](const Model& model, std::size_t chunk) {
      KvCache cache = model.make_cache(64, KvType::F16);
      std::vector<float> logits;
      for (std::size_t p0 = 0; p0 < prompt.size(); p0 += chunk) {
        Batch batch;
        const std::size_t end = std::min(prompt.size(), p0 + chunk);
        for (std::size_t p = p0; p < end; ++p) batch.add(prompt[p], static_cast<std::int32_t>(p), 0, p + 1 == prompt.size());
        model.forward(batch, cache, pool, logits);
      }
      return logits;
    };
    const std::vector<float> whole = last_logits(*rounds, prompt.size());
    const std::string report = rounds->device()->profile_report();
    EXPECT_EQ(report.find("prefill: cuBLAS GEMMs"), std::string::npos) << what << ": " << report;
    const std::vector<float> in_eights = last_logits(*rounds, kGemvMaxTokens);
    EXPECT_LT(relative_error(whole, std::vector<double>(in_eights.begin(), in_eights.end())), 1e-5) << what;
    const std::vector<float> through_cublas = last_logits(*cublas, prompt.size());
    const std::string cublas_report = cublas->device()->profile_report();
    EXPECT_NE(cublas_report.find("prefill: cuBLAS GEMMs"), std::string::npos) << what << ": " << cublas_report;
    EXPECT_LT(relative_error(whole, std::vector<double>(through_cublas.begin(), through_cublas.end())), 2e-2) << what;
  }
}

// Streams decoding together: each prompt prefilled on its own (as a solo run has it: a prefill of
// all of them at once would take cuBLAS on halves where the solo ones take the integer GEMV, another
// rounding of the cache), then `steps` greedy steps of a token a stream.
struct StreamsRun {
  std::vector<std::vector<std::int32_t>> tokens;  // each stream's
  std::vector<std::vector<float>> logits;         // each step's, all streams
};
StreamsRun decode_streams(const Model& model, const std::vector<std::vector<std::int32_t>>& prompts, int steps, ThreadPool& pool) {
  const int streams = static_cast<int>(prompts.size());
  std::size_t longest = 0;
  for (const auto& p : prompts) longest = std::max(longest, p.size());
  KvCache cache = model.make_cache(longest + static_cast<std::size_t>(steps) + 2, KvType::F16, static_cast<std::size_t>(streams));
  StreamsRun r;
  r.tokens.resize(static_cast<std::size_t>(streams));
  const std::size_t V = model.config().n_vocab;
  std::vector<float> logits, prompt_logits;
  for (int s = 0; s < streams; ++s) {
    Batch prompt;
    const auto& p = prompts[static_cast<std::size_t>(s)];
    for (std::size_t i = 0; i < p.size(); ++i) prompt.add(p[i], static_cast<std::int32_t>(i), s, i + 1 == p.size());
    model.forward(prompt, cache, pool, prompt_logits);
    logits.insert(logits.end(), prompt_logits.begin(), prompt_logits.end());
  }
  Batch batch;
  for (int step = 0; step <= steps; ++step) {
    if (step > 0) model.forward(batch, cache, pool, logits);
    r.logits.push_back(logits);
    batch.clear();
    for (int s = 0; s < streams; ++s) {
      const auto row = logits.begin() + static_cast<std::ptrdiff_t>(static_cast<std::size_t>(s) * V);
      const auto next = static_cast<std::int32_t>(std::max_element(row, row + static_cast<std::ptrdiff_t>(V)) - row);
      auto& tokens = r.tokens[static_cast<std::size_t>(s)];
      tokens.push_back(next);
      batch.add(next, static_cast<std::int32_t>(prompts[static_cast<std::size_t>(s)].size() + tokens.size() - 1), s, true);
    }
  }
  return r;
}

// A file's model on the GPU twice: with graphs (the default) and without (PROMPTLY_CUDA_GRAPHS=0).
struct GraphedAndPlain {
  std::unique_ptr<Model> graphed, plain;
};
GraphedAndPlain graphed_and_plain(const std::shared_ptr<const gguf::File>& file) {
  return {gpu_model_with(file, {}), gpu_model_with(file, {{"PROMPTLY_CUDA_GRAPHS", "0"}})};
}

// The same steps with graphs (got) and without (want): the same tokens and logits, bit for bit, and
// no step's capture refused.
void expect_graphs_change_nothing(const Model& graphed, const Model& plain, const std::vector<std::vector<std::int32_t>>& prompts, int steps,
                                  ThreadPool& pool) {
  testing::internal::CaptureStderr();
  const StreamsRun got = decode_streams(graphed, prompts, steps, pool);
  const std::string warnings = testing::internal::GetCapturedStderr();
  EXPECT_EQ(warnings.find("could not be captured"), std::string::npos) << warnings;
  const StreamsRun want = decode_streams(plain, prompts, steps, pool);
  EXPECT_EQ(got.tokens, want.tokens);
  ASSERT_EQ(got.logits.size(), want.logits.size());
  for (std::size_t step = 0; step < want.logits.size(); ++step) EXPECT_EQ(got.logits[step], want.logits[step]) << "step " << step;
}

// Many streams decoding at once (continuous batching: 12 tokens a step, one a sequence) run as CUDA
// graphs too, their products through the integer GEMV in rounds: the logits are those of the same
// steps with graphs off (PROMPTLY_CUDA_GRAPHS=0) bit for bit, no step fell back to running without
// a graph, and each stream's tokens are its solo run's. The later steps replay the graph the first
// captured (the same shape).
TEST(CudaModel, ManyStreamsDecodeInGraphsAsTheirSoloRuns) {
  REQUIRE_GPU();
  test::TempDir tmp;
  ThreadPool pool(2);
  const auto file = gguf::File::open(write_preset(tmp, "tiny", DType::Q4_K, pool));
  const auto [graphed, plain] = graphed_and_plain(file);
  constexpr int kStreams = 12, kSteps = 6;
  std::mt19937 rng(29);
  std::vector<std::vector<std::int32_t>> prompts;
  for (int s = 0; s < kStreams; ++s) prompts.push_back(random_prompt(rng, 3 + s % 4));
  expect_graphs_change_nothing(*graphed, *plain, prompts, kSteps, pool);
  const StreamsRun together = decode_streams(*graphed, prompts, kSteps, pool);
  for (int s = 0; s < kStreams; ++s) {
    EXPECT_EQ(together.tokens[static_cast<std::size_t>(s)], run_greedy(*graphed, prompts[static_cast<std::size_t>(s)], kSteps + 1, pool).tokens)
        << "stream " << s;
  }
}

// Decode graphs across the attention's chunk boundaries: 8 streams of heads that split their
// contexts in two on a 132-SM GPU (8 tokens x 32 heads a split; one split on fewer SMs), so the
// chunk doubles as the contexts pass 128 positions, and the graph captured before must not be
// replayed after (the chunk is in the key). Graphs change nothing, bit for bit.
TEST(CudaModel, DecodeGraphsFollowTheAttentionChunkAsContextsGrow) {
  REQUIRE_GPU();
  test::TempDir tmp;
  ThreadPool pool(2);
  SyntheticModelSpec spec;
  spec.preset = "many-heads";
  spec.n_layer = 1, spec.n_embd = 256, spec.n_head = 32, spec.n_head_kv = 8, spec.n_ff = 256, spec.n_vocab = 512;
  const std::string path = tmp.file("many-heads.gguf");
  write_synthetic_model(spec, DType::F16, 5, path, pool);
  const auto file = gguf::File::open(path);
  const auto [graphed, plain] = graphed_and_plain(file);
  std::mt19937 rng(31);
  std::vector<std::vector<std::int32_t>> prompts;
  for (int s = 0; s < 8; ++s) prompts.push_back(random_prompt(rng, 100));
  expect_graphs_change_nothing(*graphed, *plain, prompts, 60, pool);
}

// Two steps of one graph key (20 tokens, 9 rows of logits, one chunk) whose attention differs: a
// 20-token prompt whose last 9 tokens' logits are wanted (two tiles) and a 12-token prompt beside 8
// decoding streams (a tile and 8 lone tokens). Steps with tiles are never graphs (the tiles' count is no
// part of the key), so the second is not the first's replay: the logits are those without graphs.
TEST(CudaModel, StepsWithAttentionTilesAreNotReplayedAsOthers) {
  REQUIRE_GPU();
  test::TempDir tmp;
  ThreadPool pool(2);
  const auto file = gguf::File::open(write_preset(tmp, "tiny", DType::Q4_K, pool));
  const auto [graphed, plain] = graphed_and_plain(file);
  std::mt19937 rng(37);
  const std::vector<std::int32_t> long_prompt = random_prompt(rng, 20), short_prompt = random_prompt(rng, 12);
  std::vector<std::vector<std::int32_t>> contexts;
  for (int s = 0; s < 8; ++s) contexts.push_back(random_prompt(rng, 5 + s));
  const auto run = [&](const Model& model) {
    KvCache cache = model.make_cache(64, KvType::F16, 10);
    std::vector<float> logits;
    for (int s = 0; s < 8; ++s) {  // the decoding streams' contexts, a pass each
      Batch b;
      for (std::size_t i = 0; i < contexts[s].size(); ++i) b.add(contexts[s][i], static_cast<std::int32_t>(i), 2 + s, false);
      model.forward(b, cache, pool, logits);
    }
    std::vector<std::vector<float>> rows;
    Batch first;
    for (std::size_t i = 0; i < long_prompt.size(); ++i) first.add(long_prompt[i], static_cast<std::int32_t>(i), 0, i + 9 >= long_prompt.size());
    model.forward(first, cache, pool, logits);
    rows.push_back(logits);
    Batch second;
    for (std::size_t i = 0; i < short_prompt.size(); ++i) second.add(short_prompt[i], static_cast<std::int32_t>(i), 1, i + 1 == short_prompt.size());
    for (int s = 0; s < 8; ++s) second.add(7 + s, static_cast<std::int32_t>(contexts[s].size()), 2 + s, true);
    model.forward(second, cache, pool, logits);
    rows.push_back(logits);
    return rows;
  };
  const std::vector<std::vector<float>> got = run(*graphed), want = run(*plain);
  ASSERT_EQ(got.size(), want.size());
  for (std::size_t i = 0; i < want.size(); ++i) EXPECT_EQ(got[i], want[i]) << "step " << i;
}

// A token tree after a prompt (two first-level nodes, branches of depth 2 and 3): each node's logits
// as the CPU's, so each sees its context and its own ancestors, never a sibling's branch.
std::vector<std::vector<float>> tree_logits(const Model& model, ThreadPool& pool) {
  KvCache cache = model.make_cache(128, KvType::F16);
  Batch batch;
  const int context = 20;
  for (int i = 0; i < context; ++i) batch.add(1 + (i * 37) % 500, i, 0, i + 1 == context);
  std::vector<float> logits;
  model.forward(batch, cache, pool, logits);
  batch.clear();
  const std::vector<std::int32_t> tokens = {402, 33, 87, 265, 12, 400}, parents = {-1, -1, 0, 2, 1, 0};
  std::vector<std::uint64_t> ancestors(tokens.size());
  std::vector<std::int32_t> depth(tokens.size());
  for (std::size_t i = 0; i < tokens.size(); ++i) {
    const std::int32_t parent = parents[i];
    ancestors[i] = (std::uint64_t{1} << i) | (parent < 0 ? 0 : ancestors[static_cast<std::size_t>(parent)]);
    depth[i] = parent < 0 ? 1 : depth[static_cast<std::size_t>(parent)] + 1;
    batch.add_tree_node(tokens[i], 0, context, static_cast<std::int32_t>(i), depth[i], ancestors[i], true);
  }
  model.forward(batch, cache, pool, logits);
  std::vector<std::vector<float>> rows;
  const std::size_t n_vocab = model.config().n_vocab;
  for (std::size_t i = 0; i < tokens.size(); ++i) rows.emplace_back(logits.begin() + i * n_vocab, logits.begin() + (i + 1) * n_vocab);
  return rows;
}

TEST(CudaModel, TokenTreesAttendAsOnTheCpu) {
  REQUIRE_GPU();
  const auto file = gguf::File::open(shared_model("stories260K.gguf"));
  Model cpu(file);
  const std::unique_ptr<Model> gpu = gpu_model(file);
  ThreadPool pool(2);
  const std::vector<std::vector<float>> want = tree_logits(cpu, pool), got = tree_logits(*gpu, pool);
  ASSERT_EQ(got.size(), want.size());
  for (std::size_t i = 0; i < want.size(); ++i) {
    EXPECT_LT(relative_error(got[i], std::vector<double>(want[i].begin(), want[i].end())), 2e-2) << "node " << i;
  }
}

// The serving engine over a GPU model: a follow-up turn that reuses the first's blocks (its partly
// filled last block copied on the GPU as on the host), a long prompt's chunks beside a decoding
// stream, and n-gram speculation's multi-token verification, all as on the CPU.
struct Streams {
  std::mutex mutex;
  std::condition_variable done;
  std::map<std::uint64_t, std::vector<std::int32_t>> tokens;
  std::map<std::uint64_t, bool> finished;
  Request request(std::vector<std::int32_t> prompt, int n) {
    Request r;
    r.prompt = std::move(prompt);
    r.max_tokens = n;
    r.ignore_eos = true;
    r.sampling.temperature = 0;
    r.on_event = [this](const EngineEvent& e) {
      std::lock_guard lock(mutex);
      if (e.kind == EngineEvent::Kind::Token) {
        tokens[e.request_id].push_back(e.token);
      } else {
        finished[e.request_id] = true;
        done.notify_all();
      }
    };
    return r;
  }
  std::vector<std::int32_t> wait(std::uint64_t id) {
    std::unique_lock lock(mutex);
    EXPECT_TRUE(done.wait_for(lock, std::chrono::seconds(300), [&] { return finished[id]; })) << "request " << id;
    return tokens[id];
  }
};

std::vector<std::vector<std::int32_t>> serve_scenario(const Model& model, const Tokenizer& tokenizer, EngineStats& stats) {
  EngineOptions options;
  options.threads = 2;
  options.max_batch_tokens = 64;  // a 300-token prompt arrives in chunks beside the decoding stream
  options.spec = EngineOptions::Spec::Ngram;
  Engine engine(model, &tokenizer, options);
  Streams s;
  std::mt19937 rng(9);
  const std::vector<std::int32_t> turn1 = random_prompt(rng, 100);
  std::vector<std::vector<std::int32_t>> out;
  out.push_back(s.wait(engine.submit(s.request(turn1, 20))));
  auto turn2 = turn1;  // the history, the answer and a new message: a prefix-cache hit
  turn2.insert(turn2.end(), out.back().begin(), out.back().end());
  for (int i = 0; i < 10; ++i) turn2.push_back(static_cast<std::int32_t>(3 + rng() % 500));
  const auto follow_up = engine.submit(s.request(turn2, 12));
  const std::vector<std::int32_t> long_prompt = random_prompt(rng, 300);
  const auto beside = engine.submit(s.request(long_prompt, 16));
  out.push_back(s.wait(follow_up));
  out.push_back(s.wait(beside));
  stats = engine.stats();
  return out;
}

TEST(CudaEngine, ServingMatchesTheCpuWithPrefixHitsChunksAndSpeculation) {
  REQUIRE_GPU();
  const auto file = gguf::File::open(shared_model("stories260K.gguf"));
  const Tokenizer tokenizer(Vocab::from_gguf(*file));
  Model cpu(file);
  const std::unique_ptr<Model> on_gpu = gpu_model(file);
  Model& gpu = *on_gpu;
  EngineStats on_gpu_stats, on_cpu_stats;
  EXPECT_EQ(serve_scenario(gpu, tokenizer, on_gpu_stats), serve_scenario(cpu, tokenizer, on_cpu_stats));
  // Steps without guesses to verify had their tokens drawn on the GPU; the CPU draws none.
  EXPECT_GT(on_gpu_stats.device_sampled_tokens, 0u);
  EXPECT_LT(on_gpu_stats.device_sampled_tokens, on_gpu_stats.generation_tokens);  // speculation's went through the host
  EXPECT_EQ(on_cpu_stats.device_sampled_tokens, 0u);
}

// Sampled streams (temperature, top-k, top-p, min-p) draw on the GPU with their seeds' uniforms: a
// seed gives the same tokens again, another seed other tokens. A stream whose logits the host must
// see (log-probabilities here) is picked on the host, beside them.
TEST(CudaEngine, SampledStreamsDrawOnTheGpuFromTheirSeeds) {
  REQUIRE_GPU();
  const auto file = gguf::File::open(shared_model("stories260K.gguf"));
  const Tokenizer tokenizer(Vocab::from_gguf(*file));
  const std::unique_ptr<Model> on_gpu = gpu_model(file);
  EngineOptions options;
  options.threads = 2;
  Engine engine(*on_gpu, &tokenizer, options);
  Streams s;
  const auto sampled = [&](std::uint64_t seed, bool logprobs) {
    Request r = s.request({1, 400, 33, 89, 265}, 48);
    r.sampling = SamplingParams{};  // temperature 0.8, top-k 40, top-p 0.95, min-p 0.05
    r.sampling.temperature = 1.2f;  // a flatter distribution: seeds part sooner
    r.sampling.seed = seed;
    if (logprobs) r.top_logprobs = 2;
    return engine.submit(std::move(r));
  };
  const auto a = sampled(1, false), b = sampled(1, false), c = sampled(2, false), host = sampled(1, true);
  const std::vector<std::int32_t> ta = s.wait(a), tb = s.wait(b), tc = s.wait(c);
  s.wait(host);
  EXPECT_EQ(ta.size(), 48u);
  EXPECT_EQ(ta, tb);
  EXPECT_NE(ta, tc);
  EXPECT_EQ(engine.stats().device_sampled_tokens, 3u * 48u);
}

// Speculation with a draft model, both on the GPU (as `--device cuda --draft FILE` loads them: the
// draft's float matrices as Q8_0), as chains and as token trees (the draft grows them on the GPU,
// the target verifies them there, the accepted path's K/V moved into place by the device): the code
// pair's greedy streams, token for token as the CPU engine with the same pair gives them, with
// guesses accepted as often.
std::vector<std::int32_t> draft_speculation(const Model& target, const Model& draft, const Tokenizer& tokenizer, EngineStats& stats,
                                            EngineOptions::Spec mode) {
  EngineOptions options;
  options.threads = 2;
  options.spec = mode;
  options.draft = &draft;
  options.spec_tokens = mode == EngineOptions::Spec::Tree ? spec::kDefaultTreeNodes : 4;
  Engine engine(target, &tokenizer, options);
  Streams s;
  const std::vector<std::int32_t> prompt = tokenizer.encode("def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n", true);
  std::vector<std::int32_t> out = s.wait(engine.submit(s.request(prompt, 48)));
  stats = engine.stats();
  return out;
}

TEST(CudaEngine, DraftModelSpeculatesOnTheGpuInChainsAndTrees) {
  REQUIRE_GPU();
  const std::string target_path = shared_model("code/code-target-f16.gguf"), draft_path = shared_model("code/code-draft-f16.gguf");
  if (!std::filesystem::exists(target_path) || !std::filesystem::exists(draft_path)) GTEST_SKIP() << "the code models are missing";
  const auto target_file = gguf::File::open(target_path), draft_file = gguf::File::open(draft_path);
  const Tokenizer tokenizer(Vocab::from_gguf(*target_file));
  ModelLoadOptions as_q8;
  as_q8.float_matrices_as = DType::Q8_0;
  ModelLoadOptions as_q8_on_gpu = as_q8;
  as_q8_on_gpu.keep_file_layout = true;
  Model draft_gpu(draft_file, nullptr, as_q8_on_gpu);
  place_on_device(draft_gpu, parse_device("cuda"));
  ASSERT_NE(draft_gpu.device(), nullptr);
  const std::unique_ptr<Model> target_gpu = gpu_model(target_file);
  Model target_cpu(target_file), draft_cpu(draft_file, nullptr, as_q8);
  for (const auto mode : {EngineOptions::Spec::Draft, EngineOptions::Spec::Tree}) {
    const char* name = mode == EngineOptions::Spec::Tree ? "tree" : "chain";
    EngineStats on_gpu, on_cpu;
    const std::vector<std::int32_t> got = draft_speculation(*target_gpu, draft_gpu, tokenizer, on_gpu, mode);
    EXPECT_EQ(got, draft_speculation(target_cpu, draft_cpu, tokenizer, on_cpu, mode)) << name;
    EXPECT_EQ(got.size(), 48u) << name;
    // A draft that guessed wrong would only cost speed: its guesses are held to the CPU draft's.
    EXPECT_GE(on_gpu.spec_accepted_tokens * 10, on_cpu.spec_accepted_tokens * 9)
        << name << ": " << on_gpu.spec_accepted_tokens << " of " << on_gpu.spec_draft_tokens << " guesses accepted on the GPU, "
        << on_cpu.spec_accepted_tokens << " of " << on_cpu.spec_draft_tokens << " on the CPU";
    EXPECT_GT(on_cpu.spec_accepted_tokens, 10u) << name;
  }
}

// The KV spool on a GPU (on by default in serve): a conversation's blocks are copied back and
// written behind the steps, and after a restart read back into device memory, the follow-up
// prefilling only its new tokens and answering as before. The files are a host pool's blocks: a CPU
// engine reads the GPU's and answers as it does from its own computation.
struct SpoolRun {
  std::vector<std::int32_t> tokens;
  std::uint64_t hit_blocks = 0, written = 0, evicted = 0;
};

// Each prompt in turn (the tokens of the last), then the spool flushed; kv_memory 0: the default budget.
SpoolRun run_with_spool(const Model& model, const Tokenizer& tokenizer, const std::string& dir,
                        const std::vector<std::vector<std::int32_t>>& prompts, std::size_t kv_memory = 0) {
  EngineOptions options;
  options.threads = 2;
  options.kv_spool_dir = dir;
  options.spec = EngineOptions::Spec::None;
  options.kv_memory = kv_memory;
  Engine engine(model, &tokenizer, options);
  Streams s;
  SpoolRun run;
  for (const auto& prompt : prompts) run.tokens = s.wait(engine.submit(s.request(prompt, 16)));
  EXPECT_TRUE(engine.flush_spool(std::chrono::steady_clock::now() + std::chrono::seconds(60)));
  const EngineStats st = engine.stats();
  run.hit_blocks = st.spool_hit_blocks;
  run.evicted = st.evicted_blocks;
  run.written = engine.spool()->stats().written;
  EXPECT_EQ(engine.spool()->stats().write_dropped, 0u);
  return run;
}

TEST(CudaEngine, KvSpoolSurvivesARestartAndIsTheCpusFormat) {
  REQUIRE_GPU();
  const auto file = gguf::File::open(shared_model("stories260K.gguf"));
  const Tokenizer tokenizer(Vocab::from_gguf(*file));
  const std::unique_ptr<Model> on_gpu = gpu_model(file);
  Model cpu(file);
  test::TempDir tmp;
  const std::string dir = tmp.file("spool");
  std::mt19937 rng(21);
  const std::vector<std::int32_t> prompt = random_prompt(rng, 150);
  const std::size_t whole_blocks = (prompt.size() - 1) / KvCache::kDefaultBlockTokens;  // 9: the last token is always computed

  const SpoolRun first = run_with_spool(*on_gpu, tokenizer, dir, {prompt});
  EXPECT_EQ(first.hit_blocks, 0u);
  EXPECT_GE(first.written, whole_blocks);
  const SpoolRun again = run_with_spool(*on_gpu, tokenizer, dir, {prompt});  // a restarted server
  EXPECT_EQ(again.hit_blocks, whole_blocks);
  EXPECT_EQ(again.tokens, first.tokens);
  const SpoolRun on_cpu = run_with_spool(cpu, tokenizer, dir, {prompt});  // the GPU's files, read by the CPU
  EXPECT_EQ(on_cpu.hit_blocks, whole_blocks);
  test::TempDir fresh;
  EXPECT_EQ(on_cpu.tokens, run_with_spool(cpu, tokenizer, fresh.file("spool"), {prompt}).tokens);
}

// `promptly run --kv-spool` on the GPU (engine/generate.cpp): the prompt's blocks spooled after its
// prefill, read back into device memory by the next run before any pass, the same greedy text.
TEST(CudaEngine, RunReadsItsSpooledPromptBackIntoTheGpu) {
  REQUIRE_GPU();
  const auto file = gguf::File::open(shared_model("stories260K.gguf"));
  const Tokenizer tokenizer(Vocab::from_gguf(*file));
  const std::unique_ptr<Model> on_gpu = gpu_model(file);
  test::TempDir tmp;
  GenerateOptions options;
  options.max_tokens = 16;
  options.ignore_eos = true;
  options.sampling.temperature = 0;
  options.kv_spool_dir = tmp.file("spool");
  ThreadPool pool(2);
  std::mt19937 rng(44);
  const std::vector<std::int32_t> prompt = random_prompt(rng, 70);
  const GenerateResult cold = generate(*on_gpu, tokenizer, prompt, options, pool);
  EXPECT_EQ(cold.timings.n_spooled, 0u);
  const GenerateResult warm = generate(*on_gpu, tokenizer, prompt, options, pool);
  EXPECT_EQ(warm.timings.n_spooled, (prompt.size() - 1) / KvCache::kDefaultBlockTokens * KvCache::kDefaultBlockTokens);  // 64
  EXPECT_EQ(warm.ids, cold.ids);
  EXPECT_EQ(cold.ids.size(), 16u);
}

// A pass the engine stops at a layer boundary (a newcomer given way to, stop_before) returns false
// after asking about each layer from the second up to the one it stopped before; the same batch
// run again whole gives what a pass never stopped gives.
TEST(CudaModel, APassStoppedAtALayerBoundaryRunsAgainWhole) {
  REQUIRE_GPU();
  const auto file = gguf::File::open(shared_model("stories260K.gguf"));
  const std::unique_ptr<Model> on_gpu = gpu_model(file);
  ASSERT_GE(on_gpu->config().n_layer, 4u);
  ThreadPool pool(2);
  Batch batch;
  for (int i = 0; i < 30; ++i) batch.add(1 + (i * 31) % 400, i, 0, i + 1 == 30);
  std::vector<float> want, got;
  KvCache fresh = on_gpu->make_cache(64, KvType::F16);
  ASSERT_TRUE(on_gpu->forward(batch, fresh, pool, want));
  KvCache cache = on_gpu->make_cache(64, KvType::F16);
  std::vector<std::size_t> asked;
  const auto stop_at_3 = [&](std::size_t layer) {
    asked.push_back(layer);
    return layer == 3;
  };
  EXPECT_FALSE(on_gpu->forward(batch, cache, pool, got, stop_at_3));
  EXPECT_EQ(asked, (std::vector<std::size_t>{1, 2, 3}));
  ASSERT_TRUE(on_gpu->forward(batch, cache, pool, got));
  EXPECT_EQ(got, want);
}

// Rows the pool logged after a pass (a token tree's accepted path moved into place, copy-on-write)
// are on the device only once replayed. A block saved for the spool before the next pass goes with
// them in place, and a block read from the spool is not overwritten by a logged copy into it that
// the next pass would have replayed.
TEST(CudaKvStore, SavesAndLoadsFollowTheLoggedRowCopies) {
  REQUIRE_GPU();
  const auto file = gguf::File::open(shared_model("stories260K.gguf"));
  const std::unique_ptr<Model> on_gpu = gpu_model(file);
  const ModelConfig& c = on_gpu->config();
  ThreadPool pool(2);
  KvCache cache = on_gpu->make_cache(128, KvType::F16);
  Batch batch;
  for (int i = 0; i < 40; ++i) batch.add(1 + (i * 29) % 400, i, 0, i + 1 == 40);
  std::vector<float> logits;
  on_gpu->forward(batch, cache, pool, logits);
  KvCache::DeviceState* device = cache.device_state();
  ASSERT_NE(device, nullptr);
  const auto save = [&](int block) {
    const std::shared_ptr<PendingBlock> pending = device->save_block(block);
    EXPECT_NE(pending, nullptr);
    const std::span<const std::uint8_t> bytes = pending ? pending->wait() : std::span<const std::uint8_t>{};
    return std::vector<std::uint8_t>(bytes.begin(), bytes.end());
  };
  // A block's bytes: for each layer, keys then values, each [head][slot][element] as halves.
  const std::size_t bt = cache.block_tokens(), hd = c.head_dim, row_bytes = hd * sizeof(std::uint16_t);
  const std::size_t part_bytes = c.n_head_kv * bt * row_bytes;
  const auto with_row_copied = [&](std::vector<std::uint8_t> image, std::size_t from_slot, std::size_t to_slot) {
    for (std::size_t part = 0; part < 2 * c.n_layer; ++part) {
      for (std::size_t kh = 0; kh < c.n_head_kv; ++kh) {
        const std::size_t head = part * part_bytes + kh * bt * row_bytes;
        std::copy_n(image.begin() + static_cast<std::ptrdiff_t>(head + from_slot * row_bytes), row_bytes,
                    image.begin() + static_cast<std::ptrdiff_t>(head + to_slot * row_bytes));
      }
    }
    return image;
  };
  const int first = cache.blocks(0)[0], second = cache.blocks(0)[1];
  const std::vector<std::uint8_t> before = save(first);
  ASSERT_EQ(before.size(), 2 * c.n_layer * part_bytes);
  cache.pool().copy_row(first, 1, first, 5);  // logged, as accepting a tree's path does
  const std::vector<std::uint8_t> moved = save(first);
  EXPECT_NE(moved, before) << "rows 1 and 5 held the same";
  EXPECT_EQ(moved, with_row_copied(before, 1, 5)) << "the block went to the spool without its logged row copy";
  EXPECT_TRUE(cache.pool().copies().empty()) << "replayed, so the next pass must not replay it again";
  EXPECT_EQ(save(first), moved);
  // A copy into `second` logged, then `second` read from the spool: what was read stays, past the
  // next pass.
  cache.pool().copy_row(first, 2, second, 3);
  std::vector<std::uint8_t> read(before.size());
  for (std::size_t i = 0; i < read.size(); i += 2) read[i] = static_cast<std::uint8_t>(i / 2 % 251), read[i + 1] = 0x3c;  // small halves
  EXPECT_TRUE(device->load_block(second)(read));
  batch.clear();
  batch.add(7, 40, 0, true);
  on_gpu->forward(batch, cache, pool, logits);
  EXPECT_EQ(save(second), read) << "a logged copy replayed over what the spool read into the block";
}

// Blocks taken again right after their copies back were queued: with room for one conversation
// only, the next prompt's first step writes into the blocks the last one just finished (evicted
// from the prefix tree). Its writes wait for those copies (DeviceKvStore::order_writes_after_saves),
// so what the spool holds of each conversation is still that conversation's: read back after a
// restart, each answers as it did.
TEST(CudaEngine, KvSpoolCopiesFinishBeforeTheirBlocksAreReused) {
  REQUIRE_GPU();
  const auto file = gguf::File::open(shared_model("stories260K.gguf"));
  const Tokenizer tokenizer(Vocab::from_gguf(*file));
  const std::unique_ptr<Model> on_gpu = gpu_model(file);
  test::TempDir tmp;
  const std::string dir = tmp.file("spool");
  std::mt19937 rng(33);
  std::vector<std::vector<std::int32_t>> prompts;
  for (int i = 0; i < 4; ++i) prompts.push_back(random_prompt(rng, 150));
  const std::size_t tight = 12 * on_gpu->device()->kv_block_bytes(KvCache::kDefaultBlockTokens);  // 192 positions: one conversation
  std::vector<std::vector<std::int32_t>> answers;
  for (const auto& p : prompts) answers.push_back(run_with_spool(*on_gpu, tokenizer, tmp.file("alone"), {p}).tokens);
  EXPECT_GE(run_with_spool(*on_gpu, tokenizer, dir, prompts, tight).evicted, 3 * 9u);  // each next prompt took the last one's blocks
  for (std::size_t i = 0; i < prompts.size(); ++i) {
    const SpoolRun back = run_with_spool(*on_gpu, tokenizer, dir, {prompts[i]});
    EXPECT_EQ(back.hit_blocks, (prompts[i].size() - 1) / KvCache::kDefaultBlockTokens) << "conversation " << i;
    EXPECT_EQ(back.tokens, answers[i]) << "conversation " << i;
  }
}

}  // namespace
}  // namespace promptly::backend::cuda
