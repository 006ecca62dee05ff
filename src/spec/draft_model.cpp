#include "spec/draft_model.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "util/error.h"

namespace promptly::spec {

namespace {
constexpr int kSeq = 0;
constexpr std::size_t kPrefillChunk = 512;
}  // namespace

void check_same_vocabulary(const Vocab& target, const Vocab& draft) {
  const std::size_t n = std::min(target.size(), draft.size());
  for (std::size_t id = 0; id < n; ++id) {
    if (target.tokens[id] != draft.tokens[id]) {
      throw Error("the draft model's vocabulary differs from the target's at id " + std::to_string(id) + " ('" + draft.tokens[id] +
                  "' against '" + target.tokens[id] + "'): speculative decoding needs a draft with the same tokenizer");
    }
  }
  if (target.size() != draft.size()) {
    throw Error("the draft model has " + std::to_string(draft.size()) + " tokens but the target has " + std::to_string(target.size()) +
                " (first id past the shorter one: " + std::to_string(n) + "): speculative decoding needs the same vocabulary");
  }
}

namespace {
// The draft draws from its own stream: were it the target's seed, the draft's i-th uniform would
// be one the target also uses for its acceptance tests, and guesses and verdicts would correlate.
SamplingParams draft_sampling(SamplingParams p) {
  std::uint64_t z = p.seed + 0x9E3779B97F4A7C15ull;  // splitmix64's finaliser
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  p.seed = z ^ (z >> 31);
  return p;
}
}  // namespace

DraftModelProposer::DraftModelProposer(const Model& draft, const DraftOptions& options, ThreadPool& pool)
    : model_(draft),
      options_(options),
      pool_(pool),
      cache_(draft.make_cache(std::min<std::size_t>(options.ctx ? options.ctx : draft.config().n_ctx_train, draft.config().n_ctx_train),
                              options.kv_type)),
      sampler_(draft_sampling(options.sampling)) {}

void DraftModelProposer::run(std::int32_t token, std::size_t pos) {
  batch_.clear();
  batch_.add(token, static_cast<std::int32_t>(pos), kSeq, true);
  model_.forward(batch_, cache_, pool_, logits_);
  cached_.push_back(token);
  ++passes_;
}

void DraftModelProposer::catch_up(const std::vector<std::int32_t>& context) {
  // The last context token always runs again: its logits are what the first guess comes from.
  std::size_t common = static_cast<std::size_t>(std::mismatch(cached_.begin(), cached_.end(), context.begin(), context.end()).first - cached_.begin());
  common = std::min(common, context.size() - 1);
  if (!cached_.empty()) cache_.set_length(kSeq, common);  // the sequence exists once a pass has run
  cached_.resize(common);
  for (std::size_t start = common; start < context.size(); start += kPrefillChunk) {
    const std::size_t end = std::min(context.size(), start + kPrefillChunk);
    batch_.clear();
    for (std::size_t i = start; i < end; ++i) batch_.add(context[i], static_cast<std::int32_t>(i), kSeq, i + 1 == context.size());
    model_.forward(batch_, cache_, pool_, logits_);
    ++passes_;
  }
  cached_ = context;
}

void DraftModelProposer::propose_tree(const std::vector<std::int32_t>& context, std::size_t max_nodes, Proposal& out) {
  max_nodes = std::min({max_nodes, Batch::kMaxTreeNodes, cache_.max_positions() - context.size()});
  if (max_nodes == 0) return;
  catch_up(context);
  const std::size_t n_vocab = model_.config().n_vocab;
  const auto C = static_cast<std::int32_t>(context.size());
  struct Node {
    std::int32_t depth = 0;
    std::uint64_t ancestors = 0;  // its own bit and its ancestors' (Batch::tree_ancestors)
    double log_p = 0;             // the draft's cumulative log probability from the root
  };
  std::vector<Node> nodes;
  struct Offer {
    double log_p;
    std::int32_t parent;  // -1: the root
    std::int32_t token;
  };
  std::vector<Offer> offers;
  std::vector<std::int32_t> frontier = {-1};  // the last level's nodes; row i of `rows` is frontier[i]'s prediction
  const float* rows = logits_.data();
  std::vector<std::pair<float, std::int32_t>> top;
  const double min_log_p = std::log(std::max(options_.tree_min_p, 1e-30f));
  for (std::size_t depth = 1; depth <= options_.tree_depth && nodes.size() < max_nodes; ++depth) {
    offers.clear();
    for (std::size_t f = 0; f < frontier.size(); ++f) {
      const float* row = rows + f * n_vocab;
      const double lse = log_sum_exp(row, n_vocab);
      top.clear();
      for (std::size_t v = 0; v < n_vocab; ++v) {
        if (top.size() < options_.tree_width || row[v] > top.back().first) {
          if (top.size() == options_.tree_width) top.pop_back();
          top.emplace_back(row[v], static_cast<std::int32_t>(v));
          for (std::size_t i = top.size() - 1; i > 0 && top[i].first > top[i - 1].first; --i) std::swap(top[i], top[i - 1]);
        }
      }
      const double base = frontier[f] < 0 ? 0.0 : nodes[static_cast<std::size_t>(frontier[f])].log_p;
      for (const auto& [logit, token] : top) offers.push_back({base + static_cast<double>(logit) - lse, frontier[f], token});
    }
    std::stable_sort(offers.begin(), offers.end(), [](const Offer& a, const Offer& b) { return a.log_p > b.log_p; });
    frontier.clear();
    batch_.clear();
    for (const Offer& o : offers) {
      if (nodes.size() == max_nodes || o.log_p < min_log_p) break;
      const auto index = static_cast<std::int32_t>(nodes.size());
      const std::uint64_t ancestors = (std::uint64_t{1} << index) | (o.parent < 0 ? 0 : nodes[static_cast<std::size_t>(o.parent)].ancestors);
      nodes.push_back({static_cast<std::int32_t>(depth), ancestors, o.log_p});
      out.tokens.push_back(o.token);
      out.parents.push_back(o.parent);
      frontier.push_back(index);
      batch_.add_tree_node(o.token, kSeq, C, index, static_cast<std::int32_t>(depth), ancestors, true);
    }
    // The next level needs this one's predictions: one draft pass over the level, in the tree's slots.
    if (frontier.empty() || depth == options_.tree_depth || nodes.size() == max_nodes) break;
    model_.forward(batch_, cache_, pool_, level_logits_);
    ++passes_;
    rows = level_logits_.data();
  }
}

void DraftModelProposer::propose(const std::vector<std::int32_t>& context, std::size_t max_tokens, Proposal& out) {
  out.clear();
  if (options_.tree_width >= 2) {
    if (!context.empty() && context.size() < cache_.max_positions()) propose_tree(context, max_tokens, out);
    return;
  }
  // The last guess is never run, so guesses need positions up to context.size() + max_tokens - 2.
  const std::size_t room = cache_.max_positions();
  if (context.empty() || context.size() >= room) return;
  max_tokens = std::min(max_tokens, room - context.size() + 1);
  if (max_tokens == 0) return;
  catch_up(context);
  const std::size_t n_vocab = model_.config().n_vocab;
  const bool sampled = options_.sampling.temperature > 0;
  history_ = context;
  for (std::size_t i = 0; i < max_tokens; ++i) {
    std::int32_t token;
    if (sampled) {
      sampler_.distribution(logits_.data(), n_vocab, history_, probs_);
      token = sampler_.draw(probs_);
      out.q.push_back(probs_);
    } else {
      token = sampler_.sample(logits_.data(), n_vocab, history_);  // greedy, after the same penalties as the target's
      if (options_.min_confidence > 0) {
        const double p_top = std::exp(static_cast<double>(logits_[static_cast<std::size_t>(token)]) - log_sum_exp(logits_.data(), n_vocab));
        if (p_top < options_.min_confidence) break;
      }
    }
    out.tokens.push_back(token);
    history_.push_back(token);
    if (i + 1 < max_tokens) run(token, context.size() + i);
  }
}

}  // namespace promptly::spec
