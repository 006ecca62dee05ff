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

}  // namespace
}  // namespace promptly
