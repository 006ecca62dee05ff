#pragma once
// The KV spool: the prefix cache's second tier, on disk. Every full block of a cached prefix is
// written behind the engine's back (a writer thread with a bounded queue of copies: a full queue
// skips the write, it never blocks a step), so the spool holds the prefix cache even after a
// crash, and evicting a block from RAM costs nothing. A later request whose prompt reaches spooled
// blocks has them read back (a reader thread, straight into KV pool blocks) while it waits in the
// queue, and then proceeds as a RAM hit (engine/scheduler.cpp).
//
// Identity: a block is named by its chain hash, the hash of every token from position 0 through
// its last (chain_hash below), so a hit needs no tree on disk: the prompt's chain hashes are looked
// up one after another. The second tier is this flat index of chains, which is the prefix tree's
// paths hashed; a block's header repeats its own tokens, compared on every read, so a hash
// collision cannot serve another prefix's rows.
//
// On disk (docs/kv-spool.md has the full layout): one file per block, DIR/<settings>-<chain>.kvb,
// written to a temporary name and renamed into place, so a reader sees whole files or none. The
// header names the model fingerprint, the KV type and geometry, the block's position and tokens,
// its parent's chain hash, and checksums of itself and of the data. On start the directory is
// scanned (headers only): temporary files (torn writes) and files that fail the header checks
// (truncated, bad header checksum, unknown format) are deleted and counted; files of another model
// or other KV settings are counted and left alone (another server may own them). The data's
// checksum is checked on every read: a mismatch deletes the file and the request recomputes.
// The size cap evicts least-recently-used blocks, leaves of the chains first (a block last used
// when a request read or wrote it; the file's mtime carries that across restarts).
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <span>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "kv/block_pool.h"
#include "kv/block_transfer.h"

namespace promptly {

class KvCache;

using ChainHash = std::uint64_t;
// The chain hash of a block holding `tokens` after the prefix whose chain hash is `parent` (0 for
// the first block).
ChainHash chain_hash(ChainHash parent, std::span<const std::int32_t> tokens);
// Extends `chain` (the chain hashes of the first chain.size() blocks of `tokens`) to n_blocks
// blocks of block_tokens each, or as many whole blocks as `tokens` holds.
void extend_chain(std::vector<ChainHash>& chain, std::span<const std::int32_t> tokens, std::size_t block_tokens, std::size_t n_blocks);

// What a block's bytes depend on besides its tokens. Blocks written under other settings are
// never used.
struct SpoolSettings {
  std::uint64_t model_fingerprint = 0;
  KvType kv_type = KvType::F16;
  std::uint32_t block_tokens = 0, n_layers = 0, kv_dim = 0, segment_dim = 0;
  std::uint64_t block_bytes = 0;
  static SpoolSettings of(std::uint64_t model_fingerprint, const BlockPool& pool, std::size_t n_layers);
  std::uint64_t id() const;  // a hash of all of the above: the file names' first part
};

struct SpoolOptions {
  std::string dir;
  std::uint64_t max_bytes = std::uint64_t{4} << 30;
  // Copies waiting for the writer, at most (a full queue skips writes).
  std::uint64_t write_queue_bytes = std::uint64_t{64} << 20;
};

// Why a spooled block was not used (Prometheus label values of kv_spool_rejected_total).
enum class SpoolReject { Torn, Truncated, Header, Checksum, Model, Settings, Io, kCount };
const char* spool_reject_name(SpoolReject r);

struct SpoolStats {
  bool enabled = false;
  std::uint64_t blocks = 0, bytes = 0;
  std::uint64_t written = 0, write_dropped = 0, evicted = 0;
  std::uint64_t read_blocks = 0;  // blocks read back and verified (hits)
  std::uint64_t rejected[static_cast<std::size_t>(SpoolReject::kCount)] = {};
  std::uint64_t write_queue_bytes = 0;
};

class KvSpool {
 public:
  // Scans `options.dir` (creating it if needed). Never throws for the directory's state: an
  // unusable directory leaves the spool disabled with one warning line on stderr.
  KvSpool(SpoolOptions options, SpoolSettings settings);
  ~KvSpool();  // stops the threads; writes still queued are lost (call flush first to keep them)
  KvSpool(const KvSpool&) = delete;
  KvSpool& operator=(const KvSpool&) = delete;

