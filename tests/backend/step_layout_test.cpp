// What the host sends the GPU before each step (backend/cuda/step_layout.h), checked without a GPU.
#include "backend/cuda/step_layout.h"

#include <gtest/gtest.h>

#include "kv/kv_cache.h"
#include "model/batch.h"

namespace promptly::backend::cuda {
namespace {

TEST(StepLayout, PacksEachSequencesBlockTableOnceAndTheRowsThatWantLogits) {
  KvCache cache = KvCache::with_blocks(2, 64, 32, 256, KvType::F16, 16);
  cache.reserve(7, 40);  // 3 blocks
  cache.reserve(3, 10);  // 1 block
  Batch batch;
  batch.add(11, 37, 7, false);
  batch.add(12, 9, 3, true);
  batch.add(13, 38, 7, true);
  std::vector<std::int32_t> packed;
  const StepLayout layout = pack_step(batch, cache, packed, 16);
  ASSERT_EQ(layout.T, 3);
  EXPECT_EQ(layout.n_out, 2);
  ASSERT_EQ(packed.size(), 11u * 3 + 3 + 1);
  const auto at = [&](int offset, int n) { return std::vector<std::int32_t>(packed.begin() + offset, packed.begin() + offset + n); };
  EXPECT_EQ(at(layout.tokens(), 3), (std::vector<std::int32_t>{11, 12, 13}));
  EXPECT_EQ(at(layout.positions(), 3), (std::vector<std::int32_t>{37, 9, 38}));
  EXPECT_EQ(at(layout.slots(), 3), (std::vector<std::int32_t>{37, 9, 38}));
  EXPECT_EQ(at(layout.out_rows(), 2), (std::vector<std::int32_t>{1, 2}));
  // Sequence 7's table first (it appears first), then 3's; both of 7's tokens point at the same one.
  EXPECT_EQ(at(layout.table_starts(), 3), (std::vector<std::int32_t>{0, 3, 0}));
  std::vector<std::int32_t> tables(cache.blocks(7).begin(), cache.blocks(7).end());
  tables.insert(tables.end(), cache.blocks(3).begin(), cache.blocks(3).end());
  EXPECT_EQ(at(layout.tables(), 4), tables);
  // No run of one sequence long enough for an attention tile: every token on its own.
  EXPECT_EQ(layout.n_tiles, 0);
  EXPECT_EQ(layout.n_lone, 3);
  EXPECT_EQ(at(layout.lone(), 3), (std::vector<std::int32_t>{0, 1, 2}));
}

// Attention tiles: runs of consecutive tokens of one sequence and one tree context, of at least
// kAttentionTileMinTokens, cut into as few tiles of at most the tile size (16 for heads up to
// 128) as can be, of even sizes; the tokens of shorter runs listed on their own.
TEST(StepLayout, TilesRunsOfOneSequenceAndTreeContext) {
  KvCache cache = KvCache::with_blocks(2, 64, 32, 1024, KvType::F16, 16);
  cache.reserve(1, 100);
  cache.reserve(2, 100);
  cache.reserve(3, 100);
  Batch batch;
  for (int i = 0; i < 37; ++i) batch.add(1, i, 1, false);  // a prompt: 13 + 12 + 12
  batch.add(2, 50, 2, true);                                // another sequence's decode step
  batch.add_tree_node(3, 2, 51, 0, 1, 0b1, true);           // then its tree of two nodes
  batch.add_tree_node(4, 2, 51, 1, 1, 0b10, true);
  batch.add(5, 37, 1, true);                                // the prompt's sequence again
  for (int i = 0; i < 25; ++i) batch.add(6, i, 3, false);  // a third sequence's prompt: 13 + 12
  std::vector<std::int32_t> packed;
  const StepLayout layout = pack_step(batch, cache, packed, 16);
  EXPECT_EQ(layout.tables(), 11 * layout.T);
  const auto at = [&](int offset, int n) { return std::vector<std::int32_t>(packed.begin() + offset, packed.begin() + offset + n); };
  ASSERT_EQ(layout.n_tiles, 5);
  EXPECT_EQ(at(layout.tiles(), 10), (std::vector<std::int32_t>{0, 13, 13, 12, 25, 12, 41, 13, 54, 12}));
  ASSERT_EQ(layout.n_lone, 4);
  EXPECT_EQ(at(layout.lone(), 4), (std::vector<std::int32_t>{37, 38, 39, 40}));
  Batch short_run;
  for (int i = 0; i < kAttentionTileMinTokens; ++i) short_run.add(1, i, 1, false);
  EXPECT_EQ(pack_step(short_run, cache, packed, 16).n_tiles, 1);
  short_run.clear();
  for (int i = 1; i < kAttentionTileMinTokens; ++i) short_run.add(1, i, 1, false);
  EXPECT_EQ(pack_step(short_run, cache, packed, 16).n_lone, kAttentionTileMinTokens - 1);
  // Heads of 256 (Gemma 2's) take tiles of 8: the prompts as 8 + 8 + 7 + 7 + 7 and 7 + 6 + 6 + 6.
  ASSERT_EQ(attention_tile_tokens(256), 8);
  const StepLayout eights = pack_step(batch, cache, packed, attention_tile_tokens(256));
  ASSERT_EQ(eights.n_tiles, 9);
  EXPECT_EQ(at(eights.tiles(), 18), (std::vector<std::int32_t>{0, 8, 8, 8, 16, 7, 23, 7, 30, 7, 41, 7, 48, 6, 54, 6, 60, 6}));
  EXPECT_EQ(eights.n_lone, 4);
  // No tiles (heads too large, or tiles switched off): every token on its own.
  const StepLayout none = pack_step(batch, cache, packed, 0);
  EXPECT_EQ(none.n_tiles, 0);
  EXPECT_EQ(none.n_lone, none.T);
}

TEST(StepLayout, TileSizesFitTheirHeads) {
  EXPECT_EQ(attention_tile_tokens(64), 16);
  EXPECT_EQ(attention_tile_tokens(80), 16);
  EXPECT_EQ(attention_tile_tokens(128), 16);
  EXPECT_EQ(attention_tile_tokens(192), 8);
  EXPECT_EQ(attention_tile_tokens(256), 8);
  EXPECT_EQ(attention_tile_tokens(258), 0);  // not of whole 8-byte pieces
  EXPECT_EQ(attention_tile_tokens(260), 0);  // larger than the tiles take
  EXPECT_EQ(attention_tile_tokens(0), 0);
  for (const int hd : {64, 128, 256}) EXPECT_GE(attention_tile_tokens(hd), kAttentionTileMinTokens) << hd;
}

// Token trees: each node's tree context and 64-bit ancestor mask (halves, low first); ordinary
// tokens -1 and none. A node's attention scans its context and the tree's slots to its last ancestor.
TEST(StepLayout, PacksTreeNodesContextsAndAncestors) {
  KvCache cache = KvCache::with_blocks(2, 64, 32, 256, KvType::F16, 16);
  cache.reserve(0, 100);
  Batch batch;
  batch.add(5, 29, 0, true);
  batch.add_tree_node(6, 0, 30, 0, 1, 0b1, true);
  const std::uint64_t deep = (std::uint64_t{1} << 40) | (std::uint64_t{1} << 33) | 0b1;
  batch.add_tree_node(7, 0, 30, 40, 3, deep, true);
  std::vector<std::int32_t> packed;
  const StepLayout layout = pack_step(batch, cache, packed, 16);
  const auto at = [&](int offset, int n) { return std::vector<std::int32_t>(packed.begin() + offset, packed.begin() + offset + n); };
  EXPECT_EQ(at(layout.tree_contexts(), 3), (std::vector<std::int32_t>{-1, 30, 30}));
  EXPECT_EQ(at(layout.tree_ancestors(), 6), (std::vector<std::int32_t>{0, 0, 1, 0, 1, (1 << 1) | (1 << 8)}));
  EXPECT_EQ(at(layout.slots(), 3), (std::vector<std::int32_t>{29, 30, 70}));
  EXPECT_EQ(at(layout.positions(), 3), (std::vector<std::int32_t>{29, 30, 32}));
  EXPECT_EQ(attention_span(batch), 30 + 41);
  Batch plain;
  plain.add(5, 29, 0, true);
  EXPECT_EQ(attention_span(plain), 30);
}

TEST(StepLayout, AttentionChunksArePowersOfTwoThatCoverTheContext) {
  for (const int T : {1, 3, 8, 64, 512}) {
    for (const int longest : {1, 63, 64, 65, 1000, 4096, 32768, 131072}) {
      const AttentionShape s = attention_shape(T, 32, longest, 132, 256);
      EXPECT_GE(s.chunk, 64);
      EXPECT_EQ(s.chunk & (s.chunk - 1), 0) << s.chunk;
      EXPECT_GE(static_cast<long>(s.chunk) * s.n_splits, longest) << "T " << T << " longest " << longest;
      EXPECT_GE(s.n_splits, 1);
      EXPECT_LE(s.n_splits, 256);
    }
  }
  // A lone decoding token spreads over the GPU; a prompt's many queries need no split.
  EXPECT_EQ(attention_shape(1, 32, 8192, 132, 256).n_splits, 16);
  EXPECT_EQ(attention_shape(512, 32, 512, 132, 256).n_splits, 1);
}

}  // namespace
}  // namespace promptly::backend::cuda
