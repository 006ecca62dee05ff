// Sampler micro-benchmark (Google Benchmark): one token drawn from a vocabulary of random logits,
// per filter setting, at Llama-2 (32000) and Qwen3 (151936) vocabulary sizes. The sampler runs on
// the engine thread once per stream and step, so its time adds to every stream's inter-token gap.
//   build/release/promptly_bench_sampling
#include <benchmark/benchmark.h>

#include <random>
#include <vector>

#include "sampling/sampler.h"

namespace promptly {
namespace {

enum Setting { kGreedy, kOpenAiDefaults, kTopP, kMinP, kLlamaCppDefaults };

void BM_Sample(benchmark::State& state) {
  const auto n_vocab = static_cast<std::size_t>(state.range(0));
  SamplingParams p;  // llama.cpp's defaults: temperature 0.8, top-k 40, top-p 0.95, min-p 0.05
  switch (static_cast<Setting>(state.range(1))) {
    case kGreedy: p.temperature = 0; break;
    case kOpenAiDefaults: p = {1.0f, 0, 1.0f, 0.0f}; break;  // temperature 1, nothing filtered
    case kTopP: p = {0.7f, 0, 0.9f, 0.0f}; break;
    case kMinP: p = {1.0f, 0, 1.0f, 0.05f}; break;
    case kLlamaCppDefaults: break;
  }
  std::mt19937 rng(3);
  std::normal_distribution<float> dist(0.0f, 3.0f);
  std::vector<float> logits(n_vocab), work(n_vocab);
  for (float& v : logits) v = dist(rng);
  Sampler sampler(p);
  const std::vector<std::int32_t> history;
  for (auto _ : state) {
    state.PauseTiming();
    work = logits;  // the sampler may change them (penalties)
    state.ResumeTiming();
    benchmark::DoNotOptimize(sampler.sample(work.data(), n_vocab, history));
  }
}
BENCHMARK(BM_Sample)
    ->ArgsProduct({{32000, 151936}, {kGreedy, kOpenAiDefaults, kTopP, kMinP, kLlamaCppDefaults}})
    ->ArgNames({"vocab", "setting"})
    ->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace promptly

BENCHMARK_MAIN();
