// Turns the speculative decoding flags into a proposer, with the errors a user needs.
#include <algorithm>
#include <cctype>
#include <cstdio>
#include <string>

#include "backend/device.h"
#include "cli/commands.h"
#include "model/builtin_model.h"
#include "spec/draft_model.h"
#include "spec/ngram.h"
#include "util/error.h"

namespace promptly::cli {

namespace {
constexpr std::size_t kMaxSpecTokens = 64;

// What the flags ask for, checked, with the defaults filled in; the draft model loaded (on `device`,
// the target's: a draft on the CPU would guess slower than a GPU's target decodes) and its
// vocabulary checked when there is one. `by_default`: the mode to use when neither --spec nor
// --draft is given.
struct ResolvedSpec {
  std::string mode;  // none, ngram, draft or tree
  std::size_t tokens = 0;  // a chain's guesses, a tree's depth
  float draft_min_p = spec::kDefaultDraftMinP;
  std::size_t tree_width = spec::kDefaultTreeWidth, tree_nodes = spec::kDefaultTreeNodes;
  float tree_min_p = spec::kDefaultTreeMinP;
};
ResolvedSpec resolve(const SpecFlags& flags, const Vocab& target_vocab, std::unique_ptr<Model>& draft_model, const char* by_default,
                     const backend::DeviceSpec& device) {
  ResolvedSpec r;
  r.mode = !flags.mode.empty() ? flags.mode : flags.draft.empty() ? by_default : "draft";
  if (r.mode != "none" && r.mode != "ngram" && r.mode != "draft" && r.mode != "tree") {
    throw Error("unknown --spec '" + r.mode + "'; supported: none, ngram (prompt lookup), draft and tree (both need --draft)");
  }
  if (flags.tree_width == 0 || flags.tree_width == 1 || flags.tree_width < -1 || flags.tree_width > 16) {
    throw Error("--spec-tree-width " + std::to_string(flags.tree_width) + " is out of range: 2 to 16 children a node (--spec draft is a chain)");
  }
  if (flags.tree_nodes == 0 || flags.tree_nodes < -1 || flags.tree_nodes > static_cast<long>(Batch::kMaxTreeNodes)) {
    throw Error("--spec-tree-nodes " + std::to_string(flags.tree_nodes) + " is out of range: 1 to " + std::to_string(Batch::kMaxTreeNodes) +
                " nodes a tree");
  }
  if (flags.tree_min_p > 1) throw Error("--spec-tree-min-p " + std::to_string(flags.tree_min_p) + " is a probability: 0 to 1");
  if (flags.tree_min_p >= 0) r.tree_min_p = flags.tree_min_p;
  if (flags.tree_width > 0) r.tree_width = static_cast<std::size_t>(flags.tree_width);
  if (flags.tree_nodes > 0) r.tree_nodes = static_cast<std::size_t>(flags.tree_nodes);
  if (flags.tokens == 0 || flags.tokens < -1 || flags.tokens > static_cast<long>(kMaxSpecTokens)) {
    throw Error("--spec-tokens " + std::to_string(flags.tokens) + " is out of range: 1 to " + std::to_string(kMaxSpecTokens) +
                " guesses a pass (a few, 4-8, is where speculation pays; --spec none turns it off)");
  }
  if (flags.draft_min_p >= 0) r.draft_min_p = flags.draft_min_p;
  if (r.mode == "none") {
    if (!flags.draft.empty()) throw Error("--draft is given but --spec none turns speculation off; drop one of them");
    return r;
  }
  const std::size_t mode_default = r.mode == "ngram" ? spec::kDefaultNgramTokens : r.mode == "tree" ? spec::kDefaultTreeDepth : spec::kDefaultDraftTokens;
  r.tokens = flags.tokens > 0 ? static_cast<std::size_t>(flags.tokens) : mode_default;
  if (r.mode == "ngram") {
    spec::NgramProposer check(flags.ngram);  // throws for an --spec-ngram out of range
    return r;
  }
  if (flags.draft.empty()) {
    throw Error("--spec " + r.mode + " needs a draft model: --draft FILE (a small model with the target's vocabulary)");
  }
  ModelLoadOptions load;
  load.keep_file_layout = device.is_cuda();  // the device uploads the file's blocks (or their Q8_0 conversion)
  if (flags.draft_weights != "stored") {
    std::string name = flags.draft_weights;
    std::transform(name.begin(), name.end(), name.begin(), [](unsigned char c) { return static_cast<char>(std::toupper(c)); });
    load.float_matrices_as = dtype_from_name(name);  // which types a model converts to, Model checks
    if (!load.float_matrices_as) throw Error("--draft-weights '" + flags.draft_weights + "' is not a type: Q8_0, Q4_0, Q4_K, Q6_K or stored");
  }
  std::shared_ptr<const gguf::File> file = open_model_file(flags.draft);
  try {
    draft_model = std::make_unique<Model>(file, nullptr, load);
    spec::check_same_vocabulary(target_vocab, Vocab::from_gguf(*file));
    if (device.is_cuda()) {
      backend::place_on_device(*draft_model, device);
      const backend::DeviceForward& on = *draft_model->device();
      std::fprintf(stderr, "promptly: draft model on %s, %.0f MB of weights in device memory\n", on.name().c_str(),
                   static_cast<double>(on.weight_bytes()) / 1e6);
    }
  } catch (const Error& e) {
    throw Error("draft model '" + flags.draft + "': " + e.what());
  }
  return r;
}
}  // namespace

std::unique_ptr<spec::Proposer> make_proposer(const SpecFlags& flags, const Vocab& target_vocab, std::size_t ctx,
                                              KvType kv_type, const SamplingParams& sampling, ThreadPool& pool,
                                              std::unique_ptr<Model>& draft_model, std::size_t& spec_tokens,
                                              const backend::DeviceSpec& device) {
  const ResolvedSpec r = resolve(flags, target_vocab, draft_model, "none", device);
  spec_tokens = r.mode == "tree" ? r.tree_nodes : r.tokens;  // what a pass verifies: a tree's nodes
  if (r.mode == "none") return nullptr;
  if (r.mode == "ngram") return std::make_unique<spec::NgramProposer>(flags.ngram);
  spec::DraftOptions d;
  d.ctx = ctx;
  d.kv_type = kv_type;
  d.sampling = sampling;
  d.min_confidence = r.draft_min_p;
  if (r.mode == "tree") {
    d.tree_width = r.tree_width;
    d.tree_depth = r.tokens;
    d.tree_min_p = r.tree_min_p;
  }
  return std::make_unique<spec::DraftModelProposer>(*draft_model, d, pool);
}

void apply_spec_flags(const SpecFlags& flags, const Vocab& target_vocab, EngineOptions& engine, std::unique_ptr<Model>& draft_model,
                      const backend::DeviceSpec& device) {
  // serve's default without --spec or --draft: n-gram lookup for greedy requests (README, Serving
  // defaults: 1.7x a greedy stream on the built-in model, nothing to load, and sampled requests
  // keep their seeded reproducibility). The proposers themselves are made per stream by the engine.
  const bool by_default = flags.mode.empty() && flags.draft.empty();
  const ResolvedSpec r = resolve(flags, target_vocab, draft_model, "ngram", device);
  engine.spec_sampled = !by_default;
  if (r.mode == "none") return;
  engine.spec = r.mode == "draft" ? EngineOptions::Spec::Draft : r.mode == "tree" ? EngineOptions::Spec::Tree : EngineOptions::Spec::Ngram;
  engine.draft = draft_model.get();
  engine.spec_tokens = r.mode == "tree" ? r.tree_nodes : r.tokens;
  engine.spec_tree_width = r.tree_width;
  engine.spec_tree_depth = r.tokens;
  engine.spec_tree_min_p = r.tree_min_p;
  engine.spec_ngram = flags.ngram;
  engine.spec_draft_min_p = r.draft_min_p;
}

}  // namespace promptly::cli
