#include "kv/prefix_tree.h"

#include <gtest/gtest.h>

#include <numeric>

namespace promptly {
namespace {

std::vector<std::int32_t> iota(std::size_t n, std::int32_t from) {
  std::vector<std::int32_t> v(n);
  std::iota(v.begin(), v.end(), from);
  return v;
}

TEST(PrefixTree, FollowUpTurnReusesTheHistory) {
  BlockPool pool(1, 4, 4, 16);
  PrefixTree tree(pool);
  // Turn 1: 10 tokens -> 2 full blocks (+2 tokens in a partial block the tree does not take).
  const auto turn1 = iota(10, 100);
  std::vector<int> seq_blocks = {pool.allocate(), pool.allocate(), pool.allocate()};
  tree.insert(turn1, seq_blocks);
  EXPECT_EQ(tree.cached_blocks(), 2u);
  for (int b : seq_blocks) pool.release(b);  // the request finishes
  EXPECT_EQ(pool.refs(seq_blocks[0]), 1);    // the tree keeps the full blocks ...
  EXPECT_EQ(pool.n_free(), 16u - 2u);        // ... and the partial one went back to the pool

  // Turn 2 = turn 1 + answer + new message: the two cached blocks are reused.
  auto turn2 = turn1;
  for (std::int32_t t : iota(9, 500)) turn2.push_back(t);
  std::vector<int> reused;
  EXPECT_EQ(tree.match(turn2, reused), 8u);
  EXPECT_EQ(reused, (std::vector<int>{seq_blocks[0], seq_blocks[1]}));
  EXPECT_EQ(pool.refs(seq_blocks[0]), 2);  // retained for the new request
  EXPECT_EQ(tree.hit_tokens(), 8u);

  // A different prompt shares nothing.
  std::vector<int> none;
  EXPECT_EQ(tree.match(iota(12, 7), none), 0u);
  EXPECT_TRUE(none.empty());
  EXPECT_EQ(tree.queries(), 2u);
  for (int b : reused) pool.release(b);
}

TEST(PrefixTree, SharedSystemPromptKeepsOneCopy) {
  BlockPool pool(1, 4, 4, 16);
  PrefixTree tree(pool);
  auto a = iota(8, 1), b = iota(8, 1);
  a.insert(a.end(), {50, 51, 52, 53});
  b.insert(b.end(), {60, 61, 62, 63});
  std::vector<int> ba = {pool.allocate(), pool.allocate(), pool.allocate()};
  std::vector<int> bb = {pool.allocate(), pool.allocate(), pool.allocate()};
  tree.insert(a, ba);
  tree.insert(b, bb);  // its first two blocks duplicate a's prefix: the tree keeps a's
  EXPECT_EQ(tree.cached_blocks(), 4u);
  EXPECT_EQ(pool.refs(bb[0]), 1);
  EXPECT_EQ(pool.refs(ba[0]), 2);
  for (int x : ba) pool.release(x);
  for (int x : bb) pool.release(x);
  EXPECT_EQ(pool.n_free(), 16u - 4u);
}

TEST(PrefixTree, EvictsLeastRecentlyUsedUnreferencedLeavesOnly) {
  BlockPool pool(1, 4, 2, 8);
  PrefixTree tree(pool);
  std::vector<int> x = {pool.allocate(), pool.allocate()}, y = {pool.allocate()};
  tree.insert(std::vector<std::int32_t>{1, 2, 3, 4}, x);  // chain of 2 blocks
  tree.insert(std::vector<std::int32_t>{9, 9}, y);      // a separate leaf
  for (int b : x) pool.release(b);
  for (int b : y) pool.release(b);
  std::vector<int> held;
  tree.match({1, 2, 3, 4}, held);  // x's chain is in use again (and most recently used)
  EXPECT_EQ(tree.evict(10), 1u);   // only y's block is held by the tree alone
  EXPECT_EQ(tree.cached_blocks(), 2u);
  for (int b : held) pool.release(b);
  EXPECT_EQ(tree.evict(10), 2u);  // the leaf first, then its parent
  EXPECT_EQ(tree.cached_blocks(), 0u);
  EXPECT_EQ(pool.n_free(), pool.n_blocks());
}

}  // namespace
}  // namespace promptly
