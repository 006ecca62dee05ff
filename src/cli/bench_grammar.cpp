// `promptly bench grammar`: what constrained decoding costs per token. Random walks through a
// grammar over a real vocabulary: each step computes the token mask (the work done per decoded
// token), picks an allowed token at random and advances. The first walk starts with an empty
// per-position cache (a grammar's first request); the rest show the steady state.
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "cli/commands.h"
#include "grammar/compile.h"
#include "grammar/gbnf.h"
#include "grammar/json_schema.h"
#include "grammar/matcher.h"
#include "grammar/token_bytes_of.h"
#include "tokenizer/tokenizer.h"
#include "util/clock.h"
#include "util/error.h"
#include "util/file_io.h"

namespace promptly::cli {
namespace {

struct Summary {
  double mean = 0, p50 = 0, p99 = 0, max = 0;
};

Summary summarize(std::vector<double> us) {
  Summary s;
  if (us.empty()) return s;
  std::sort(us.begin(), us.end());
  double sum = 0;
  for (double x : us) sum += x;
  s.mean = sum / static_cast<double>(us.size());
  s.p50 = us[us.size() / 2];
  s.p99 = us[std::min(us.size() - 1, static_cast<std::size_t>(static_cast<double>(us.size()) * 0.99))];
  s.max = us.back();
  return s;
}

nlohmann::json to_json(const Summary& s) { return {{"mean_us", s.mean}, {"p50_us", s.p50}, {"p99_us", s.p99}, {"max_us", s.max}}; }

}  // namespace

int bench_grammar(const BenchGrammarOptions& o) {
  if (o.schema.empty() == o.grammar.empty()) throw Error("bench grammar: give exactly one of --schema or --grammar");
  auto t0 = SteadyClock::now();
  const Tokenizer tok = Tokenizer::from_file(o.vocab);
  const double load_s = seconds_since(t0);
  t0 = SteadyClock::now();
  auto vocab = grammar::token_bytes_of(tok);
  const double trie_ms = seconds_since(t0) * 1e3;

  t0 = SteadyClock::now();
  std::string gbnf;
  if (!o.schema.empty()) {
    gbnf = grammar::json_schema_to_gbnf(nlohmann::ordered_json::parse(read_file(o.schema, "schema file")));
  } else {
    gbnf = read_file(o.grammar, "grammar file");
  }
  auto index = std::make_shared<grammar::GrammarIndex>(grammar::compile(grammar::parse_gbnf(gbnf)), vocab);
  const double compile_ms = seconds_since(t0) * 1e3;
  double precompute_ms = 0;
  std::size_t precomputed = 0;
  if (o.threads > 0) {
    t0 = SteadyClock::now();
    precomputed = index->precompute(o.threads);
    precompute_ms = seconds_since(t0) * 1e3;
  }
  std::size_t dfa_states = 0;
  for (const auto& d : index->grammar().dfas) dfa_states += static_cast<std::size_t>(d.size());

  std::mt19937_64 rng(o.seed);
  std::vector<std::uint32_t> mask(index->mask_words());
  std::vector<double> cold_mask_us, warm_mask_us, accept_us;
  std::size_t tokens = 0, finished = 0, allowed_total = 0;
  const auto& ends = vocab->end_ids();
  std::ofstream samples;
  if (!o.samples.empty()) {
    samples.open(o.samples);
    if (!samples) throw Error("bench grammar: cannot write " + o.samples);
  }
  for (int w = 0; w < std::max(1, o.walks); ++w) {
    grammar::Matcher m(index);
    std::string text;
    auto finish_walk = [&] {
      ++finished;
      if (samples.is_open()) samples << nlohmann::json(text).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
    };
    for (int step = 0; step < o.max_tokens; ++step) {
      auto ts = SteadyClock::now();
      m.fill_mask(mask.data());
      (w == 0 ? cold_mask_us : warm_mask_us).push_back(seconds_since(ts) * 1e6);
      std::vector<std::int32_t> allowed;
      for (std::size_t t = 0; t < vocab->size(); ++t)
        if ((mask[t / 32] >> (t % 32)) & 1) allowed.push_back(static_cast<std::int32_t>(t));
      allowed_total += allowed.size();
      if (allowed.empty()) throw Error("bench grammar: the grammar reached a state with no allowed token");
      // End as soon as the grammar allows it half the time, so walks finish like real outputs.
      if (m.can_end() && (rng() & 1)) { finish_walk(); break; }
      std::int32_t pick = allowed[rng() % allowed.size()];
      if (std::find(ends.begin(), ends.end(), pick) != ends.end()) { finish_walk(); break; }
      ts = SteadyClock::now();
      if (!m.accept(pick)) throw Error("bench grammar: a token from the mask was refused (bug)");
      accept_us.push_back(seconds_since(ts) * 1e6);
      text += vocab->piece(pick);
      ++tokens;
    }
  }
  const Summary cold = summarize(cold_mask_us), warm = summarize(warm_mask_us), acc = summarize(accept_us);
  std::vector<double> all = cold_mask_us;
  all.insert(all.end(), warm_mask_us.begin(), warm_mask_us.end());
  const Summary overall = summarize(all);
  nlohmann::json j = {{"vocab", o.vocab},
                      {"vocab_size", vocab->size()},
                      {"source", o.schema.empty() ? o.grammar : o.schema},
                      {"load_tokenizer_s", load_s},
                      {"token_trie_ms", trie_ms},
                      {"compile_ms", compile_ms},
                      {"precompute_ms", precompute_ms},
                      {"precomputed_masks", precomputed},
                      {"rules", index->grammar().rule_alts.size()},
                      {"dfa_states", dfa_states},
                      {"walks", std::max(1, o.walks)},
                      {"walks_finished", finished},
                      {"tokens", tokens},
                      {"mean_allowed_tokens", all.empty() ? 0.0 : static_cast<double>(allowed_total) / static_cast<double>(all.size())},
                      {"cached_masks", index->cached_masks()},
                      {"mask_cold", to_json(cold)},
                      {"mask_warm", to_json(warm)},
                      {"mask_all", to_json(overall)},
                      {"accept", to_json(acc)}};
  if (o.json) {
    std::printf("%s\n", j.dump().c_str());
    return 0;
  }
  std::printf("vocab %zu tokens (trie %.1f ms), grammar %zu rules / %zu DFA states compiled in %.2f ms, %zu position masks cached\n",
              vocab->size(), trie_ms, index->grammar().rule_alts.size(), dfa_states, compile_ms, index->cached_masks());
  if (o.threads > 0) std::printf("precomputed %zu position masks on %d threads in %.0f ms\n", precomputed, o.threads, precompute_ms);
  std::printf("%d walks, %zu finished, %zu tokens, %.0f allowed tokens per step on average\n\n", std::max(1, o.walks), finished, tokens,
              j["mean_allowed_tokens"].get<double>());
  std::printf("| per token | mean us | p50 us | p99 us | max us |\n|---|---|---|---|---|\n");
  auto row = [](const char* name, const Summary& s) { std::printf("| %s | %.1f | %.1f | %.1f | %.1f |\n", name, s.mean, s.p50, s.p99, s.max); };
  row(o.threads > 0 ? "mask, first walk" : "mask, first walk (cold cache)", cold);
  row("mask, later walks", warm);
  row("mask, all", overall);
  row("accept token", acc);
  return 0;
}

}  // namespace promptly::cli
