// The KV spool on its own: round trips across instances (a restart), every kind of damaged file,
// other models' and settings' files, the size cap's LRU order, an unusable directory.
#include "kv/spool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <random>
#include <thread>

#include "../test_util.h"

namespace promptly {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

constexpr std::size_t kBlockTokens = 4;

SpoolSettings settings(std::uint64_t fingerprint = 42, KvType type = KvType::F16) {
  BlockPool pool(2, 64, kBlockTokens, 1, type, 32);
  return SpoolSettings::of(fingerprint, pool, 2);
}

// A chain of blocks: tokens, chain hashes and data that depends on both.
struct Chain {
  std::vector<std::int32_t> tokens;
  std::vector<ChainHash> hashes;
  std::vector<std::vector<std::uint8_t>> data;
  Chain(std::size_t n_blocks, std::uint32_t seed, std::size_t block_bytes) {
    std::mt19937 rng(seed);
    for (std::size_t i = 0; i < n_blocks * kBlockTokens; ++i) tokens.push_back(static_cast<std::int32_t>(rng() % 1000));
    for (std::size_t b = 0; b < n_blocks; ++b) {
      hashes.push_back(chain_hash(b == 0 ? 0 : hashes.back(), block(b)));
      std::vector<std::uint8_t> d(block_bytes);
      for (auto& x : d) x = static_cast<std::uint8_t>(rng());
      data.push_back(std::move(d));
    }
  }
  std::span<const std::int32_t> block(std::size_t b) const { return std::span<const std::int32_t>(tokens).subspan(b * kBlockTokens, kBlockTokens); }
  void write_to(KvSpool& spool, std::size_t from = 0) const {
    for (std::size_t b = from; b < hashes.size(); ++b) {
      ASSERT_TRUE(spool.write(hashes[b], b == 0 ? 0 : hashes[b - 1], b * kBlockTokens, block(b), data[b].data(), true));
    }
    ASSERT_TRUE(spool.flush(Clock::now() + std::chrono::seconds(30)));
  }
};

// Reads block b into a buffer; returns whether it arrived and matches.
bool read_back(KvSpool& spool, const Chain& c, std::size_t b) {
  std::vector<std::uint8_t> buf(spool.settings().block_bytes, 0);
  auto r = spool.read(c.hashes[b], b * kBlockTokens, c.block(b), buf.data());
  while (!r->done.load()) std::this_thread::sleep_for(std::chrono::microseconds(100));
  return r->ok && buf == c.data[b];
}

std::vector<fs::path> block_files(const std::string& dir) {
  std::vector<fs::path> v;
  for (const auto& e : fs::directory_iterator(dir)) v.push_back(e.path());
  std::sort(v.begin(), v.end());
  return v;
}

fs::path file_of(const std::string& dir, const SpoolSettings& s, ChainHash h) {
  char name[64];
  std::snprintf(name, sizeof name, "%016llx-%016llx.kvb", static_cast<unsigned long long>(s.id()), static_cast<unsigned long long>(h));
  return fs::path(dir) / name;
}

std::uint64_t rejected(const KvSpool& spool, SpoolReject r) { return spool.stats().rejected[static_cast<std::size_t>(r)]; }

TEST(KvSpool, ChainHashesNameWholePrefixes) {
  const std::vector<std::int32_t> a = {1, 2, 3, 4}, b = {1, 2, 3, 5};
  EXPECT_NE(chain_hash(0, a), chain_hash(0, b));
  EXPECT_NE(chain_hash(chain_hash(0, a), a), chain_hash(chain_hash(0, b), a));  // same block after different prefixes
  EXPECT_EQ(chain_hash(7, a), chain_hash(7, a));
}

TEST(KvSpool, BlocksSurviveARestartAndReadBackExactly) {
  test::TempDir tmp;
  const std::string dir = tmp.file("spool");
  const SpoolSettings s = settings();
  const Chain c(5, 1, s.block_bytes);
  {
    KvSpool spool({dir}, s);
    ASSERT_TRUE(spool.enabled());
    c.write_to(spool);
    EXPECT_EQ(spool.stats().written, 5u);
    EXPECT_EQ(spool.present_run(c.hashes, 0), 5u);
  }
  KvSpool spool({dir}, s);  // a new process: the index comes from the scan
  EXPECT_EQ(spool.stats().blocks, 5u);
  EXPECT_EQ(spool.present_run(c.hashes, 0), 5u);
  EXPECT_EQ(spool.present_run(c.hashes, 3), 2u);
  for (std::size_t b = 0; b < 5; ++b) EXPECT_TRUE(read_back(spool, c, b)) << b;
  EXPECT_EQ(spool.stats().read_blocks, 5u);
  // A read that names other tokens than the header's is refused (a hash collision cannot serve
  // another prefix's rows).
  std::vector<std::uint8_t> buf(s.block_bytes);
  const std::vector<std::int32_t> wrong = {9, 9, 9, 9};
  auto r = spool.read(c.hashes[1], kBlockTokens, wrong, buf.data());
  while (!r->done.load()) std::this_thread::sleep_for(std::chrono::microseconds(100));
  EXPECT_FALSE(r->ok);
}

// A device's block (kv/block_transfer.h): bytes still on their way when the write is queued, which
// the writer waits for (the engine's thread never does); bytes that never come skip the write; a
// read goes to a sink once verified, and a sink that cannot store it fails the read but keeps the
// sound file.
class LateBlock final : public PendingBlock {
 public:
  LateBlock(std::vector<std::uint8_t> bytes, std::chrono::milliseconds delay, bool arrives, std::atomic<int>& alive)
      : bytes_(std::move(bytes)), ready_at_(Clock::now() + delay), arrives_(arrives), alive_(alive) {
    ++alive_;
  }
  ~LateBlock() override { --alive_; }
  std::span<const std::uint8_t> wait() override {
    std::this_thread::sleep_until(ready_at_);
    if (!arrives_) return {};
    return bytes_;
  }