  bool enabled() const;
  const SpoolSettings& settings() const { return settings_; }
  const SpoolOptions& options() const { return options_; }

  // Whether the block is on disk or queued for writing.
  bool contains(ChainHash hash) const;
  // How many of `chain`, from index `first` on, are on disk one after another.
  std::size_t present_run(std::span<const ChainHash> chain, std::size_t first) const;

  // Queues a copy of a full block's data (settings().block_bytes bytes) for writing. `tokens` are
  // the block's own, `position` its first. False (counted as dropped) when the queue is full or the
  // spool is disabled; true also when the block is already spooled (nothing to do).
  // `wait_for_room`: wait for the writer instead of dropping (promptly run, which has no step to stall).
  // `parts`: the block's bytes as the runs of memory they lie in, in order (BlockPool::block_parts),
  // or one pointer to all of them.
  bool write(ChainHash hash, ChainHash parent, std::uint64_t position, std::span<const std::int32_t> tokens,
             const std::vector<std::span<const std::uint8_t>>& parts, bool wait_for_room = false);
  bool write(ChainHash hash, ChainHash parent, std::uint64_t position, std::span<const std::int32_t> tokens, const std::uint8_t* data,
             bool wait_for_room = false) {
    return write(hash, parent, position, tokens, {std::span<const std::uint8_t>(data, settings_.block_bytes)}, wait_for_room);
  }
  // The same for bytes still on their way to host memory (a device's block): the writer waits for
  // them, and drops the write if they never come.
  bool write(ChainHash hash, ChainHash parent, std::uint64_t position, std::span<const std::int32_t> tokens,
             std::shared_ptr<PendingBlock> pending, bool wait_for_room = false);
  // Counts a write skipped before it reached the queue (a device with no room to stage the copy).
  void count_dropped_write();

  // A read in flight: `done` turns true once `ok` is final.
  struct Read {
    std::atomic<bool> done{false};
    bool ok = false;
    double seconds = 0;  // from queued to done
  };
  // Reads the block into `dst` (block_bytes bytes in all, in order, which must stay valid and
  // untouched until the read is done; a run with a null pointer is skipped) on the reader thread. The header must name `tokens` at
  // `position`; any mismatch, checksum failure or I/O error ends it with ok = false (the file is
  // deleted when it is bad).
  std::shared_ptr<const Read> read(ChainHash hash, std::uint64_t position, std::span<const std::int32_t> tokens,
                                   std::vector<std::span<std::uint8_t>> dst);
  std::shared_ptr<const Read> read(ChainHash hash, std::uint64_t position, std::span<const std::int32_t> tokens, std::uint8_t* dst) {
    return read(hash, position, tokens, {std::span<std::uint8_t>(dst, settings_.block_bytes)});
  }
  // The same into a sink (a device's block): it gets the bytes once they are verified.
  std::shared_ptr<const Read> read(ChainHash hash, std::uint64_t position, std::span<const std::int32_t> tokens, BlockSink sink);
  // Called on the reader thread after each read completes (the engine wakes its loop with it).
  void set_on_read_done(std::function<void()> f);

  // Waits until every queued write is on disk, or until `deadline`; true when all were written.
  bool flush(std::chrono::steady_clock::time_point deadline);

  SpoolStats stats() const;

