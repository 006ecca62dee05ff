#include <cstdio>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>

#include "cli/commands.h"
#include "grammar/compile.h"
#include "grammar/gbnf.h"
#include "grammar/json_schema.h"
#include "grammar/matcher.h"
#include "grammar/token_bytes_of.h"
#include "gguf/gguf.h"
#include "model/builtin_model.h"
#include "model/model.h"
#include "tokenizer/tokenizer.h"
#include "util/clock.h"
#include "util/error.h"
#include "util/file_io.h"
#include "util/process.h"

namespace promptly::cli {

int run(const RunOptions& o) {
  const int threads = o.threads > 0 ? o.threads : default_thread_count();
  std::string prompt = o.prompt;
  if (!o.prompt_file.empty()) {
    prompt = read_file(o.prompt_file, "prompt file");
  }

  const backend::DeviceSpec device = resolve_device(o.device);
  const auto t_load = SteadyClock::now();
  std::shared_ptr<const gguf::File> file = open_model_file(o.model);
  const auto tp = join_tensor_parallel(o.tp);
  if (tp && !o.kv_spool.empty()) throw Error("--kv-spool does not work with --tp yet (each rank holds only its heads' KV)");
  const double rss_before_model = rss_mb();
  const std::unique_ptr<Model> loaded = load_model(file, tp, device);
  Model& model = *loaded;
  const double model_rss = rss_mb() - rss_before_model;  // what holding the weights (this rank's slices) costs
  if (tp && tp->rank() != 0) return follow_rank0(model, threads, model_rss);
  Tokenizer tokenizer(Vocab::from_gguf(*file));
  ThreadPool pool(threads);
  const double load_ms = seconds_since(t_load) * 1000.0;

  std::vector<std::int32_t> prompt_ids = tokenizer.encode(prompt, !o.no_bos, o.parse_special);
  if (prompt_ids.empty()) {
    if (tokenizer.vocab().bos < 0) throw Error("empty prompt and the model has no BOS token to start from");
    prompt_ids.push_back(tokenizer.vocab().bos);
  }

  auto stream = [&](const std::string& text) {
    std::fwrite(text.data(), 1, text.size(), stdout);
    std::fflush(stdout);
  };
  if (!o.json) stream(prompt);
  GenerateOptions gen = o.gen;
  gen.kv_type = parse_kv_type(o.kv_type);
  if (!o.kv_spool.empty()) {
    gen.kv_spool_dir = o.kv_spool;
    gen.kv_spool_bytes = parse_disk_size(o.kv_spool_size, o.kv_spool);
  }
  std::unique_ptr<Model> draft_model;
  const std::size_t ctx = gen.ctx_size ? gen.ctx_size : model.config().n_ctx_train;
  const std::unique_ptr<spec::Proposer> proposer =
      make_proposer(o.spec, tokenizer.vocab(), ctx, gen.kv_type, gen.sampling, pool, draft_model, gen.spec_tokens, device);
  gen.proposer = proposer.get();
  if (!o.json_schema.empty() || !o.grammar.empty()) {
    if (!o.json_schema.empty() && !o.grammar.empty()) throw Error("give --json-schema or --grammar, not both");
    const std::string gbnf = !o.grammar.empty() ? read_file(o.grammar, "grammar file")
                                                : grammar::json_schema_to_gbnf(nlohmann::ordered_json::parse(read_file(o.json_schema, "JSON schema file")));
    gen.grammar = std::make_shared<grammar::GrammarIndex>(grammar::compile(grammar::parse_gbnf(gbnf)), grammar::token_bytes_of(tokenizer));
  }
  const GenerateResult r = generate(model, tokenizer, prompt_ids, gen, pool, o.json ? nullptr : std::function<void(const std::string&)>(stream));
  const GenerateTimings& t = r.timings;

  if (o.json) {
    nlohmann::json j;
    j["prompt_ids"] = prompt_ids;
    j["ids"] = r.ids;
    j["text"] = r.text;
    j["finish_reason"] = r.finish_reason;
    j["timings"] = {{"load_ms", load_ms}, {"ttft_ms", t.ttft_ms}, {"prompt_ms", t.prompt_ms}, {"prompt_tps", t.prompt_tps()},
                    {"gen_ms", t.gen_ms}, {"gen_tps", t.gen_tps()}, {"n_prompt", t.n_prompt}, {"n_spooled", t.n_spooled}, {"n_gen", t.n_gen},
                    {"kv_bytes", t.kv_bytes}, {"threads", threads}, {"tp", o.tp}, {"rss_mb", rss_mb()}, {"model_rss_mb", model_rss}};
    if (proposer) {
      j["timings"]["spec"] = proposer->name();
      j["timings"]["spec_passes"] = t.spec_passes;
      j["timings"]["spec_drafted"] = t.spec_drafted;
      j["timings"]["spec_accepted"] = t.spec_accepted;
      j["timings"]["accept_rate"] = t.accept_rate();
      j["timings"]["tokens_per_pass"] = t.tokens_per_pass();
      j["timings"]["spec_propose_ms"] = t.spec_propose_ms;
      j["timings"]["target_ms"] = t.target_ms;
    }
    // Invalid UTF-8 cannot occur in text (the detokenizer holds partial sequences), but replace rather than throw.
    std::printf("%s\n", j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
  } else {
    std::printf("\n");
    std::fprintf(stderr,
                 "\nload: %.1f ms | prompt: %zu tokens, %.1f tokens/s | time to first token: %.1f ms | "
                 "generation: %zu tokens, %.1f tokens/s | threads: %d | finish: %s\n",
                 load_ms, t.n_prompt, t.prompt_tps(), t.ttft_ms, t.n_gen, t.gen_tps(), threads, r.finish_reason.c_str());
    if (!o.kv_spool.empty()) std::fprintf(stderr, "KV spool: %zu of the %zu prompt tokens read back instead of computed\n", t.n_spooled, t.n_prompt);
    if (proposer && t.spec_passes > 0) {
      std::fprintf(stderr, "speculation (%s): %zu target passes for %zu tokens (%.2f a pass), %zu of %zu guesses accepted (%.0f%%)\n",
                   proposer->name(), t.spec_passes, t.n_gen - 1, t.tokens_per_pass(), t.spec_accepted, t.spec_drafted, 100.0 * t.accept_rate());
    }
  }
  return 0;
}

}  // namespace promptly::cli
