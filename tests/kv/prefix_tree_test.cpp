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
  // Turn 1: 10 tokens -> 2 full blocks (+2 tokens in a partial block `insert` does not take).
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

// Sliding windows: layer 0 is local (window 6), blocks of 4. A finished sequence of 32 tokens gave
// up the local KV of blocks 0-5 (behind its last query's window); the segments stay with their
// blocks until taken. A match may use a block without its segment only where it ends a window past
// it; otherwise it stops before the block, and the block recomputed whole replaces it in the tree.
TEST(PrefixTree, MatchesStopBeforeBlocksTheirQueriesWouldSeeWithoutLocalKv) {
  constexpr std::size_t kWindow = 6;
  BlockPool pool(2, 4, 4, 32, KvType::F32, 0, {true, false});
  PrefixTree tree(pool, kWindow);
  const auto conversation = iota(32, 100);
  std::vector<int> seq;
  for (int i = 0; i < 8; ++i) seq.push_back(pool.allocate());
  tree.insert(conversation, seq);
  for (int i = 0; i < 6; ++i) EXPECT_TRUE(pool.unpin_local(seq[static_cast<std::size_t>(i)]));
  for (int i = 0; i < 8; ++i) pool.release(seq[static_cast<std::size_t>(i)], i < 6 ? BlockPool::Hold::Cached : BlockPool::Hold::Whole);

  auto follow_up = conversation;
  for (std::int32_t t : iota(10, 900)) follow_up.push_back(t);
  auto early = std::vector<std::int32_t>(conversation.begin(), conversation.begin() + 20);
  for (std::int32_t t : iota(3, 900)) early.push_back(t);
  auto match = [&](const std::vector<std::int32_t>& tokens) {
    std::vector<int> blocks;
    const std::size_t n = tree.match(tokens, blocks);
    for (int b : blocks) pool.release(b);
    return n;
  };
  // Given up, not taken: everything is still there.
  EXPECT_EQ(tree.cached_length(follow_up), 32u);
  EXPECT_EQ(tree.cached_length(early), 20u);

  // A request through blocks 0-2 takes their segments back and gives them up again: now the most
  // recently given up. Two new blocks take the ones given up longest ago: blocks 3 and 4.
  auto branch = std::vector<std::int32_t>(conversation.begin(), conversation.begin() + 12);
  branch.push_back(7);
  std::vector<int> through;
  EXPECT_EQ(tree.match(branch, through), 12u);
  for (int b : through) {
    EXPECT_TRUE(pool.unpin_local(b));
    pool.release(b, BlockPool::Hold::Cached);
  }
  std::vector<int> others = {pool.allocate(), pool.allocate()};
  for (std::size_t i = 0; i < 8; ++i) EXPECT_EQ(pool.has_local(seq[i]), i < 3 || i > 4) << i;
  // The follow-up's first query (at 32) sees (26, 32]: blocks 3 and 4 (up to position 19) are behind it.
  EXPECT_EQ(tree.cached_length(follow_up), 32u);
  EXPECT_EQ(match(follow_up), 32u);
  // A query at 20 would see block 4 (positions 16-19), at 16 block 3: the match stops at 12.
  EXPECT_EQ(tree.cached_length(early), 12u);
  EXPECT_EQ(match(early), 12u);

  // The early request recomputes blocks 3 and 4: whole again, they replace the tree's.
  std::vector<int> recomputed;
  tree.match(early, recomputed);
  recomputed.push_back(pool.allocate());
  recomputed.push_back(pool.allocate());
  tree.insert(early, recomputed);
  EXPECT_EQ(tree.cached_blocks(), 8u);
  EXPECT_EQ(pool.refs(seq[3]), 0);  // given back: nobody held it
  for (int b : recomputed) pool.release(b);
  EXPECT_EQ(match(early), 20u);
  EXPECT_EQ(match(follow_up), 32u);
  for (int b : others) pool.release(b);
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

// A finished sequence's partly filled last block is cached too; a request whose prompt goes on
// through those rows gets a private copy of them instead of recomputing them.
TEST(PrefixTree, PartialLastBlockIsCopiedOnRead) {
  BlockPool pool(2, 4, 4, 16, KvType::F32);
  PrefixTree tree(pool);
  const auto turn1 = iota(10, 100);  // 2 full blocks + 2 rows
  std::vector<int> seq_blocks = {pool.allocate(), pool.allocate(), pool.allocate()};
  for (std::size_t layer = 0; layer < 2; ++layer) {
    for (std::size_t i = 0; i < 4 * 4; ++i) {
      reinterpret_cast<float*>(pool.keys(seq_blocks[2], layer))[i] = static_cast<float>(layer * 100 + i);
      reinterpret_cast<float*>(pool.values(seq_blocks[2], layer))[i] = -static_cast<float>(layer * 100 + i);
    }
  }
  tree.insert(turn1, seq_blocks);
  tree.insert_partial(turn1, seq_blocks[2]);
  EXPECT_EQ(tree.cached_blocks(), 3u);
  for (int b : seq_blocks) pool.release(b);
  EXPECT_EQ(pool.refs(seq_blocks[2]), 1);  // the tree's

  auto turn2 = turn1;
  for (std::int32_t t : iota(9, 500)) turn2.push_back(t);
  std::vector<int> reused;
  EXPECT_EQ(tree.match(turn2, reused), 10u);
  ASSERT_EQ(reused.size(), 3u);
  EXPECT_EQ(reused[1], seq_blocks[1]);
  const int copy = reused[2];
  EXPECT_NE(copy, seq_blocks[2]);
  EXPECT_EQ(pool.refs(copy), 1);  // the caller's alone: it will write after the copied rows
  for (std::size_t layer = 0; layer < 2; ++layer) {
    for (std::size_t i = 0; i < 2 * 4; ++i) {  // 2 rows of 4
      EXPECT_EQ(reinterpret_cast<float*>(pool.keys(copy, layer))[i], static_cast<float>(layer * 100 + i));
      EXPECT_EQ(reinterpret_cast<float*>(pool.values(copy, layer))[i], -static_cast<float>(layer * 100 + i));
    }
  }
  for (int b : reused) pool.release(b);

  // A prompt that leaves the partial rows after one of them, or a limit inside them, copies fewer.
  auto diverging = iota(9, 100);
  diverging.push_back(7);
  reused.clear();
  EXPECT_EQ(tree.match(diverging, reused), 9u);
  for (int b : reused) pool.release(b);
  reused.clear();
  EXPECT_EQ(tree.match(turn2, reused, 9), 9u);
  for (int b : reused) pool.release(b);
  // Rows shared with a full cached block are copied too (a prompt ending inside that block).
  reused.clear();
  EXPECT_EQ(tree.match(iota(6, 100), reused), 6u);
  EXPECT_EQ(reused.size(), 2u);
  for (int b : reused) pool.release(b);

  // No free block: the rows are left to be recomputed rather than shared.
  std::vector<int> hog;
  while (pool.n_free() > 0) hog.push_back(pool.allocate());
  reused.clear();
  EXPECT_EQ(tree.match(turn2, reused), 8u);
  for (int b : reused) pool.release(b);
  for (int b : hog) pool.release(b);

  // A longer partial block (the next turn stopped one token later) replaces the shorter one, and a
  // full block over the same rows replaces any partial one.
  std::vector<int> longer = {seq_blocks[0], seq_blocks[1], pool.allocate()};
  const auto turn1b = iota(11, 100);
  tree.insert_partial(turn1b, longer[2]);
  pool.release(longer[2]);
  EXPECT_EQ(tree.cached_blocks(), 3u);
  EXPECT_EQ(pool.refs(seq_blocks[2]), 0);  // the shorter one went back to the pool
  const int spare = pool.allocate();
  tree.insert_partial(turn1, spare);  // rows already cached: not adopted
  EXPECT_EQ(tree.cached_blocks(), 3u);
  EXPECT_EQ(pool.refs(spare), 1);
  pool.release(spare);
  const int full = pool.allocate();
  tree.insert(iota(12, 100), {seq_blocks[0], seq_blocks[1], full});
  pool.release(full);
  EXPECT_EQ(tree.cached_blocks(), 3u);
  EXPECT_EQ(pool.refs(longer[2]), 0);
  EXPECT_EQ(tree.evict(10), 3u);
  EXPECT_EQ(pool.n_free(), pool.n_blocks());
}

}  // namespace
}  // namespace promptly
