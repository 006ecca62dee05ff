// `promptly bench model`: prompt processing and generation speed like llama-bench, set against this
// machine's floors measured in the same run (memory read bandwidth for decode, int8 peak for prefill).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <numeric>
#include <random>
#include <vector>

#include "cli/commands.h"
#include "cli/stats.h"
#include "model/builtin_model.h"
#include "gguf/gguf.h"
#include "kernels/cpu.h"
#include "kernels/matmul.h"
#include "model/model.h"
#include "sampling/sampler.h"
#include "server/api.h"
#include "util/clock.h"
#include "util/error.h"
#include "util/process.h"

namespace promptly::cli {
namespace {

// Read bandwidth with the benchmark's thread count: a 1 GiB buffer, far larger than any cache
// (L3 here is 260 MB), streamed by all threads two ways — through the active path's vector dot
// product, and touching one word per cache line with software prefetch ahead (what the decode
// kernels do) — the best pass of either. The floor must not flatter the kernels: it is the fastest
// read this machine showed in this run.
double measure_read_bandwidth_gbs(ThreadPool& pool) {
  const std::size_t n = (std::size_t{1} << 30) / sizeof(float);
  std::unique_ptr<float[]> buf(new float[n]);
  pool.parallel_for(n, 1 << 16, [&](std::size_t b, std::size_t e, int) { std::fill(buf.get() + b, buf.get() + e, 1.0f); });
  double best = 0;
  std::vector<double> sink(static_cast<std::size_t>(pool.size()) * 8);
  for (int rep = 0; rep < 3; ++rep) {
    const auto t0 = SteadyClock::now();
    pool.parallel_for(n, 1 << 16, [&](std::size_t b, std::size_t e, int tid) {
      sink[static_cast<std::size_t>(tid) * 8] += kernels::dot_f32(buf.get() + b, buf.get() + b, e - b);
    });
    best = std::max(best, static_cast<double>(n * sizeof(float)) / seconds_since(t0) / 1e9);
    const auto t1 = SteadyClock::now();
    pool.parallel_for(n, 1 << 16, [&](std::size_t b, std::size_t e, int tid) {
      constexpr std::size_t kLine = 64 / sizeof(float), kAhead = 2048 / sizeof(float);
      float acc[4] = {0, 0, 0, 0};
      const float* p = buf.get();
      for (std::size_t i = b; i + 4 * kLine <= e; i += 4 * kLine) {
        __builtin_prefetch(p + i + kAhead);
        __builtin_prefetch(p + i + kAhead + kLine);
        __builtin_prefetch(p + i + kAhead + 2 * kLine);
        __builtin_prefetch(p + i + kAhead + 3 * kLine);
        for (int u = 0; u < 4; ++u) acc[u] += p[i + static_cast<std::size_t>(u) * kLine];
      }
      sink[static_cast<std::size_t>(tid) * 8] += acc[0] + acc[1] + acc[2] + acc[3];
    });
    best = std::max(best, static_cast<double>(n * sizeof(float)) / seconds_since(t1) / 1e9);
  }
  if (std::accumulate(sink.begin(), sink.end(), 0.0) == 42.0) std::fputc(' ', stderr);  // keep the reads
  return best;
}

// The int8 dot-product throughput of the active path with the benchmark's thread count, on
// registers only (see KernelTable::int8_throughput_probe): best of five ~0.1 s passes, in TOPS
// (a multiply-add counts as two operations), or 0 where the path has no probe. Why measured: the
// nominal peak (--int8-peak-tops) assumes the cores' full clock with both vector ports busy; in a
// shared VM the clock under 512-bit load is lower, and the prefill fraction should say against
// what the kernels actually compete.
double measure_int8_tops(ThreadPool& pool) {
  const auto probe = kernels::kernel_table(kernels::active_isa()).int8_throughput_probe;
  if (probe == nullptr) return 0.0;
  // ~0.1 s at ~4.5e9 instructions per second and core, in many small pieces: the pool's threads
  // claim pieces as they go, so one that a stall holds back does less, and the pass ends when the
  // work does (one piece per thread would time the slowest thread doing two).
  constexpr std::size_t kRoundsPerPiece = 1 << 14, kPiecesPerThread = 64;
  const std::size_t threads = static_cast<std::size_t>(pool.size()), pieces = threads * kPiecesPerThread;
  std::vector<std::int64_t> sink(threads * 8);
  double best = 0;
  for (int rep = 0; rep < 5; ++rep) {
    const auto t0 = SteadyClock::now();
    pool.parallel_for(pieces, 1, [&](std::size_t b, std::size_t e, int tid) {
      for (std::size_t i = b; i < e; ++i) sink[static_cast<std::size_t>(tid) * 8] += probe(kRoundsPerPiece);
    });
    const double ops = 2.0 * static_cast<double>(pieces * kRoundsPerPiece * kernels::kInt8ProbeMacsPerRound);
    best = std::max(best, ops / seconds_since(t0) / 1e12);
  }
  if (std::accumulate(sink.begin(), sink.end(), std::int64_t{0}) == 42) std::fputc(' ', stderr);  // keep the work
  return best;
}

const BenchDraw& draw_named(const std::string& name) {
  for (const BenchDraw& d : bench_model_draws()) {
    if (d.name == name) return d;
  }
  std::string names;
  for (const BenchDraw& d : bench_model_draws()) names += (names.empty() ? "" : ", ") + d.name;
  throw Error("bench model: no draw named '" + name + "' (--sample takes " + names + ")");
}

}  // namespace

const std::vector<BenchDraw>& bench_model_draws() {
  // The server follows the OpenAI API, whose requests filter nothing unless they ask; run and the
  // library default to llama.cpp's filters. Each is a different path through a sampler (the GPU's
  // radix selects run for top-k and top-p over the whole row, not for a plain draw).
  static const std::vector<BenchDraw> draws = {
      {"run", SamplingParams{}, "run's defaults: temperature 0.8, top-k 40, top-p 0.95, min-p 0.05"},
      {"api", server::ApiRequest{}.sampling(), "an API request that sets nothing: temperature 1 over the whole vocabulary"},
      {"top-p", [] { server::ApiRequest r; r.top_p = 0.95f; return r.sampling(); }(),
       "an API request that sets top_p 0.95 alone: top-p over the whole vocabulary"},
  };
  return draws;
}

int bench_model(const BenchModelOptions& o) {
  const int threads = o.threads > 0 ? o.threads : default_thread_count();
  const backend::DeviceSpec device = resolve_device(o.device);
  std::shared_ptr<const gguf::File> file = open_model_file(o.model);
  const auto tp = join_tensor_parallel(o.tp);
  const std::unique_ptr<Model> loaded = load_model(file, tp, device);
  Model& model = *loaded;
  if (tp && tp->rank() != 0) return follow_rank0(model, threads, -1);
  ThreadPool pool(threads);
  const ModelConfig& c = model.full_config();

  // Bytes a decode step reads: every matrix once, in the type the kernels read it in (the embedding
  // table only one row, ignored); of a mixture of experts' stacked tensors only the
  // expert_used_count experts a token is routed to.
  std::uint64_t weight_bytes = 0, params = 0, active_params = 0;
  // What a prompt's tokens multiply by: every layer matrix (of a mixture of experts the routed
  // experts' share) for each token; the output matrix only for the last, the one whose logits are
  // wanted; the embedding table is a lookup.
  std::uint64_t layer_matrix_params = 0, output_params = 0;
  std::map<std::string, std::uint64_t> bytes_by_type;
  const bool cpu_plain = !device.is_cuda() && kernels::active_isa() < kernels::Isa::Avx512;  // as Model::repack_for_kernels
  for (const auto& t : file->tensors()) {
    params += t.n_elements;
    const bool experts = c.is_moe() && t.name.ends_with("_exps.weight");
    const auto active = [&](std::uint64_t n) { return experts ? n / c.n_expert * c.n_expert_used : n; };
    if (t.dims.size() >= 2 && t.name.starts_with("blk.")) layer_matrix_params += active(t.n_elements);
    if (t.name == "output.weight" || (t.name == "token_embd.weight" && !file->find_tensor("output.weight"))) output_params = t.n_elements;
    if (t.name == "token_embd.weight" && file->find_tensor("output.weight")) continue;
    active_params += active(t.n_elements);
    const DType run_as = kernel_type_of(t.type, cpu_plain);
    weight_bytes += active(run_as == t.type ? t.n_bytes : row_bytes(run_as, t.n_elements));
    bytes_by_type[std::string(dtype_name(t.type))] += t.n_bytes;
  }
  const std::string type = std::max_element(bytes_by_type.begin(), bytes_by_type.end(), [](auto& a, auto& b) {
                             return a.second < b.second;
                           })->first;

  std::mt19937 rng(7);
  std::uniform_int_distribution<std::int32_t> tok(3, static_cast<std::int32_t>(c.n_vocab) - 1);
  std::vector<double> pp_tps, tg_tps;
  double tg_tp_collectives = 0;     // tensor-parallel: collectives per generated token
  std::vector<double> tg_tp_share;  // and the share of decode time rank 0 spent in them
  std::vector<float> logits;
  // With a depth, the context is prefilled once (in chunks, as the engine would) and every
  // measurement starts from it: the cache is cut back to `depth` positions, and what a measurement
  // writes past them is overwritten by the next.
  // With streams, each sequence has its own context of `depth` (the prompt measurement uses the first).
  const std::size_t depth = static_cast<std::size_t>(o.depth);
  const int streams = std::max(1, o.streams);
  constexpr KvType kv_type = KvType::F16;  // the serving default
  KvCache cache = model.make_cache(depth + static_cast<std::size_t>(std::max(o.n_prompt, o.n_gen)) + 8, kv_type, static_cast<std::size_t>(streams));
  constexpr std::size_t kDepthChunk = 512;
  for (int seq = 0; seq < streams; ++seq) {
    for (std::size_t p0 = 0; p0 < depth; p0 += kDepthChunk) {
      Batch batch;
      for (std::size_t p = p0; p < std::min(depth, p0 + kDepthChunk); ++p) batch.add(tok(rng), static_cast<std::int32_t>(p), seq, false);
      model.forward(batch, cache, pool, logits);
    }
  }
  const auto restart = [&] {  // the sequences so far are 0 .. n - 1
    for (int seq = 0; seq < static_cast<int>(cache.n_sequences()); ++seq) cache.set_length(seq, depth);
  };
  const auto at = [&](int i) { return static_cast<std::int32_t>(depth) + i; };
  // The read bandwidth is measured after every repetition and the floor takes the best: on a shared
  // machine it moves by tens of percent within a minute, and one measurement at the end could land
  // in a slow phase and flatter the decode that ran in a fast one. Its 1 GiB buffer must not count
  // as the model's memory, so the peak RSS is read before each measurement and started over after.
  double rss = 0, bandwidth = 0;
  bool rss_tracks_model_only = true;
  // On a GPU the floor is the device memory's bandwidth (a device-to-device copy) instead.
  backend::DeviceForward* const on_device = model.device();
  const auto measure_machine = [&] {
    if (rss_tracks_model_only) rss = std::max(rss, peak_rss_mb());
    bandwidth = std::max(bandwidth, on_device ? on_device->measure_bandwidth_gbs() : measure_read_bandwidth_gbs(pool));
    rss_tracks_model_only = reset_peak_rss();
  };
  for (int rep = 0; rep < std::max(1, o.repetitions); ++rep) {
    if (o.n_prompt > 0) {
      restart();
      Batch batch;
      for (int i = 0; i < o.n_prompt; ++i) batch.add(tok(rng), at(i), 0, i + 1 == o.n_prompt);
      const auto t0 = SteadyClock::now();
      model.forward(batch, cache, pool, logits);
      pp_tps.push_back(o.n_prompt / seconds_since(t0));
    }
    if (o.n_gen > 0) {
      restart();
      Batch batch;
      const parallel::Communicator::Totals tp_before = tp ? tp->totals() : parallel::Communicator::Totals{};
      const auto t0 = SteadyClock::now();
      // On a device the step's token is drawn there, as the engine has it drawn: its row of logits
      // never comes back. Greedy unless --sample; the CPU takes no time to pick the largest logit
      // (the engine's argmax is noise beside a step), but draws with the sampler the engine uses.
      const bool sampled = !o.sample.empty();
      const SamplingParams params = sampled ? draw_named(o.sample).params : SamplingParams{.temperature = 0.0f};
      Sampler sampler(params);
      backend::DeviceSampling draw;
      for (int i = 0; i < o.n_gen; ++i) {
        batch.clear();
        draw.draws.clear();
        for (int seq = 0; seq < streams; ++seq) {
          batch.add(tok(rng), at(i), seq, true);
          draw.draws.push_back({seq, params.temperature, params.top_k, params.top_p, params.min_p, sampled ? sampler.next_uniform() : 0.0});
          if (sampled) sampler.skip_uniform();
        }
        model.forward(batch, cache, pool, logits, {}, model.samples_on_device() ? &draw : nullptr);
        if (sampled && !model.samples_on_device()) {
          for (int seq = 0; seq < streams; ++seq) sampler.sample(logits.data() + static_cast<std::size_t>(seq) * c.n_vocab, c.n_vocab, {});
        }
      }
      const double seconds = seconds_since(t0);
      tg_tps.push_back(static_cast<double>(o.n_gen) * streams / seconds);
      if (tp) {  // this rank's time in collectives (sending and waiting), per generated token
        const parallel::Communicator::Totals after = tp->totals();
        tg_tp_collectives = static_cast<double>(after.collectives - tp_before.collectives) / o.n_gen;
        tg_tp_share.push_back((after.seconds - tp_before.seconds) / seconds);
      }
    }
    measure_machine();
  }
  const double int8_measured_tops = on_device ? 0.0 : measure_int8_tops(pool);
  const Stats pp = stats(pp_tps), tg = stats(tg_tps);
  // A step reads the weights once for all its streams' tokens: the memory floor counts them all
  // (where the arithmetic, not the reads, bounds a step of many streams, no kernel reaches it).
  // Each stream's token reads its own KV cache as well, at the run's mean context (step i sees
  // depth + i + 1 positions): 0.2% of the 8B shape's bytes at tg128, a fifth at depth 8000.
  const double mean_context = static_cast<double>(depth) + (o.n_gen + 1) / 2.0;
  const double kv_bytes = o.n_gen > 0 ? c.kv_bytes_read(mean_context, kv_row_bytes(c.kv_dim(), kv_type)) : 0.0;
  const double step_bytes = static_cast<double>(weight_bytes) + streams * kv_bytes;
  const double tg_floor = bandwidth * 1e9 / step_bytes * streams;
  // Multiply-adds count twice; attention's own products (a few percent at 512 tokens) are left out.
  // (Until 2026-12-06 this counted 2 x every parameter x tokens: the embedding table and the output
  // matrix for every token too, which overstated small models' prefill, 125m's by 1.6x.)
  const double pp_ops = o.n_prompt > 0 ? 2.0 * (static_cast<double>(layer_matrix_params) + static_cast<double>(output_params) / o.n_prompt) * pp.median : 0.0;
  const double int8_peak = o.int8_peak_tops * 1e12;
  const double file_mb = static_cast<double>(file->file_size()) / 1e6;

  nlohmann::json j = {
      {"model", o.model}, {"type", type}, {"file_mb", file_mb}, {"params_m", static_cast<double>(params) / 1e6},
      {"active_params_m", static_cast<double>(active_params) / 1e6},
      {"threads", threads}, {"tp", o.tp}, {"device", backend::to_string(device)}, {"tg_tp_collectives_per_token", tg_tp_collectives},
      {"tg_tp_collective_share", tg_tp_share.empty() ? 0.0 : stats(tg_tp_share).median}, {"isa", kernels::isa_name(kernels::active_isa())}, {"n_prompt", o.n_prompt}, {"n_gen", o.n_gen}, {"streams", streams}, {"sampled", !o.sample.empty()}, {"draw", o.sample.empty() ? std::string("greedy") : o.sample}, {"depth", o.depth},
      {"repetitions", o.repetitions}, {"pp_tps", {{"mean", pp.mean}, {"stddev", pp.stddev}, {"median", pp.median}}},
      {"tg_tps", {{"mean", tg.mean}, {"stddev", tg.stddev}, {"median", tg.median}}},
      {"tg_step_ms", tg.median > 0 ? 1e3 * streams / tg.median : 0.0},
      {"read_bandwidth_gbs", bandwidth}, {"weight_bytes_per_token", weight_bytes},
      {"kv_bytes_per_token", kv_bytes}, {"tg_floor_tps", tg_floor},
      {"tg_fraction_of_floor", tg.median / tg_floor}, {"pp_ops_per_s", pp_ops}, {"int8_peak_tops", o.int8_peak_tops},
      {"pp_fraction_of_int8_peak", pp_ops / int8_peak}, {"int8_measured_tops", int8_measured_tops},
      {"pp_fraction_of_int8_measured", int8_measured_tops > 0 ? pp_ops / (int8_measured_tops * 1e12) : 0.0}, {"peak_rss_mb", rss}};
  if (on_device) {
    j["device_name"] = on_device->name();
    j["device_peak_tflops"] = o.device_peak_tflops;
    j["pp_fraction_of_device_peak"] = pp_ops / (o.device_peak_tflops * 1e12);
    j["device_profile"] = on_device->profile_report();  // PROMPTLY_CUDA_PROFILE=1
  }
  if (o.json) {
    std::printf("%s\n", j.dump().c_str());
    return 0;
  }
  const std::string at_depth = o.depth > 0 ? " @ d" + std::to_string(o.depth) : "";
  const std::string in_streams = streams > 1 ? " x" + std::to_string(streams) + " streams" : "";
  std::printf("| model | type | size MB | threads | isa | pp%d%s t/s | tg%d%s%s%s t/s | read GB/s | tg floor t/s | tg / floor | pp / int8 peak | peak RSS MB |\n",
              o.n_prompt, at_depth.c_str(), o.n_gen, in_streams.c_str(), at_depth.c_str(), o.sample.empty() ? "" : (" sampled (" + o.sample + ")").c_str());
  std::printf("|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  std::printf("| %s | %s | %.0f | %d | %s | %.1f ± %.1f | %.1f ± %.1f | %.1f | %.1f | %.0f%% | %.1f%% | %.0f |\n", o.model.c_str(),
              type.c_str(), file_mb, threads, kernels::isa_name(kernels::active_isa()), pp.mean, pp.stddev, tg.mean, tg.stddev, bandwidth,
              tg_floor, 100.0 * tg.median / tg_floor, 100.0 * pp_ops / int8_peak, rss);
  if (streams > 1) {
    std::printf("\n%d streams: a generation step is %d tokens, %.2f ms (median); tg counts every stream's tokens, and its floor is "
                "the weights read once a step and each stream's own KV cache\n",
                streams, streams, tg.median > 0 ? 1e3 * streams / tg.median : 0.0);
  }
  if (streams * kv_bytes >= 0.01 * step_bytes) {
    const bool in_mb = kv_bytes >= 1e6;
    std::printf("\nthe floor counts the KV cache each stream's token reads besides the weights: %.1f %s at the run's mean context of "
                "%.1f positions, %.0f%% of a step's bytes\n",
                kv_bytes / (in_mb ? 1e6 : 1e3), in_mb ? "MB" : "KB", mean_context, 100.0 * streams * kv_bytes / step_bytes);
  }
  if (tp) {
    std::printf("\ntensor parallel: %d ranks of %d threads each; decode: %.0f collectives a token, %.0f%% of rank 0's time in them "
                "(sending and waiting for the slowest rank)\n",
                o.tp, threads, tg_tp_collectives, 100.0 * stats(tg_tp_share).median);
  }
  if (c.is_moe()) {
    std::printf("\nmixture of experts: %u of %u experts per token; %.1f M of %.1f M parameters active per token (the floor counts those)\n",
                c.n_expert_used, c.n_expert, static_cast<double>(active_params) / 1e6, static_cast<double>(params) / 1e6);
  }
  if (on_device) {
    std::printf("\n%s: read GB/s and the floor are the device memory's (a device-to-device copy, bytes read + written); "
                "prefill = %.1f%% of the %.0f TFLOP/s dense FP16/BF16 tensor peak (--device-peak-tflops); the int8 column is the CPU's\n",
                on_device->name().c_str(), 100.0 * pp_ops / (o.device_peak_tflops * 1e12), o.device_peak_tflops);
    const std::string profile = on_device->profile_report();
    if (!profile.empty()) std::printf("\n%s", profile.c_str());
  }
  if (int8_measured_tops > 0) {
    std::printf("\nint8 peak: %.2f TOPS nominal (--int8-peak-tops), %.2f TOPS measured in this run (VNNI on registers, %d threads); "
                "prefill = %.1f%% of the measured\n",
                o.int8_peak_tops, int8_measured_tops, threads, 100.0 * pp_ops / (int8_measured_tops * 1e12));
  }
  return 0;
}

}  // namespace promptly::cli
