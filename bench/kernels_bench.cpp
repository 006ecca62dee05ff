// Kernel micro-benchmarks (Google Benchmark): matmul per weight type and kernel path, for decode
// (1 token), batched-decode (8, 64) and prompt-sized (512) inputs at TinyLlama's 2048 x 2048 shape, in
// the layout the model loader would give that path (16-row interleaved on AVX-512 and AMX).
//   build/release/promptly_bench_kernels --benchmark_filter=Q4_0
#include <benchmark/benchmark.h>

#include <algorithm>
#include <numeric>
#include <random>
#include <vector>

#include "kernels/cpu.h"
#include "kernels/dispatch.h"
#include "kernels/matmul.h"
#include "tensor/quant.h"
#include "util/huge_pages.h"

namespace promptly::kernels {
namespace {

struct Fixture {
  std::vector<std::uint8_t> w, packed;
  std::vector<float> x, y;
  WeightMatrix m;
  Fixture(DType type, std::size_t rows, std::size_t cols, std::size_t tokens) {
    std::mt19937 rng(1);
    std::normal_distribution<float> dist;
    std::vector<float> row(cols);
    w.resize(rows * row_bytes(type, cols));
    for (std::size_t r = 0; r < rows; ++r) {
      for (float& v : row) v = dist(rng);
      quantize_row(type, row.data(), w.data() + r * row_bytes(type, cols), cols);
    }
    x.resize(tokens * cols);
    for (float& v : x) v = dist(rng);
    y.resize(tokens * rows);
    m = {type, w.data(), rows, cols};
  }
  // The layout the model loader gives this path (repack_for_kernels): 16-row interleaved on AVX-512 / AMX.
  void layout_for(Isa isa) {
    if (static_cast<int>(isa) < static_cast<int>(Isa::Avx512) || !can_repack_x16(m)) return;
    packed.resize(repacked_bytes(m));
    m.layout = repack_x16(m, packed.data());
    m.data = packed.data();
  }
};

void BM_Matmul(benchmark::State& state, DType type, Isa isa) {
  if (static_cast<int>(isa) > static_cast<int>(best_isa())) {
    state.SkipWithError("CPU lacks this path");
    return;
  }
  set_isa(isa);
  const std::size_t tokens = static_cast<std::size_t>(state.range(0)), threads = static_cast<std::size_t>(state.range(1));
  Fixture f(type, 2048, 2048, tokens);
  f.layout_for(isa);
  ThreadPool pool(static_cast<int>(threads));
  for (auto _ : state) {
    matmul(f.m, f.x.data(), tokens, f.y.data(), pool);
    benchmark::DoNotOptimize(f.y.data());
  }
  const double macs = 2048.0 * 2048.0 * static_cast<double>(tokens);
  state.counters["GFLOP/s"] = benchmark::Counter(2 * macs, benchmark::Counter::kIsIterationInvariantRate, benchmark::Counter::kIs1000);
  state.counters["weight_GB/s"] =
      benchmark::Counter(static_cast<double>(f.w.size()), benchmark::Counter::kIsIterationInvariantRate, benchmark::Counter::kIs1000);
  set_isa(best_isa());
}

// Decode as the model sees it: weights that are not in any cache. 32 copies of one matrix of ~11.5M
// weights (~200 MB in Q4_0, twice the L3) taken in turn, so each call streams its weights from DRAM;
// weight_GB/s against the machine's read bandwidth says how close a decode step is to its floor.
// Rows of 5632 weights (TinyLlama's ffn_down) or of 768 (the 125m shape), where a row is only a
// few cache lines and hardware prefetchers see short streams.
void BM_MatmulStreaming(benchmark::State& state, DType type) {
  set_isa(best_isa());
  const std::size_t tokens = static_cast<std::size_t>(state.range(0)), threads = static_cast<std::size_t>(state.range(1));
  const std::size_t cols = static_cast<std::size_t>(state.range(2)), rows = 2048 * 5632 / cols / 16 * 16;
  constexpr std::size_t kCopies = 32;
  Fixture f(type, rows, cols, tokens);
  f.layout_for(best_isa());
  const std::vector<std::uint8_t>& one = f.packed.empty() ? f.w : f.packed;
  std::vector<std::uint8_t> copies(kCopies * one.size());
  for (std::size_t c = 0; c < kCopies; ++c) std::copy(one.begin(), one.end(), copies.begin() + static_cast<std::ptrdiff_t>(c * one.size()));
  ThreadPool pool(static_cast<int>(threads));
  std::size_t next = 0;
  for (auto _ : state) {
    WeightMatrix m = f.m;
    m.data = copies.data() + (next++ % kCopies) * one.size();
    matmul(m, f.x.data(), tokens, f.y.data(), pool);
    benchmark::DoNotOptimize(f.y.data());
  }
  state.counters["weight_GB/s"] =
      benchmark::Counter(static_cast<double>(one.size()), benchmark::Counter::kIsIterationInvariantRate, benchmark::Counter::kIs1000);
}
#define PROMPTLY_STREAMING_BENCH(TYPE)                  \
  BENCHMARK_CAPTURE(BM_MatmulStreaming, TYPE, DType::TYPE) \
      ->ArgsProduct({{1, 4, 8}, {1, 2}, {5632, 2048, 768, 512}})       \
      ->ArgNames({"tokens", "threads", "cols"})            \
      ->Unit(benchmark::kMicrosecond)                      \
      ->UseRealTime();

PROMPTLY_STREAMING_BENCH(Q4_0)
PROMPTLY_STREAMING_BENCH(Q8_0)
PROMPTLY_STREAMING_BENCH(F16)

// n_q random queries of one KV head, each seeing n_ctx positions, with their output rows.
struct QueryTile {
  QueryTile(std::size_t n_q, std::size_t head_dim, std::size_t n_ctx, std::mt19937& rng)
      : q(n_q, std::vector<float>(head_dim)), out(q), ctx(n_q, n_ctx) {
    std::normal_distribution<float> dist;
    for (std::size_t i = 0; i < n_q; ++i) {
      for (float& x : q[i]) x = dist(rng);
      qp.push_back(q[i].data());
      op.push_back(out[i].data());
    }
  }
  std::vector<std::vector<float>> q, out;
  std::vector<std::size_t> ctx;
  std::vector<const float*> qp;
  std::vector<float*> op;
};

// Attention of one KV head's query tile over a long F16 context (TinyLlama's head_dim 64, 16-token
// pages, rows of 4 KV heads): what a prefill chunk costs per tile late in a 2048-token prompt.
void BM_AttentionTile(benchmark::State& state) {
  set_isa(best_isa());
  const std::size_t n_q = static_cast<std::size_t>(state.range(0)), n_ctx = static_cast<std::size_t>(state.range(1));
  constexpr std::size_t kHeadDim = 64, kStride = 4 * kHeadDim, kBlock = 16;
  std::mt19937 rng(3);
  std::normal_distribution<float> dist;
  std::vector<std::uint16_t> keys(n_ctx * kStride), values(n_ctx * kStride);
  for (auto* cache : {&keys, &values}) {
    std::vector<float> row(kStride);
    for (std::size_t j = 0; j < n_ctx; ++j) {
      for (float& v : row) v = dist(rng);
      quantize_row(DType::F16, row.data(), reinterpret_cast<std::uint8_t*>(cache->data() + j * kStride), kStride);
    }
  }
  std::vector<const void*> kb, vb;
  for (std::size_t j = 0; j < n_ctx; j += kBlock) {
    kb.push_back(keys.data() + j * kStride);
    vb.push_back(values.data() + j * kStride);
  }
  QueryTile tile(n_q, kHeadDim, n_ctx, rng);
  const KernelTable& kt = kernel_table(best_isa());
  for (auto _ : state) {
    kt.attention_tile(tile.qp.data(), nullptr, tile.ctx.data(), n_q, kb.data(), vb.data(), DType::F16, kBlock, kStride, 0, kHeadDim,
                      0.125f, 0.0f, tile.op.data(), nullptr);
    benchmark::DoNotOptimize(tile.out[0].data());
  }
  state.counters["GFLOP/s"] = benchmark::Counter(4.0 * static_cast<double>(n_q * n_ctx * kHeadDim), benchmark::Counter::kIsIterationInvariantRate,
                                                 benchmark::Counter::kIs1000);
}
BENCHMARK(BM_AttentionTile)->ArgsProduct({{1, 8, 16, 32, 64}, {128, 2048}})->ArgNames({"queries", "ctx"})->Unit(benchmark::kMicrosecond);

// The same tile reading its keys as the engine does late in a long conversation: from 16-token blocks
// scattered over a pool far larger than the caches (32 sequences of 4096 positions, 4 KV heads, F16:
// 256 MB of K and V), one sequence after another, so every iteration's keys come from DRAM. Within a
// block the rows are stored head by head as the engine's are (head 0's 16 rows first, stride 64).
// The pool is on huge pages as the engine's is (huge:1), or on 4 KiB pages (huge:0), where nearly
// every block is also a TLB miss.
void BM_AttentionTilePaged(benchmark::State& state) {
  set_isa(best_isa());
  const std::size_t n_q = static_cast<std::size_t>(state.range(0));
  const bool huge = state.range(1) != 0;
  constexpr std::size_t kHeadDim = 64, kStride = 4 * kHeadDim, kBlock = 16, kCtx = 4096, kSeqs = 32;
  constexpr std::size_t kBlocksPerSeq = kCtx / kBlock, kPoolBlocks = kSeqs * kBlocksPerSeq;
  constexpr std::size_t kElements = kPoolBlocks * kBlock * kStride;
  std::mt19937 rng(5);
  HugePageBuffer huge_pool(huge ? 2 * kElements * sizeof(std::uint16_t) : 0);
  std::vector<std::uint16_t> small_pool(huge ? 0 : 2 * kElements);
  auto* keys = huge ? reinterpret_cast<std::uint16_t*>(huge_pool.data()) : small_pool.data();
  auto* values = keys + kElements;
  {
    std::normal_distribution<float> dist;
    std::vector<float> row(4096);
    for (std::size_t i = 0; i < 2 * kElements; i += row.size()) {
      for (float& v : row) v = dist(rng);
      quantize_row(DType::F16, row.data(), reinterpret_cast<std::uint8_t*>(keys + i), row.size());
    }
  }
  std::vector<std::size_t> order(kPoolBlocks);
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::shuffle(order.begin(), order.end(), rng);
  std::vector<std::vector<const void*>> kb(kSeqs), vb(kSeqs);
  for (std::size_t s = 0; s < kSeqs; ++s) {
    for (std::size_t b = 0; b < kBlocksPerSeq; ++b) {
      const std::size_t block = order[s * kBlocksPerSeq + b];
      kb[s].push_back(keys + block * kBlock * kStride);
      vb[s].push_back(values + block * kBlock * kStride);
    }
  }
  QueryTile tile(n_q, kHeadDim, kCtx, rng);
  const KernelTable& kt = kernel_table(best_isa());
  std::size_t seq = 0;
  for (auto _ : state) {
    kt.attention_tile(tile.qp.data(), nullptr, tile.ctx.data(), n_q, kb[seq].data(), vb[seq].data(), DType::F16, kBlock, kHeadDim, 0,
                      kHeadDim, 0.125f, 0.0f, tile.op.data(), nullptr);
    benchmark::DoNotOptimize(tile.out[0].data());
    seq = (seq + 1) % kSeqs;
  }
  state.counters["GFLOP/s"] = benchmark::Counter(4.0 * static_cast<double>(n_q * kCtx * kHeadDim), benchmark::Counter::kIsIterationInvariantRate,
                                                 benchmark::Counter::kIs1000);
}
BENCHMARK(BM_AttentionTilePaged)->ArgsProduct({{8, 32, 64}, {0, 1}})->ArgNames({"queries", "huge"})->Unit(benchmark::kMicrosecond);

#define PROMPTLY_MATMUL_BENCH(TYPE, ISA)                                                        \
  BENCHMARK_CAPTURE(BM_Matmul, TYPE##_##ISA, DType::TYPE, Isa::ISA)                              \
      ->ArgsProduct({{1, 8, 64, 512}, {1, 2}})                                                   \
      ->ArgNames({"tokens", "threads"})                                                          \
      ->Unit(benchmark::kMicrosecond)                                                            \
      ->UseRealTime();

PROMPTLY_MATMUL_BENCH(Q4_0, Scalar)
PROMPTLY_MATMUL_BENCH(Q4_0, Avx2)
PROMPTLY_MATMUL_BENCH(Q4_0, Avx512)
PROMPTLY_MATMUL_BENCH(Q8_0, Avx2)
PROMPTLY_MATMUL_BENCH(Q4_0, Amx)
PROMPTLY_MATMUL_BENCH(Q8_0, Avx512)
PROMPTLY_MATMUL_BENCH(Q8_0, Amx)
PROMPTLY_MATMUL_BENCH(F16, Avx512)
PROMPTLY_MATMUL_BENCH(Q4_K, Avx512)
PROMPTLY_MATMUL_BENCH(Q6_K, Avx512)

}  // namespace
}  // namespace promptly::kernels

BENCHMARK_MAIN();
