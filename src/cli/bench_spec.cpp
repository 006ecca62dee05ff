// `promptly bench spec`: single-stream decode with and without speculation on the same prompts, in
// one run: accept rate, tokens per target pass, decode t/s and the speed-up over no speculation.
// Greedy by default, so every mode must also produce the very same tokens: the bench checks that.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <numeric>
#include <vector>

#include "cli/commands.h"
#include "cli/stats.h"
#include "engine/generate.h"
#include "model/builtin_model.h"
#include "model/model.h"
#include "tokenizer/tokenizer.h"
#include "util/error.h"
#include "util/file_io.h"

namespace promptly::cli {
namespace {

// Prompts cut at line starts, evenly spread over the file: code prefixes of about `bytes` bytes.
// "repeat" prompts hold such a prefix and then its first lines again, so that the continuation
// repeats what the prompt holds (prompt lookup's best case: edits, rewrites, quoting).
std::vector<std::string> cut_prompts(const std::string& text, std::size_t count, std::size_t bytes, bool repeat) {
  if (text.size() < bytes * 2) throw Error("the prompt file has " + std::to_string(text.size()) + " bytes; it needs at least " + std::to_string(bytes * 2));
  std::vector<std::string> prompts;
  for (std::size_t i = 0; i < count; ++i) {
    std::size_t start = (text.size() - bytes) * i / count;
    while (start > 0 && text[start - 1] != '\n') --start;
    std::size_t end = std::min(text.size(), start + bytes);
    while (end < text.size() && text[end - 1] != '\n') ++end;
    std::string p = text.substr(start, end - start);
    if (repeat) {
      std::size_t head = std::min(p.size(), bytes / 5);
      while (head < p.size() && p[head - 1] != '\n') ++head;
      p += "\n" + p.substr(0, head);
    }
    prompts.push_back(std::move(p));
  }
  return prompts;
}

struct ModeRun {
  double gen_ms = 0, propose_ms = 0, target_ms = 0;
  std::size_t tokens = 0, passes = 0, drafted = 0, accepted = 0;
  std::vector<std::vector<std::int32_t>> outputs;
  double tps() const { return gen_ms > 0 ? static_cast<double>(tokens) * 1000.0 / gen_ms : 0; }
};

}  // namespace

int bench_spec(const BenchSpecOptions& o) {
  const int threads = o.threads > 0 ? o.threads : default_thread_count();
  ThreadPool pool(threads);
  std::shared_ptr<const gguf::File> file = open_model_file(o.model);
  Model model(file);
  Tokenizer tokenizer(Vocab::from_gguf(*file));
  if (!std::filesystem::exists(o.prompts)) {
    throw Error("prompt file '" + o.prompts + "' not found; give one with --prompts FILE (code works best, e.g. the shared val.txt)");
  }
  const std::vector<std::string> texts = cut_prompts(read_file(o.prompts, "prompt file"), o.n_prompts, o.prompt_bytes, o.repeat);
  std::vector<std::vector<std::int32_t>> prompts;
  for (const auto& t : texts) prompts.push_back(tokenizer.encode(t, true, false));

  std::vector<std::string> modes;
  for (std::size_t a = 0; a <= o.modes.size();) {
    const std::size_t b = std::min(o.modes.find(',', a), o.modes.size());
    if (b > a) modes.push_back(o.modes.substr(a, b - a));
    a = b + 1;
  }
  if (std::find(modes.begin(), modes.end(), "none") == modes.end()) modes.insert(modes.begin(), "none");

  GenerateOptions gen;
  gen.max_tokens = o.n_gen;
  gen.sampling.temperature = 0;
  gen.ignore_eos = true;  // every prompt decodes exactly n tokens in every mode
  gen.kv_type = KvType::F32;
  const std::size_t ctx = model.config().n_ctx_train;
  for (const auto& p : prompts) {
    if (p.size() + static_cast<std::size_t>(o.n_gen) > ctx) {
      throw Error("a prompt of " + std::to_string(p.size()) + " tokens and -n " + std::to_string(o.n_gen) + " exceed the context of " +
                  std::to_string(ctx) + "; use a smaller --prompt-bytes or -n");
    }
  }

  struct Mode {
    std::string name;
    std::unique_ptr<Model> draft;
    std::unique_ptr<spec::Proposer> proposer;
    std::size_t spec_tokens = 0;
    std::vector<ModeRun> rounds;
  };
  std::vector<Mode> runs;
  for (const auto& m : modes) {
    // Without a draft model the modes that need one are left out (say so), rather than failing the run.
    if ((m == "draft" || m == "tree") && o.spec.draft.empty()) {
      std::fprintf(stderr, "mode %s skipped: it needs --draft\n", m.c_str());
      continue;
    }
    Mode mode;
    mode.name = m;
    SpecFlags flags = o.spec;
    flags.mode = m;
    if (m != "draft" && m != "tree") flags.draft.clear();
    mode.proposer = make_proposer(flags, tokenizer.vocab(), ctx, gen.kv_type, gen.sampling, pool, mode.draft, mode.spec_tokens);
    runs.push_back(std::move(mode));
  }

  // Rounds alternate the modes, so that a noisy neighbour slows all of them alike.
  for (int round = 0; round < o.repetitions; ++round) {
    for (auto& mode : runs) {
      ModeRun r;
      GenerateOptions g = gen;
      g.proposer = mode.proposer.get();
      g.spec_tokens = mode.spec_tokens;
      for (const auto& p : prompts) {
        const GenerateResult res = generate(model, tokenizer, p, g, pool);
        r.gen_ms += res.timings.gen_ms;
        r.propose_ms += res.timings.spec_propose_ms;
        r.target_ms += res.timings.target_ms;
        r.tokens += res.timings.n_gen - 1;
        r.passes += res.timings.spec_passes;
        r.drafted += res.timings.spec_drafted;
        r.accepted += res.timings.spec_accepted;
        r.outputs.push_back(res.ids);
      }
      mode.rounds.push_back(std::move(r));
      std::fprintf(stderr, "round %d %-6s %.1f t/s\n", round + 1, mode.name.c_str(), mode.rounds.back().tps());
    }
  }

  nlohmann::json out = {{"model", o.model}, {"draft", o.spec.draft}, {"prompts", prompts.size()}, {"n_gen", o.n_gen},
                        {"threads", threads}, {"repetitions", o.repetitions}, {"repeat_prompts", o.repeat}};
  std::vector<double> base_tps;
  for (const auto& r : runs.front().rounds) base_tps.push_back(r.tps());
  if (!o.json) {
    std::printf("| mode | spec tokens | accept rate | tokens / target pass | decode t/s (median of %d) | speed-up | ms a pass: propose / target / rest | same tokens as none |\n",
                o.repetitions);
    std::printf("|---|---:|---:|---:|---:|---:|---|---|\n");
  }
  for (const auto& mode : runs) {
    std::vector<double> tps, speedup;
    for (std::size_t i = 0; i < mode.rounds.size(); ++i) {
      tps.push_back(mode.rounds[i].tps());
      speedup.push_back(mode.rounds[i].tps() / base_tps[i]);
    }
    const ModeRun& last = mode.rounds.back();
    const bool same = last.outputs == runs.front().rounds.back().outputs;
    const double accept = last.drafted ? static_cast<double>(last.accepted) / static_cast<double>(last.drafted) : 0.0;
    const double per_pass = last.passes ? static_cast<double>(last.tokens) / static_cast<double>(last.passes) : 1.0;
    // A pass's time split (the median round's): the proposer, the target's forward pass, the rest
    // (verification, sampling, KV moves). Profiling at a glance: which part a change should shrink.
    std::vector<std::size_t> order(mode.rounds.size());
    std::iota(order.begin(), order.end(), std::size_t{0});
    std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return tps[a] < tps[b]; });
    const ModeRun& mid = mode.rounds[order[order.size() / 2]];
    const double passes = static_cast<double>(std::max<std::size_t>(1, mid.passes));
    const double propose_ms = mid.propose_ms / passes, target_ms = mid.target_ms / passes,
                 rest_ms = std::max(0.0, mid.gen_ms - mid.propose_ms - mid.target_ms) / passes;
    out["modes"][mode.name] = {{"spec_tokens", mode.spec_tokens}, {"accept_rate", accept},    {"tokens_per_pass", per_pass},
                               {"decode_tps", stats(tps).median},      {"decode_tps_rounds", tps}, {"speedup", stats(speedup).median},
                               {"same_tokens_as_none", same},    {"drafted", last.drafted},  {"accepted", last.accepted},
                               {"passes", last.passes},
                               {"ms_per_pass", {{"propose", propose_ms}, {"target", target_ms}, {"rest", rest_ms}}}};
    if (!o.json) {
      std::printf("| %s | %zu | %.1f%% | %.2f | %.1f | %.2fx | %.3f / %.3f / %.3f | %s |\n", mode.name.c_str(), mode.spec_tokens, 100.0 * accept,
                  per_pass, stats(tps).median, stats(speedup).median, propose_ms, target_ms, rest_ms, same ? "yes" : "NO");
    }
  }
  if (o.json) std::printf("%s\n", out.dump(2).c_str());
  return 0;
}

}  // namespace promptly::cli
