#pragma once
// The prefix cache: a radix tree over whole KV blocks keyed by the tokens they hold. A new request
// reuses the longest cached prefix of its prompt (block-aligned) and computes only the rest; finished
// sequences leave their blocks here (the tree holds one reference per block), so the next turn of a
// conversation, or another request with the same system prompt, hits. Blocks that only the tree
// still references are evictable, least recently used leaf first. A partly filled last block is not
// cached: the next request recomputes those few tokens, which is cheaper than copy-on-write.
#include <cstddef>
#include <cstdint>
#include <cstddef>
#include <map>
#include <memory>
#include <span>
#include <vector>

#include "kv/block_pool.h"

namespace promptly {

class PrefixTree {
 public:
  explicit PrefixTree(BlockPool& pool);
  ~PrefixTree();
  PrefixTree(const PrefixTree&) = delete;
  PrefixTree& operator=(const PrefixTree&) = delete;

  // Appends to `blocks` the cached blocks of the longest block-aligned prefix of the first
  // min(limit, size) `tokens` and returns how many tokens they hold. Each returned block is retained
  // for the caller. Counts as a query (stats) only when `count` is set.
  std::size_t match(const std::vector<std::int32_t>& tokens, std::vector<int>& blocks, std::size_t limit = SIZE_MAX,
                    bool count = true);

  // Offers a sequence's full blocks (blocks[i] holds tokens [i*B, (i+1)*B)). Blocks for prefixes the
  // tree lacks are adopted (retained); where the tree already has that prefix, it keeps its own block.
  void insert(std::span<const std::int32_t> tokens, const std::vector<int>& blocks);

  // Releases up to `n` blocks that only the tree references, least recently used leaves first.
  // Returns how many were freed.
  std::size_t evict(std::size_t n);

  std::size_t cached_blocks() const { return n_nodes_; }
  // Cached blocks that nobody but the tree references (what evict could free).
  std::size_t evictable_blocks() const;
  std::size_t queries() const { return queries_; }
  std::size_t hit_tokens() const { return hit_tokens_; }

 private:
  struct Node {
    int block = -1;
    Node* parent = nullptr;
    std::vector<std::int32_t> key;
    std::uint64_t last_used = 0;
    std::map<std::vector<std::int32_t>, std::unique_ptr<Node>> children;
  };

  BlockPool& pool_;
  Node root_;
  std::size_t n_nodes_ = 0;
  std::uint64_t clock_ = 0;
  std::size_t queries_ = 0, hit_tokens_ = 0;
};

}  // namespace promptly
