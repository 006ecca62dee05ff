#pragma once
// A small model of the same vocabulary guesses the target's next tokens. It keeps its own KV cache
// of the context it has seen and, on each call, reuses the longest prefix it shares with the new
// context: after a verification only the rejected guesses are dropped and only the target's
// correction is fed again.
#include <memory>

#include "kv/kv_cache.h"
#include "model/model.h"
#include "sampling/sampler.h"
#include "spec/proposer.h"
#include "tokenizer/vocab.h"
#include "util/thread_pool.h"

namespace promptly::spec {

// Throws Error unless both vocabularies have the same size and the same token at every id, naming
// the first id that differs: a draft that spells tokens differently proposes nonsense.
void check_same_vocabulary(const Vocab& target, const Vocab& draft);

struct DraftOptions {
  std::size_t ctx = 0;       // positions the draft may hold (the target's context)
  KvType kv_type = KvType::F32;
  // Greedy drafting stops early once the draft's own top probability falls below this: a guess
  // the draft itself doubts is mostly rejected, and each one costs a draft pass and a verify row.
  float min_confidence = 0.0f;
  SamplingParams sampling;   // temperature > 0: tokens are drawn from the draft's distribution (q)
  // Token trees (tree_width >= 2), as EAGLE-2 grows them: level by level down to tree_depth, the
  // tree_width likeliest nodes of a level (by the draft's cumulative probability from the root)
  // each offer their tree_width likeliest tokens as the next level; the draft runs those nodes as one
  // batch in its own cache, with the tree attention mask. The proposal is then the likeliest of all
  // offers (at most the propose call's max_tokens, each at least tree_min_p): a child is never
  // likelier than its parent, so they form a tree. Deterministic at any temperature: the target
  // verifies siblings as point guesses.
  std::size_t tree_width = 0;
  std::size_t tree_depth = kDefaultTreeDepth;
  float tree_min_p = kDefaultTreeMinP;
};

class DraftModelProposer final : public Proposer {
 public:
  DraftModelProposer(const Model& draft, const DraftOptions& options, ThreadPool& pool);
  void propose(const std::vector<std::int32_t>& context, std::size_t max_tokens, Proposal& out) override;
  const char* name() const override { return options_.tree_width >= 2 ? "tree" : "draft"; }

  std::size_t draft_passes() const { return passes_; }

 private:
  // Brings the cache to `context` minus its last token, then runs that token: logits_ then predict
  // what follows the context.
  void catch_up(const std::vector<std::int32_t>& context);
  // Before catch_up: keeps the nodes of the last tree that `context` went on with and the draft ran.
  void keep_accepted_tree_nodes(const std::vector<std::int32_t>& context);
  void run(std::int32_t token, std::size_t pos);
  void propose_tree(const std::vector<std::int32_t>& context, std::size_t max_nodes, Proposal& out);

  const Model& model_;
  DraftOptions options_;
  ThreadPool& pool_;
  KvCache cache_;
  Sampler sampler_;
  std::vector<std::int32_t> cached_;  // the tokens whose K/V the cache holds, in order
  std::vector<std::int32_t> history_;  // scratch: context + drafted tokens, for penalties
  std::vector<float> logits_, probs_, level_logits_;
  // The last tree proposed: its nodes (tokens, parents) and where the draft ran each one (a slot past
  // tree_context_, -1 for a leaf it never ran). The next call moves the accepted nodes' K/V into
  // place instead of running them again.
  std::vector<std::int32_t> tree_tokens_, tree_parents_, tree_slots_;
  std::size_t tree_context_ = 0;
  Batch batch_;
  std::size_t passes_ = 0;
};

}  // namespace promptly::spec