 private:
  struct Entry {
    ChainHash parent = 0;
    std::uint64_t bytes = 0;
    std::uint64_t last_used = 0;  // nanoseconds since the epoch (the file's mtime)
  };
  struct WriteJob {
    ChainHash hash = 0, parent = 0;
    std::uint64_t position = 0;
    std::vector<std::int32_t> tokens;
    std::vector<std::uint8_t> data;
    std::shared_ptr<PendingBlock> pending;  // instead of data: bytes still on their way
  };
  struct ReadJob {
    ChainHash hash = 0;
    std::uint64_t position = 0;
    std::vector<std::int32_t> tokens;
    std::vector<std::span<std::uint8_t>> dst;
    BlockSink sink;  // instead of dst
    std::shared_ptr<Read> result;
    std::chrono::steady_clock::time_point queued;
  };

  void scan();
  void writer_loop();
  void reader_loop();
  // False on an I/O error (the spool is then disabled).
  bool write_file(const WriteJob& job, std::span<const std::uint8_t> data);
  // Queues a job whose bytes are (or will be) in it; the caller holds `lock`.
  bool enqueue(WriteJob job, std::unique_lock<std::mutex>& lock);
  // Waits for room in the queue if asked; whether a write of `hash` may go ahead (false counts a drop).
  enum class Admit { Queue, AlreadyThere, No };
  Admit admit(ChainHash hash, bool wait_for_room, std::unique_lock<std::mutex>& lock);
  std::shared_ptr<const Read> queue_read(ReadJob job);
  bool read_file(const ReadJob& job);
  void disable(const std::string& why);
  std::string path_of(ChainHash hash) const;
  // Index updates; the caller holds mutex_.
  void add_entry(ChainHash hash, ChainHash parent, std::uint64_t bytes, std::uint64_t last_used);
  void remove_entry(ChainHash hash);
  void touch(ChainHash hash, std::uint64_t now);
  bool is_leaf(ChainHash hash) const;
  // Deletes least-recently-used leaves until the spool fits its cap (holds mutex_; unlinks files).
  void evict_over_cap();
  void reject(SpoolReject why);

  SpoolOptions options_;
  SpoolSettings settings_;
  std::string name_prefix_;  // the settings id in hex, then '-'

  mutable std::mutex mutex_;
  bool enabled_ = false;
  std::unordered_map<ChainHash, Entry> index_;
  // Spooled blocks per parent hash (whether or not the parent is spooled itself), and (last_used,
  // hash) of the entries no spooled block continues: the eviction order.
  std::unordered_map<ChainHash, std::uint32_t> children_of_;
  std::set<std::pair<std::uint64_t, ChainHash>> leaves_;
  std::uint64_t bytes_ = 0;
  std::unordered_map<ChainHash, bool> queued_;  // hashes in the write queue
  std::deque<WriteJob> writes_;
  std::uint64_t queued_bytes_ = 0;
  bool writing_ = false;  // the writer holds a job outside the queue
  std::vector<std::vector<std::uint8_t>> spare_buffers_;  // recycled copies, so writes do not page-fault fresh memory
  std::vector<std::uint8_t> read_buffer_;  // the reader thread's, for blocks read in several runs
  std::deque<ReadJob> reads_;
  std::function<void()> on_read_done_;
  SpoolStats counters_;
  bool stopping_ = false;
  std::condition_variable work_, written_;
  std::thread writer_, reader_;
};

// A cache's block to and from the spool, wherever the cache keeps its bytes: its host pool, or a
// device (KvCache::DeviceState). spool_block skips a block already spooled (true) or whose
// sliding-window layers' KV is gone (false); otherwise as KvSpool::write. read_spooled_block: as KvSpool::read, into `block`
// (`skip_missing`: see BlockPool::block_parts).
bool spool_block(KvSpool& spool, const KvCache& cache, int block, ChainHash hash, ChainHash parent, std::uint64_t position,
                 std::span<const std::int32_t> tokens, bool wait_for_room = false);
std::shared_ptr<const KvSpool::Read> read_spooled_block(KvSpool& spool, KvCache& cache, int block, ChainHash hash, std::uint64_t position,
                                                        std::span<const std::int32_t> tokens, bool skip_missing = false);

}  // namespace promptly
