// `promptly perplexity`: PPL of a model on a text, and in KL mode how far it moves from a reference.
#include <cmath>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "model/builtin_model.h"
#include "gguf/gguf.h"
#include "model/model.h"
#include "quality/logits_file.h"
#include "quality/perplexity.h"
#include "tokenizer/tokenizer.h"
#include "util/clock.h"
#include "util/error.h"
#include "util/file_io.h"

namespace promptly::cli {
namespace {

struct Loaded {
  std::shared_ptr<const gguf::File> file;
  std::unique_ptr<Model> model;
};

Loaded load(const std::string& path, const backend::DeviceSpec& device) {
  Loaded l;
  l.file = open_model_file(path);
  l.model = load_model(l.file, nullptr, device);
  return l;
}

}  // namespace

int perplexity(const PerplexityOptions& o) {
  using namespace quality;
  if (o.text_file.empty() && o.kld_base.empty()) throw Error("perplexity needs a text: -f FILE (or --kld-base FILE, which holds its tokens)");
  const int threads = o.threads > 0 ? o.threads : default_thread_count();
  ThreadPool pool(threads);

  const backend::DeviceSpec device = resolve_device(o.device);
  Loaded cand = load(o.model, device);
  Tokenizer tokenizer(Vocab::from_gguf(*cand.file));
  Loaded ref;
  if (!o.kld_ref.empty()) {
    ref = load(o.kld_ref, device);
    // Same size is checked by evaluate_perplexity; the same tokens here, where the vocabularies are.
    const Vocab ref_vocab = Vocab::from_gguf(*ref.file);
    const Vocab& v = tokenizer.vocab();
    const std::size_t n = std::min(ref_vocab.tokens.size(), v.tokens.size());
    for (std::size_t i = 0; i < n; ++i) {
      if (ref_vocab.tokens[i] != v.tokens[i]) {
        throw Error("the reference's vocabulary differs from the model's at id " + std::to_string(i) + " ('" + ref_vocab.tokens[i] +
                    "' against '" + v.tokens[i] + "'): KL divergence needs the same vocabulary");
      }
    }
  }
  std::unique_ptr<LogitsFile> base;
  if (!o.kld_base.empty()) base = std::make_unique<LogitsFile>(LogitsFile::load(o.kld_base));

  std::vector<std::int32_t> tokens;
  double tokenize_ms = 0;
  if (!o.text_file.empty()) {
    std::string text = read_file(o.text_file, "text file");
    // llama-perplexity's -f drops one trailing newline; so do we, so that the token counts (and the
    // last chunk) are the same as its own.
    if (!text.empty() && text.back() == '\n') text.pop_back();
    const auto t0 = SteadyClock::now();
    tokens = tokenizer.encode(text, true, false);
    tokenize_ms = seconds_since(t0) * 1000.0;
  }
  const std::int32_t bos = tokenizer.vocab().add_bos ? tokenizer.vocab().bos : -1;

  quality::PerplexityOptions po;
  po.ctx = o.ctx;
  po.batch = o.batch;
  po.max_chunks = o.chunks;
  po.kv_type = parse_kv_type(o.kv_type);
  po.top_k = o.top_k;
  PerplexityRun run;
  run.model = cand.model.get();
  run.reference = ref.model.get();
  run.reference_file = base.get();
  run.save_logits_path = o.save_logits;

  std::FILE* progress = o.json ? stderr : stdout;
  if (!tokens.empty()) {
    std::fprintf(stderr, "perplexity: %zu tokens in %.0f ms; chunks of %zu tokens, scoring the second half of each\n", tokens.size(),
                 tokenize_ms, base ? static_cast<std::size_t>(base->ctx) : o.ctx);
  }
  const PerplexityResult r = evaluate_perplexity(run, tokens, bos, po, pool, [&](std::size_t chunk, const PerplexityResult& partial) {
    std::fprintf(progress, "[%zu]%.4f,", chunk + 1, partial.running_ppl.back());
    std::fflush(progress);
  });
  std::fprintf(progress, "\n");

  const std::size_t n_scored = r.nll.count;
  if (o.json) {
    nlohmann::json j;
    j["ppl"] = r.ppl();
    j["ppl_stderr"] = r.ppl_stderr();
    j["n_chunks"] = r.plan.n_chunks;
    j["ctx"] = r.plan.ctx;
    j["n_tokens"] = r.plan.n_chunks * r.plan.ctx;
    if (!tokens.empty()) j["text_tokens"] = tokens.size();  // the whole text's, as llama-perplexity counts them
    j["n_scored"] = n_scored;
    j["tokens_per_s"] = r.tokens_per_s();
    j["seconds"] = r.seconds;
    j["threads"] = threads;
    if (r.kl) {
      const KlSummary& kl = *r.kl;
      j["ref_ppl"] = std::exp(kl.ref_nll.mean());
      j["kld_mean"] = kl.kld.mean();
      j["kld_stderr"] = kl.kld.stderr_of_mean();
      j["top1_agreement"] = static_cast<double>(kl.same_top) / static_cast<double>(n_scored);
      j["kld_p90"] = percentile(kl.kld_values, 0.90);
      j["kld_p99"] = percentile(kl.kld_values, 0.99);
      j["kld_p999"] = percentile(kl.kld_values, 0.999);
      j["kld_max"] = kl.kld_values.back();
      j["top_p_drop_p90"] = percentile(kl.top_p_drop_values, 0.90);
      j["top_p_drop_p99"] = percentile(kl.top_p_drop_values, 0.99);
      j["top_p_drop_p999"] = percentile(kl.top_p_drop_values, 0.999);
      j["reference"] = base ? "logits file (top-" + std::to_string(base->top_k) + ")" : "model";
    }
    std::printf("%s\n", j.dump().c_str());
    return 0;
  }
  std::printf("PPL = %.4f +/- %.5f  (%zu chunks of %zu, %zu tokens scored; %.1f tokens/s, %d threads)\n", r.ppl(), r.ppl_stderr(),
              r.plan.n_chunks, r.plan.ctx, n_scored, r.tokens_per_s(), threads);
  if (r.kl) {
    const KlSummary& kl = *r.kl;
    const double ref_ppl = std::exp(kl.ref_nll.mean());
    std::printf("reference PPL = %.4f (%s); PPL ratio %.5f (%+.3f%%)\n", ref_ppl,
                base ? ("logits file, top-" + std::to_string(base->top_k)).c_str() : "model", r.ppl() / ref_ppl,
                100.0 * (r.ppl() / ref_ppl - 1.0));
    std::printf("mean KLD = %.6f +/- %.6f   top-1 agreement = %.3f%%\n", kl.kld.mean(), kl.kld.stderr_of_mean(),
                100.0 * static_cast<double>(kl.same_top) / static_cast<double>(n_scored));
    std::printf("KLD           p90 %.6f  p99 %.6f  p99.9 %.6f  max %.6f\n", percentile(kl.kld_values, 0.90), percentile(kl.kld_values, 0.99),
                percentile(kl.kld_values, 0.999), kl.kld_values.back());
    std::printf("p_ref(top) - p_cand(top)  p90 %.4f  p99 %.4f  p99.9 %.4f\n", percentile(kl.top_p_drop_values, 0.90),
                percentile(kl.top_p_drop_values, 0.99), percentile(kl.top_p_drop_values, 0.999));
  }
  if (!o.save_logits.empty()) std::printf("saved the reference's top-%zu log-probabilities to %s\n", o.top_k, o.save_logits.c_str());
  return 0;
}

}  // namespace promptly::cli
