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

void DraftModelProposer::keep_accepted_tree_nodes(const std::vector<std::int32_t>& context) {
  const std::size_t C = tree_context_;
  if (tree_tokens_.empty() || cached_.size() != C || context.size() <= C || !std::equal(cached_.begin(), cached_.end(), context.begin())) {
    return;
  }
  // Down the tree along the context's tokens; a node at depth d ran in slot C + s with s >= d - 1,
  // so moving them in order never overwrites one still to come.
  std::int32_t node = -1;
  for (std::size_t j = C; j < context.size(); ++j) {
    std::int32_t next = -1;
    for (std::size_t i = 0; i < tree_tokens_.size() && next < 0; ++i) {
      if (tree_parents_[i] == node && tree_tokens_[i] == context[j] && tree_slots_[i] >= 0) next = static_cast<std::int32_t>(i);
    }
    if (next < 0) break;
    cache_.move_position(kSeq, C + static_cast<std::size_t>(tree_slots_[static_cast<std::size_t>(next)]), j);
    cached_.push_back(context[j]);
    node = next;
  }
}

void DraftModelProposer::propose_tree(const std::vector<std::int32_t>& context, std::size_t max_nodes, Proposal& out) {
  max_nodes = std::min(max_nodes, Batch::kMaxTreeNodes);
  const std::size_t width = options_.tree_width;
  // The draft runs at most `width` nodes a level below the first, in slots past the context.
  if (max_nodes == 0 || context.size() + width * options_.tree_depth > cache_.max_positions()) return;
  keep_accepted_tree_nodes(context);
  tree_tokens_.clear();
  tree_parents_.clear();
  tree_slots_.clear();
  catch_up(context);
  const std::size_t n_vocab = model_.config().n_vocab;
  const auto C = static_cast<std::int32_t>(context.size());
  struct Candidate {
    std::int32_t token, parent;  // parent: an index into candidates, -1 for the root
    std::int32_t depth;
    double log_p;                 // the draft's cumulative log probability from the root
    std::uint64_t ancestors = 0;  // once the draft has run it: its own slot bit and its ancestors'
    std::int32_t slot = -1;       // where the draft ran it, past the context
  };
  std::vector<Candidate> candidates;
  std::vector<std::int32_t> frontier = {-1};  // nodes whose children the next level offers; row f of `rows` predicts after frontier[f]
  const float* rows = logits_.data();
  std::vector<std::pair<float, std::int32_t>> top;
  std::vector<std::size_t> level;
  std::int32_t next_slot = 0;
  for (std::size_t depth = 1; depth <= options_.tree_depth; ++depth) {
    // Each frontier node offers its `width` likeliest tokens.
    level.clear();
    for (std::size_t f = 0; f < frontier.size(); ++f) {
      const float* row = rows + f * n_vocab;
      const double lse = log_sum_exp(row, n_vocab);
      top.clear();
      for (std::size_t v = 0; v < n_vocab; ++v) {
        if (top.size() < width || row[v] > top.back().first) {
          if (top.size() == width) top.pop_back();
          top.emplace_back(row[v], static_cast<std::int32_t>(v));
          for (std::size_t i = top.size() - 1; i > 0 && top[i].first > top[i - 1].first; --i) std::swap(top[i], top[i - 1]);
        }
      }
      const double base = frontier[f] < 0 ? 0.0 : candidates[static_cast<std::size_t>(frontier[f])].log_p;
      for (const auto& [logit, token] : top) {
        level.push_back(candidates.size());
        candidates.push_back({token, frontier[f], static_cast<std::int32_t>(depth), base + static_cast<double>(logit) - lse});
      }
    }
    if (depth == options_.tree_depth) break;
    // The level's `width` likeliest offers grow the next level: one draft pass over them, as tree
    // nodes in the draft's own cache.
    std::stable_sort(level.begin(), level.end(), [&](std::size_t a, std::size_t b) { return candidates[a].log_p > candidates[b].log_p; });
    level.resize(std::min(level.size(), width));
    frontier.clear();
    batch_.clear();
    for (std::size_t c : level) {
      Candidate& node = candidates[c];
      node.ancestors = (std::uint64_t{1} << next_slot) | (node.parent < 0 ? 0 : candidates[static_cast<std::size_t>(node.parent)].ancestors);
      node.slot = next_slot++;
      batch_.add_tree_node(node.token, kSeq, C, node.slot, node.depth, node.ancestors, true);
      frontier.push_back(static_cast<std::int32_t>(c));
    }
    model_.forward(batch_, cache_, pool_, level_logits_);
    ++passes_;
    rows = level_logits_.data();
  }
  // The tree: the max_nodes likeliest candidates at or above tree_min_p. A child is never likelier
  // than its parent and comes after it, so the stable order keeps every parent before its children.
  std::vector<std::size_t> order(candidates.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return candidates[a].log_p > candidates[b].log_p; });
  const double min_log_p = std::log(std::max(options_.tree_min_p, 1e-30f));
  std::vector<std::int32_t> index_in_tree(candidates.size(), -1);
  for (std::size_t c : order) {
    const Candidate& node = candidates[c];
    if (out.tokens.size() == max_nodes || node.log_p < min_log_p) break;
    index_in_tree[c] = static_cast<std::int32_t>(out.tokens.size());
    out.tokens.push_back(node.token);
    out.parents.push_back(node.parent < 0 ? -1 : index_in_tree[static_cast<std::size_t>(node.parent)]);
    tree_slots_.push_back(node.slot);
  }
  tree_tokens_ = out.tokens;
  tree_parents_ = out.parents;
  tree_context_ = context.size();
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
