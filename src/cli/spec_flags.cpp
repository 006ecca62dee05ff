// Turns the speculative decoding flags into a proposer, with the errors a user needs.
#include <string>

#include "cli/commands.h"
#include "model/builtin_model.h"
#include "spec/draft_model.h"
#include "spec/ngram.h"
#include "util/error.h"

namespace promptly::cli {

namespace {
// Defaults chosen with `promptly bench spec` (README, "Speculative decoding").
constexpr std::size_t kDefaultDraftTokens = 3;
constexpr std::size_t kDefaultNgramTokens = 4;
constexpr float kDefaultDraftMinP = 0.2f;
constexpr std::size_t kMaxSpecTokens = 64;
}  // namespace

std::unique_ptr<spec::Proposer> make_proposer(const SpecFlags& flags, const Vocab& target_vocab, std::size_t ctx,
                                              KvType kv_type, const SamplingParams& sampling, ThreadPool& pool,
                                              std::unique_ptr<Model>& draft_model, std::size_t& spec_tokens) {
  const std::string mode = !flags.mode.empty() ? flags.mode : flags.draft.empty() ? "none" : "draft";
  if (mode != "none" && mode != "ngram" && mode != "draft") {
    throw Error("unknown --spec '" + mode + "'; supported: none, ngram (prompt lookup), draft (needs --draft)");
  }
  if (flags.tokens == 0 || flags.tokens < -1 || flags.tokens > static_cast<long>(kMaxSpecTokens)) {
    throw Error("--spec-tokens " + std::to_string(flags.tokens) + " is out of range: 1 to " + std::to_string(kMaxSpecTokens) +
                " guesses a pass (a few, 4-8, is where speculation pays; --spec none turns it off)");
  }
  if (mode == "none") {
    if (!flags.draft.empty()) throw Error("--draft is given but --spec none turns speculation off; drop one of them");
    spec_tokens = 0;
    return nullptr;
  }
  if (mode == "ngram") {
    spec_tokens = flags.tokens > 0 ? static_cast<std::size_t>(flags.tokens) : kDefaultNgramTokens;
    return std::make_unique<spec::NgramProposer>(flags.ngram);
  }
  if (flags.draft.empty()) throw Error("--spec draft needs a draft model: --draft FILE (a small model with the target's vocabulary)");
  std::shared_ptr<const gguf::File> file = open_model_file(flags.draft);
  try {
    draft_model = std::make_unique<Model>(file);
    spec::check_same_vocabulary(target_vocab, Vocab::from_gguf(*file));
  } catch (const Error& e) {
    throw Error("draft model '" + flags.draft + "': " + e.what());
  }
  spec_tokens = flags.tokens > 0 ? static_cast<std::size_t>(flags.tokens) : kDefaultDraftTokens;
  spec::DraftOptions d;
  d.ctx = ctx;
  d.kv_type = kv_type;
  d.sampling = sampling;
  d.min_confidence = flags.draft_min_p >= 0 ? flags.draft_min_p : kDefaultDraftMinP;
  return std::make_unique<spec::DraftModelProposer>(*draft_model, d, pool);
}

void apply_spec_flags(const SpecFlags& given, const Vocab& target_vocab, EngineOptions& engine, std::unique_ptr<Model>& draft_model) {
  // serve's default without --spec or --draft: n-gram lookup for greedy requests (README, Serving
  // defaults: 2.2x a greedy stream on the built-in model, nothing to load, and sampled requests
  // keep their seeded reproducibility).
  SpecFlags flags = given;
  const bool by_default = flags.mode.empty() && flags.draft.empty();
  if (by_default) flags.mode = "ngram";
  engine.spec_sampled = !by_default;
  ThreadPool none(1);
  std::size_t tokens = 0;
  // The same checks and defaults as for run; the proposers themselves are made per stream by the engine.
  const std::unique_ptr<spec::Proposer> probe =
      make_proposer(flags, target_vocab, 0, KvType::F16, SamplingParams{}, none, draft_model, tokens);
  if (!probe) return;
  engine.spec = draft_model ? EngineOptions::Spec::Draft : EngineOptions::Spec::Ngram;
  engine.draft = draft_model.get();
  engine.spec_tokens = tokens;
  engine.spec_ngram = flags.ngram;
  engine.spec_draft_min_p = flags.draft_min_p >= 0 ? flags.draft_min_p : kDefaultDraftMinP;
}

}  // namespace promptly::cli
