#include "kv/kv_cache.h"

#include <gtest/gtest.h>

#include <cmath>

#include "util/error.h"

namespace promptly {
namespace {

TEST(BlockPool, AllocatesRefCountsAndFrees) {
  BlockPool pool(2, 8, 4, 3);
  EXPECT_EQ(pool.n_free(), 3u);
  const int a = pool.allocate(), b = pool.allocate(), c = pool.allocate();
  EXPECT_EQ(pool.allocate(), -1);  // exhausted
  EXPECT_NE(a, b);
  pool.retain(b);
  EXPECT_EQ(pool.refs(b), 2);
  pool.release(b);
  EXPECT_EQ(pool.n_free(), 0u);
  pool.release(b);
  EXPECT_EQ(pool.n_free(), 1u);
  EXPECT_EQ(pool.allocate(), b);  // the most recently freed block comes back first
  pool.release(c);
  EXPECT_THROW(pool.retain(c), Error);  // a freed block cannot be retained or released again
  EXPECT_THROW(pool.release(c), Error);
  // Keys and values of different blocks and layers never overlap.
  EXPECT_EQ(pool.values(a, 0), pool.keys(a, 0) + 4 * 8 * 2);  // F16 by default
  EXPECT_EQ(pool.keys(a, 1), pool.values(a, 0) + 4 * 8 * 2);
  EXPECT_EQ(BlockPool::block_bytes(2, 8, 4, KvType::F32), 2u * 2 * 4 * 8 * sizeof(float));
  EXPECT_EQ(BlockPool::block_bytes(2, 8, 4, KvType::F16), 2u * 2 * 4 * 8 * 2);
}

TEST(KvCache, PositionsAcrossBlockBoundariesAndErase) {
  for (KvType type : {KvType::F32, KvType::F16}) {
    KvCache cache(2, 4, 10, 2, type, 3);  // blocks of 3 positions, room for 2 sequences of 10
    EXPECT_EQ(cache.pool().n_blocks(), 8u);
    cache.reserve(7, 7);
    for (std::size_t pos = 0; pos < 7; ++pos)
      for (std::size_t l = 0; l < 2; ++l) {
        const float k[4] = {static_cast<float>(100 * l + pos), 0.5f, 0.25f, 1.0f / 3.0f};
        const float v[4] = {1, 2, 3, -static_cast<float>(100 * l + pos)};
        cache.write(l, 7, pos, k, v);
      }
    float k[4], v[4];
    cache.read(1, 7, 6, k, v);  // position 6 lives in block 2, slot 0
    EXPECT_EQ(k[0], 106.0f);
    EXPECT_EQ(v[3], -106.0f);
    EXPECT_NEAR(k[3], 1.0f / 3.0f, type == KvType::F16 ? 2e-4 : 0.0) << kv_type_name(type);
    std::vector<const void*> keys, values;
    cache.block_pointers(1, 7, keys, values);
    ASSERT_EQ(keys.size(), 3u);
    EXPECT_EQ(cache.pool().n_free(), 5u);
    EXPECT_THROW(cache.reserve(7, 11), Error);  // past the per-sequence context
    cache.reserve(8, 10);
    EXPECT_EQ(cache.pool().n_free(), 1u);
    try {
      cache.reserve(9, 10);
      FAIL();
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("KV cache is full"), std::string::npos);
    }
    cache.erase(7);
    cache.erase(8);
    cache.erase(9);  // the partial reservation of 9 is returned too
    EXPECT_EQ(cache.pool().n_free(), cache.pool().n_blocks());
  }
  EXPECT_EQ(parse_kv_type("f16"), KvType::F16);
  EXPECT_EQ(parse_kv_type("q8_0"), KvType::Q8_0);
  EXPECT_THROW(parse_kv_type("q3"), Error);
}

// Q8_0 rows: 34 bytes per 32 values, so a budget holds 64/34 = 1.88x the tokens of F16; values
// come back within about half a quantization step.
TEST(KvCache, Q8_0RowsHoldAlmostTwiceTheTokensOfF16) {
  const std::size_t kv_dim = 64, layers = 3;
  EXPECT_EQ(kv_row_bytes(kv_dim, KvType::Q8_0), 2 * 34u);
  const double ratio = static_cast<double>(BlockPool::block_bytes(layers, kv_dim, 16, KvType::F16)) /
                       static_cast<double>(BlockPool::block_bytes(layers, kv_dim, 16, KvType::Q8_0));
  EXPECT_GE(ratio, 1.8);
  EXPECT_THROW(kv_row_bytes(40, KvType::Q8_0), Error);  // not whole blocks: the error says to use f16
  KvCache cache(layers, kv_dim, 20, 1, KvType::Q8_0, 8);
  cache.reserve(0, 20);
  std::vector<float> k(kv_dim), v(kv_dim), k2(kv_dim), v2(kv_dim);
  for (std::size_t pos = 0; pos < 20; ++pos) {
    for (std::size_t i = 0; i < kv_dim; ++i) {
      k[i] = std::sin(static_cast<float>(pos * 7 + i));
      v[i] = std::cos(static_cast<float>(pos + 3 * i)) * 5;
    }
    cache.write(2, 0, pos, k.data(), v.data());
    cache.read(2, 0, pos, k2.data(), v2.data());
    for (std::size_t i = 0; i < kv_dim; ++i) {
      EXPECT_NEAR(k2[i], k[i], 0.6 / 127);  // half a step, plus the F16 rounding of the scale
      EXPECT_NEAR(v2[i], v[i], 5 * 0.6 / 127);
    }
  }
}

// With a head dimension the rows are stored head by head: a head's rows are one contiguous run in the
// block, which rows_of locates, write/read and copy_rows see the same positions as before.
TEST(BlockPool, HeadMajorLayout) {
  BlockPool pool(2, 8, 4, 3, KvType::F32, 4);  // 2 heads of 4, blocks of 4 positions
  EXPECT_EQ(pool.segment_dim(), 4u);
  const int a = pool.allocate(), b = pool.allocate();
  for (std::size_t layer = 0; layer < 2; ++layer) {
    for (std::size_t slot = 0; slot < 4; ++slot) {
      float k[8], v[8];
      for (std::size_t e = 0; e < 8; ++e) {
        k[e] = static_cast<float>(1000 * layer + 10 * slot + e);
        v[e] = -k[e];
      }
      pool.store(k, pool.keys(a, layer), slot);
      pool.store(v, pool.values(a, layer), slot);
    }
  }
  // Head 1 (elements 4..7): positions 0..3 one after another, from element 16 of the layer's keys.
  const BlockPool::Rows head1 = pool.rows_of(4);
  EXPECT_EQ(head1.offset, 16u);
  EXPECT_EQ(head1.stride, 4u);
  const auto* keys1 = reinterpret_cast<const float*>(pool.keys(a, 1));
  for (std::size_t slot = 0; slot < 4; ++slot) {
    for (std::size_t d = 0; d < 4; ++d) EXPECT_EQ(keys1[head1.offset + slot * head1.stride + d], 1000.0f + 10 * slot + 4 + d);
  }
  EXPECT_EQ(pool.rows_of(2).offset, 2u);  // inside head 0
  // copy_rows: the first 3 positions of every head and layer, not the 4th.
  float zero[8] = {};
  for (std::size_t layer = 0; layer < 2; ++layer) pool.store(zero, pool.keys(b, layer), 3);
  pool.copy_rows(a, b, 3);
  for (std::size_t layer = 0; layer < 2; ++layer) {
    float k[8], v[8];
    for (std::size_t slot = 0; slot < 4; ++slot) {
      pool.load(pool.keys(b, layer), slot, k);
      pool.load(pool.values(b, layer), slot, v);
      for (std::size_t e = 0; e < 8; ++e) {
        const float want = slot < 3 ? static_cast<float>(1000 * layer + 10 * slot + e) : 0.0f;
        EXPECT_EQ(k[e], want) << "layer " << layer << " slot " << slot << " element " << e;
        if (slot < 3) {
          EXPECT_EQ(v[e], -want);
        }
      }
    }
  }
  // Whole rows where the head does not fit Q8_0's 32-value blocks, or does not divide the row.
  EXPECT_EQ(BlockPool(1, 64, 4, 1, KvType::Q8_0, 16).segment_dim(), 64u);
  EXPECT_EQ(BlockPool(1, 64, 4, 1, KvType::Q8_0, 32).segment_dim(), 32u);
  EXPECT_EQ(BlockPool(1, 64, 4, 1, KvType::F16, 24).segment_dim(), 64u);
  EXPECT_EQ(BlockPool(1, 64, 4, 1, KvType::F16).segment_dim(), 64u);
  // Same bytes either way.
  EXPECT_EQ(BlockPool(1, 64, 4, 1, KvType::Q8_0, 32).row_bytes(), kv_row_bytes(64, KvType::Q8_0));
}

TEST(KvCache, HeadMajorRowsRoundTripInEveryType) {
  for (KvType type : {KvType::F32, KvType::F16, KvType::Q8_0}) {
    KvCache cache(2, 128, 40, 1, type, 16, 64);
    EXPECT_EQ(cache.pool().segment_dim(), 64u);
    cache.reserve(0, 40);
    std::vector<float> k(128), v(128), k2(128), v2(128);
    for (std::size_t pos = 0; pos < 40; ++pos) {
      for (std::size_t i = 0; i < 128; ++i) {
        k[i] = std::sin(static_cast<float>(pos * 5 + i));
        v[i] = std::cos(static_cast<float>(pos + 2 * i));
      }
      cache.write(1, 0, pos, k.data(), v.data());
      cache.read(1, 0, pos, k2.data(), v2.data());
      const double tol = type == KvType::F32 ? 0.0 : type == KvType::F16 ? 1e-3 : 0.6 / 127;
      for (std::size_t i = 0; i < 128; ++i) {
        ASSERT_NEAR(k2[i], k[i], tol) << kv_type_name(type) << " pos " << pos << " i " << i;
        ASSERT_NEAR(v2[i], v[i], tol) << kv_type_name(type) << " pos " << pos << " i " << i;
      }
    }
  }
}

// Sliding-window release: the local layers (0 and 2 here) keep their KV apart and give it up for
// the blocks every later query's window has left; the global layer keeps everything. A given-up
// segment stays with its block until another block takes it (most recently given up first); a
// block another holder reads whole keeps its segment; the prefix tree's kind of reference does not.
TEST(KvCache, SlidingWindowRelease) {
  constexpr std::size_t kDim = 8, kBlock = 4, kWindow = 6;
  KvCache cache(3, kDim, 64, 1, KvType::F32, kBlock, 0, LocalLayers{{true, false, true}, kWindow});
  EXPECT_EQ(cache.window(), kWindow);
  const std::size_t layer_bytes = 2 * kBlock * kv_row_bytes(kDim, KvType::F32);
  const auto row = [](std::size_t layer, std::size_t pos, std::size_t i) { return static_cast<float>(100 * layer + pos) + 0.125f * static_cast<float>(i); };
  std::vector<float> k(kDim), v(kDim);
  cache.reserve(0, 40);
  for (std::size_t pos = 0; pos < 40; ++pos) {
    for (std::size_t layer = 0; layer < 3; ++layer) {
      for (std::size_t i = 0; i < kDim; ++i) k[i] = row(layer, pos, i), v[i] = -row(layer, pos, i);
      cache.write(layer, 0, pos, k.data(), v.data());
    }
  }
  cache.set_length(0, 40);
  EXPECT_EQ(cache.pool().bytes_in_use(), 10 * 3 * layer_bytes);
  // The query at 40 sees (34, 40]: blocks 0..7 (positions 0..31) are behind it, block 8 is not.
  EXPECT_EQ(cache.release_behind_window(0), 8u);
  EXPECT_EQ(cache.release_behind_window(0), 0u);
  EXPECT_EQ(cache.pool().bytes_in_use(), (10 * 1 + 2 * 2) * layer_bytes);
  // Given up, not yet taken: still readable (and spoolable).
  for (int b : cache.blocks(0)) EXPECT_TRUE(cache.pool().has_local(b));
  cache.read(0, 0, 31, k.data(), v.data());
  EXPECT_EQ(k[2], row(0, 31, 2));
  // Three new blocks take the segments given up longest ago: blocks 0, 1, 2.
  cache.reserve(0, 52);
  const std::vector<int> blocks = cache.blocks(0);
  for (std::size_t b = 0; b < 13; ++b) EXPECT_EQ(cache.pool().has_local(blocks[b]), b >= 3) << b;
  std::vector<const void*> keys, values;
  cache.block_pointers(0, 0, keys, values);
  for (std::size_t b = 0; b < 13; ++b) EXPECT_EQ(keys[b] == nullptr, b < 3) << b;
  cache.block_pointers(1, 0, keys, values);
  for (const void* p : keys) EXPECT_NE(p, nullptr);
  cache.read(1, 0, 20, k.data(), v.data());  // the global layer still has position 20
  EXPECT_EQ(k[3], row(1, 20, 3));
  EXPECT_EQ(v[3], -row(1, 20, 3));
  cache.read(2, 0, 35, k.data(), v.data());
  EXPECT_EQ(k[5], row(2, 35, 5));
  EXPECT_THROW(cache.read(0, 0, 5, k.data(), v.data()), Error);
  EXPECT_THROW(cache.pool().block_parts(blocks[1]), Error);  // its local layers' KV is gone
  EXPECT_EQ(cache.pool().block_parts(blocks[9]).size(), 3u);  // layers 0, 1, 2 lie apart
  EXPECT_THROW(cache.set_length(0, 20), Error);  // a query at 20 would need released KV

  // A holder reading block 8 whole keeps its segment when the sequence moves on; one holding it
  // as the prefix tree does (Cached) does not.
  const int shared = blocks[8], cached = blocks[9];
  cache.pool().retain(shared);
  cache.pool().retain(cached, BlockPool::Hold::Cached);
  cache.set_length(0, 48);
  EXPECT_EQ(cache.release_behind_window(0), 1u);  // (42, 48] is seen next: blocks 8 and 9 left, 9 given up
  EXPECT_EQ(cache.pool().bytes_in_use(), (13 * 1 + 4 * 2) * layer_bytes);
  cache.erase(0);
  EXPECT_EQ(cache.pool().bytes_in_use(), (2 + 2) * layer_bytes);  // both blocks' global layer, block 8's local ones
  EXPECT_TRUE(cache.pool().has_local(cached));  // given up, not taken
  // A Whole holder takes a given-up segment back (as a prefix match does).
  cache.pool().retain(cached);
  EXPECT_EQ(cache.pool().bytes_in_use(), (2 + 2 * 2) * layer_bytes);
  cache.reserve(1, 56);  // every other block: none takes block 9's segment now
  EXPECT_TRUE(cache.pool().has_local(cached));
  for (int b : cache.blocks(1)) EXPECT_TRUE(cache.pool().has_local(b));
  cache.erase(1);
  cache.pool().release(cached);
  cache.pool().release(cached, BlockPool::Hold::Cached);
  cache.pool().release(shared);
  EXPECT_EQ(cache.pool().bytes_in_use(), 0u);
  EXPECT_THROW(cache.pool().release(shared), Error);
  // Every block gets a local segment again.
  cache.reserve(2, 64);
  for (int b : cache.blocks(2)) EXPECT_TRUE(cache.pool().has_local(b));
  EXPECT_EQ(cache.pool().bytes_in_use(), 16 * 3 * layer_bytes);
}

// Fewer local segments than blocks: a block takes one while any is not read whole; past that,
// allocate fails (out_of_segments) while allocate_without_local still gives blocks (for KV behind
// every window), whose spool runs skip the local layers' bytes.
TEST(KvCache, FewerLocalSegmentsThanBlocks) {
  constexpr std::size_t kDim = 8, kBlock = 4;
  BlockPool pool(3, kDim, kBlock, 8, KvType::F32, 0, {true, false, true}, 3);
  EXPECT_EQ(pool.n_local_segments(), 3u);
  const int a = pool.allocate(), b = pool.allocate(), c = pool.allocate();
  ASSERT_GE(c, 0);
  EXPECT_TRUE(pool.out_of_segments());
  EXPECT_EQ(pool.allocate(), -1);
  const int d = pool.allocate_without_local();
  ASSERT_GE(d, 0);
  EXPECT_FALSE(pool.has_local(d));
  const std::size_t layer_bytes = 2 * kBlock * kv_row_bytes(kDim, KvType::F32);
  const auto parts = pool.block_parts(d, /*skip_missing=*/true);
  ASSERT_EQ(parts.size(), 3u);  // layer 0 (none), layer 1, layer 2 (none)
  EXPECT_EQ(parts[0].data(), nullptr);
  EXPECT_NE(parts[1].data(), nullptr);
  EXPECT_EQ(parts[2].data(), nullptr);
  for (const auto& p : parts) EXPECT_EQ(p.size(), layer_bytes);
  EXPECT_THROW(pool.block_parts(d), Error);
  // A holder leaving `b` behind its window gives its segment up: the next block takes it.
  EXPECT_TRUE(pool.unpin_local(b));
  EXPECT_FALSE(pool.out_of_segments());
  const int e = pool.allocate();
  ASSERT_GE(e, 0);
  EXPECT_FALSE(pool.has_local(b));
  EXPECT_TRUE(pool.has_local(e));
  EXPECT_EQ(pool.bytes_in_use(), (5 * 1 + 3 * 2) * layer_bytes);
  for (int x : {a, c, d, e}) pool.release(x);
  pool.release(b, BlockPool::Hold::Cached);
  EXPECT_EQ(pool.bytes_in_use(), 0u);
  EXPECT_EQ(pool.n_free(), 8u);
}

// Without local layers (or without a window) nothing is apart and nothing is released.
TEST(KvCache, NoWindowNoRelease) {
  KvCache cache(2, 8, 32, 1, KvType::F32, 4, 0, LocalLayers{{true, false}, 0});
  cache.reserve(0, 32);
  cache.set_length(0, 32);
  EXPECT_FALSE(cache.pool().has_separate_local_layers());
  EXPECT_EQ(cache.release_behind_window(0), 0u);
  EXPECT_EQ(cache.pool().block_parts(cache.blocks(0)[0]).size(), 1u);  // one run: the whole block
  EXPECT_THROW(BlockPool(2, 8, 4, 4, KvType::F32, 0, {true}), Error);  // one flag per layer
}

}  // namespace
}  // namespace promptly
