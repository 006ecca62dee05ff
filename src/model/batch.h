#pragma once
// One forward pass's worth of tokens: any mix of sequences, each contributing a contiguous run of
// positions (a prefill chunk or a single decode token), and the token trees of speculative decoding.
#include <cstdint>
#include <vector>

namespace promptly {

struct Batch {
  // Most nodes a token tree may have: a node's ancestors are one 64-bit mask.
  static constexpr std::size_t kMaxTreeNodes = 64;

  std::vector<std::int32_t> tokens;
  std::vector<std::int32_t> positions;  // what RoPE rotates by
  std::vector<std::int32_t> seq_ids;
  std::vector<std::uint8_t> want_logits;  // 1 where the caller needs this token's logits
  // Where each token's K/V is stored: its position, except for tree nodes.
  std::vector<std::int32_t> kv_slots;
  // Token trees: tree_context[t] is -1 for an ordinary token, which sees positions [0, position] of
  // its sequence. A tree node (node i of a tree grown after the first C positions: tree_context[t]
  // = C) is stored at slot C + i and sees positions [0, C) and the tree's slots C + j for every bit
  // j of tree_ancestors[t]: its ancestors in the tree and itself, never its siblings' branches. Its
  // position is C - 1 + its depth (the first level's is C). The nodes may come from earlier passes:
  // a node's ancestors only need to be in the cache by the time it runs.
  std::vector<std::int32_t> tree_context;
  std::vector<std::uint64_t> tree_ancestors;

  void add(std::int32_t token, std::int32_t position, std::int32_t seq, bool logits) {
    tokens.push_back(token);
    positions.push_back(position);
    seq_ids.push_back(seq);
    want_logits.push_back(logits ? 1 : 0);
    kv_slots.push_back(position);
    tree_context.push_back(-1);
    tree_ancestors.push_back(0);
  }
  // Node `node` (< kMaxTreeNodes) of a tree after the first `context` positions of `seq`, at depth
  // `depth` (1 for the first level), with `ancestors` its own bit and those of its ancestors.
  void add_tree_node(std::int32_t token, std::int32_t seq, std::int32_t context, std::int32_t node, std::int32_t depth,
                     std::uint64_t ancestors, bool logits) {
    tokens.push_back(token);
    positions.push_back(context - 1 + depth);
    seq_ids.push_back(seq);
    want_logits.push_back(logits ? 1 : 0);
    kv_slots.push_back(context + node);
    tree_context.push_back(context);
    tree_ancestors.push_back(ancestors);
  }
  bool has_tree() const {
    for (std::int32_t c : tree_context) {
      if (c >= 0) return true;
    }
    return false;
  }
  std::size_t size() const { return tokens.size(); }
  void clear() {
    tokens.clear();
    positions.clear();
    seq_ids.clear();
    want_logits.clear();
    kv_slots.clear();
    tree_context.clear();
    tree_ancestors.clear();
  }
};

}  // namespace promptly