 private:
  std::vector<std::uint8_t> bytes_;
  Clock::time_point ready_at_;
  bool arrives_;
  std::atomic<int>& alive_;
};

TEST(KvSpool, DeviceBlocksAreWrittenOnceTheyArriveAndReadIntoASink) {
  test::TempDir tmp;
  const std::string dir = tmp.file("spool");
  const SpoolSettings s = settings();
  const Chain c(3, 7, s.block_bytes);
  std::atomic<int> alive = 0;
  {
    KvSpool spool({dir}, s);
    const auto queued = Clock::now();
    ASSERT_TRUE(spool.write(c.hashes[0], 0, 0, c.block(0), std::make_shared<LateBlock>(c.data[0], std::chrono::milliseconds(1000), true, alive)));
    // Queued, not waited for (a margin of half the block's delay for a loaded sanitizer run).
    EXPECT_LT(Clock::now() - queued, std::chrono::milliseconds(500));
    EXPECT_TRUE(spool.contains(c.hashes[0]));                           // already: no second copy is asked for
    ASSERT_TRUE(spool.write(c.hashes[1], c.hashes[0], kBlockTokens, c.block(1),
                            std::make_shared<LateBlock>(c.data[1], std::chrono::milliseconds(0), false, alive)));
    ASSERT_TRUE(spool.flush(Clock::now() + std::chrono::seconds(30)));
    EXPECT_EQ(spool.stats().written, 1u);
    EXPECT_EQ(spool.stats().write_dropped, 1u);
    EXPECT_FALSE(spool.contains(c.hashes[1]));
    EXPECT_EQ(alive.load(), 0);  // the device's staging memory is given back once written or dropped
    EXPECT_EQ(spool.stats().write_queue_bytes, 0u);
  }
  KvSpool spool({dir}, s);
  EXPECT_EQ(spool.present_run(c.hashes, 0), 1u);
  EXPECT_TRUE(read_back(spool, c, 0));  // the bytes are the block's, as if copied from host memory
  const auto read_into = [&](BlockSink sink) {
    auto r = spool.read(c.hashes[0], 0, c.block(0), std::move(sink));
    while (!r->done.load()) std::this_thread::sleep_for(std::chrono::microseconds(100));
    return r->ok;
  };
  std::vector<std::uint8_t> got;
  EXPECT_TRUE(read_into([&](std::span<const std::uint8_t> bytes) {
    got.assign(bytes.begin(), bytes.end());
    return true;
  }));
  EXPECT_EQ(got, c.data[0]);
  EXPECT_FALSE(read_into([](std::span<const std::uint8_t>) { return false; }));
  EXPECT_EQ(rejected(spool, SpoolReject::Io), 1u);
  EXPECT_EQ(spool.present_run(c.hashes, 0), 1u);  // the file was sound: kept
  EXPECT_TRUE(read_back(spool, c, 0));
}

TEST(KvSpool, DamagedFilesAreDroppedAndCountedNeverUsed) {
  test::TempDir tmp;
  const std::string dir = tmp.file("spool");
  const SpoolSettings s = settings();
  const Chain c(4, 2, s.block_bytes);
  {
    KvSpool spool({dir}, s);
    c.write_to(spool);
  }
  // Block 0: a data byte flipped (found on read); block 1: truncated (found by the scan); block 2:
  // a header byte flipped (scan); a temporary file as a write killed midway leaves it (scan).
  {
    std::fstream f(file_of(dir, s, c.hashes[0]), std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-100, std::ios::end);
    f.put('\x5a' ^ static_cast<char>(c.data[0][c.data[0].size() - 100]));
  }
  fs::resize_file(file_of(dir, s, c.hashes[1]), fs::file_size(file_of(dir, s, c.hashes[1])) - 10);
  {
    std::fstream f(file_of(dir, s, c.hashes[2]), std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(40);
    f.put('\x7f');
  }
  std::ofstream(fs::path(dir) / ".tmp-123-00000000deadbeef") << "partial";
  KvSpool spool({dir}, s);
  EXPECT_EQ(rejected(spool, SpoolReject::Truncated), 1u);
  EXPECT_EQ(rejected(spool, SpoolReject::Header), 1u);
  EXPECT_EQ(rejected(spool, SpoolReject::Torn), 1u);
  EXPECT_FALSE(fs::exists(fs::path(dir) / ".tmp-123-00000000deadbeef"));
  EXPECT_EQ(spool.stats().blocks, 2u);  // blocks 0 (damage not yet seen) and 3
  EXPECT_FALSE(read_back(spool, c, 0));
  EXPECT_EQ(rejected(spool, SpoolReject::Checksum), 1u);
  EXPECT_FALSE(fs::exists(file_of(dir, s, c.hashes[0])));
  EXPECT_EQ(spool.present_run(c.hashes, 0), 0u);
  EXPECT_TRUE(read_back(spool, c, 3));  // intact, though its parents are gone
}

TEST(KvSpool, OtherModelsAndSettingsAreIgnoredAndLeftInPlace) {
  test::TempDir tmp;
  const std::string dir = tmp.file("spool");
  const Chain c(2, 3, settings().block_bytes);
  {
    KvSpool other_model({dir}, settings(43));
    c.write_to(other_model);
  }
  {
    const SpoolSettings q8 = settings(42, KvType::Q8_0);
    KvSpool other_settings({dir}, q8);
    const Chain cq(1, 4, q8.block_bytes);
    cq.write_to(other_settings);
  }
  KvSpool spool({dir}, settings());
  EXPECT_EQ(spool.stats().blocks, 0u);
  EXPECT_EQ(rejected(spool, SpoolReject::Model), 2u);
  EXPECT_EQ(rejected(spool, SpoolReject::Settings), 1u);
  EXPECT_EQ(spool.present_run(c.hashes, 0), 0u);
  EXPECT_EQ(block_files(dir).size(), 3u);  // not ours to delete
}

TEST(KvSpool, TheSizeCapEvictsLeastRecentlyUsedLeavesFirst) {
  test::TempDir tmp;
  const std::string dir = tmp.file("spool");
  const SpoolSettings s = settings();
  const Chain a(3, 5, s.block_bytes), b(3, 6, s.block_bytes);
  const std::uint64_t file_bytes = s.block_bytes + 88 + 4 * kBlockTokens + 8;
  KvSpool spool({dir, 5 * file_bytes}, s);
  // Pauses between the phases: file times (which carry the order across a restart) tick coarsely.
  auto pause = [] { std::this_thread::sleep_for(std::chrono::milliseconds(30)); };
  a.write_to(spool);
  pause();
  b.write_to(spool);
  pause();  // 6 blocks for a cap of 5: a's leaf (its last block) goes, not b's
  EXPECT_EQ(spool.stats().blocks, 5u);
  EXPECT_EQ(spool.stats().evicted, 1u);
  EXPECT_EQ(spool.present_run(a.hashes, 0), 2u);
  EXPECT_EQ(spool.present_run(b.hashes, 0), 3u);
  EXPECT_TRUE(read_back(spool, a, 1));  // a used again: b is now the least recently used
  pause();
  const Chain c(1, 7, s.block_bytes);
  c.write_to(spool);
  EXPECT_EQ(spool.present_run(a.hashes, 0), 2u);
  EXPECT_EQ(spool.present_run(b.hashes, 0), 2u);
  EXPECT_EQ(spool.present_run(c.hashes, 0), 1u);
  // The order survives a restart (files' mtimes), and a cap below what is there evicts at the scan.
  KvSpool smaller({dir, 3 * file_bytes}, s);
  EXPECT_EQ(smaller.stats().blocks, 3u);
  EXPECT_EQ(smaller.present_run(a.hashes, 0), 2u);
  EXPECT_EQ(smaller.present_run(c.hashes, 0), 1u);
}

TEST(KvSpool, AFullQueueDropsWritesInsteadOfWaiting) {
  test::TempDir tmp;
  const SpoolSettings s = settings();
  const Chain c(64, 8, s.block_bytes);
  KvSpool spool({tmp.file("spool"), std::uint64_t{1} << 30, 2 * s.block_bytes}, s);
  std::size_t accepted = 0;
  for (std::size_t b = 0; b < 64; ++b) accepted += spool.write(c.hashes[b], b ? c.hashes[b - 1] : 0, b * kBlockTokens, c.block(b), c.data[b].data());
  ASSERT_TRUE(spool.flush(Clock::now() + std::chrono::seconds(30)));
  const SpoolStats st = spool.stats();
  EXPECT_EQ(st.written, accepted);
  EXPECT_EQ(st.write_dropped, 64 - accepted);
}

TEST(KvSpool, AnUnusableDirectoryDisablesTheSpool) {
  test::TempDir tmp;
  std::ofstream(tmp.file("a-file")) << "x";
  KvSpool spool({tmp.file("a-file") + "/spool"}, settings());  // a directory cannot be made under a file
  EXPECT_FALSE(spool.enabled());
  const Chain c(1, 9, settings().block_bytes);
  EXPECT_FALSE(spool.write(c.hashes[0], 0, 0, c.block(0), c.data[0].data()));
  EXPECT_EQ(spool.present_run(c.hashes, 0), 0u);
  std::vector<std::uint8_t> buf(settings().block_bytes);
  EXPECT_TRUE(spool.read(c.hashes[0], 0, c.block(0), buf.data())->done.load());
}

}  // namespace
}  // namespace promptly
