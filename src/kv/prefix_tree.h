#pragma once
// The prefix cache: a radix tree over whole KV blocks keyed by the tokens they hold. A new request
// reuses the longest cached prefix of its prompt (block-aligned) and computes only the rest; finished
// sequences leave their blocks here (the tree holds one reference per block), so the next turn of a
// conversation, or another request with the same system prompt, hits. Blocks that only the tree
// still references are evictable, least recently used leaf first.
//
// Partly filled blocks: a finished sequence's last block (holding fewer than B tokens) is cached
// too, as a leaf with a short key, and a request whose prompt goes on past its longest block-aligned
// match copies the rows it shares with any child there (partial or full) into a block of its own:
// copy-on-read. The copy is a few hundred KB of memcpy (microseconds); recomputing those rows (up to
// B - 1 tokens, 7.5 on average in a chat's follow-up turn) costs milliseconds each on the model.
// Copying rather than sharing keeps the rule that cached blocks are never written: the new owner
// appends to its copy.
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <vector>

#include "kv/block_pool.h"

namespace promptly {

//
// Sliding windows: a cached block may have given up its local layers' KV (BlockPool::Hold). A match
// uses such a block only where the match ends at least a window past it, so that no query computed
// after the match reaches it (a follow-up turn of a long conversation); otherwise the match stops
// before it, and the recomputed block, whole again, takes its place in the tree.
class PrefixTree {
 public:
  // `window`: the local layers' window when the pool's blocks may give up their KV (0: never).
  explicit PrefixTree(BlockPool& pool, std::size_t window = 0);
  ~PrefixTree();
  PrefixTree(const PrefixTree&) = delete;
  PrefixTree& operator=(const PrefixTree&) = delete;

  // Appends to `blocks` the cached blocks of the longest block-aligned prefix of the first
  // min(limit, size) `tokens`, each retained for the caller, and returns how many tokens the match
  // covers. Where the tokens go on to share rows with a cached child block, those rows are copied
  // into a freshly allocated block (owned by the caller, appended last) and count in the result
  // (skipped when the pool has no free block). Counts as a query (stats) only when `count` is set.
  std::size_t match(const std::vector<std::int32_t>& tokens, std::vector<int>& blocks, std::size_t limit = SIZE_MAX,
                    bool count = true);

  // Offers a sequence's full blocks (blocks[i] holds tokens [i*B, (i+1)*B)). Blocks for prefixes the
  // tree lacks are adopted (retained); where the tree already has that prefix, it keeps its own block.
  void insert(std::span<const std::int32_t> tokens, const std::vector<int>& blocks);
  // Offers a sequence's partly filled last block: `tokens` are all the tokens whose K/V it has
  // computed, `block` holds the last tokens.size() % B of them (the rest must be cached already).
  // Adopted (retained) unless a cached block already holds those rows.
  void insert_partial(std::span<const std::int32_t> tokens, int block);

  // How many leading tokens of `tokens` match would cover now (whole blocks, then the rows shared
  // with a child), without retaining, copying or counting anything: a look ahead for the engine.
  std::size_t cached_length(std::span<const std::int32_t> tokens) const;

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
    std::vector<std::int32_t> key;  // B tokens, or fewer for a partly filled block (always a leaf)
    mutable std::uint64_t last_used = 0;  // LRU bookkeeping, touched by lookups
    std::map<std::vector<std::int32_t>, std::unique_ptr<Node>> children;
  };

  // The child of `node` whose key shares the most leading tokens with `rows` (null and 0 if none).
  struct SharedRows {
    const Node* node = nullptr;
    std::size_t rows = 0;
  };
  SharedRows most_shared_rows(const Node& node, std::span<const std::int32_t> rows) const;
  // The nodes of the longest cached prefix of `tokens` in whole blocks, the root's child first.
  std::vector<const Node*> block_path(std::span<const std::int32_t> tokens) const;
  // How many leading blocks of `path` a match may use (see above).
  std::size_t usable_blocks(const std::vector<const Node*>& path) const;
  // The node of the cached block-aligned prefix `tokens` (whole blocks), or null when not cached.
  Node* find_path(std::span<const std::int32_t> tokens);
  // Releases `node`'s partial children whose rows are a strict prefix of `key` (now redundant).
  void drop_partials_covered_by(Node& node, std::span<const std::int32_t> key);

  BlockPool& pool_;
  std::size_t window_;
  Node root_;
  std::size_t n_nodes_ = 0;
  std::uint64_t clock_ = 0;
  std::size_t queries_ = 0, hit_tokens_ = 0;
};

}  // namespace promptly
