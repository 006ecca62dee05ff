#pragma once
// Per-sequence views of the paged KV store: each sequence has a block table (block ids in position
// order) into a BlockPool. The model writes K/V rows by position and attention reads them block by
// block. (Prefix sharing and eviction build on the pool's reference counts: issue "KV cache and
// scheduler".)
#include <cstddef>
#include <cstdint>
#include <memory>
#include <unordered_map>
#include <vector>

#include "kv/block_pool.h"
#include "kv/block_transfer.h"

namespace promptly {

// Sliding-window layers whose KV a cache gives back once every later query's window has left it
// behind (see KvCache::release_behind_window): one flag per layer and their window.
struct LocalLayers {
  std::vector<bool> is_local;  // empty: none
  std::size_t window = 0;
};

class KvCache {
 public:
  static constexpr std::size_t kDefaultBlockTokens = 16;

  // Room for max_sequences sequences of up to max_positions positions each. head_dim: the blocks'
  // rows are stored head by head (see BlockPool); 0 keeps whole rows together. `local`: layers
  // whose KV lives apart and is released behind their window.
  KvCache(std::size_t n_layers, std::size_t kv_dim, std::size_t max_positions, std::size_t max_sequences = 1,
          KvType type = KvType::F16, std::size_t block_tokens = kDefaultBlockTokens, std::size_t head_dim = 0,
          const LocalLayers& local = {});

  // A pool of exactly n_blocks blocks shared by any number of sequences (the engine's budgeted
  // cache); with `local` layers apart, n_local_segments of their segments (0: one per block).
  static KvCache with_blocks(std::size_t n_layers, std::size_t kv_dim, std::size_t n_blocks, std::size_t max_positions, KvType type,
                             std::size_t block_tokens = kDefaultBlockTokens, std::size_t head_dim = 0, const LocalLayers& local = {},
                             std::size_t n_local_segments = 0);

  // Makes room for positions [0, n_positions) of `seq`; throws Error past max_positions or when the
  // pool has no free block left (with the numbers, so the caller can size the cache).
  void reserve(int seq, std::size_t n_positions);
  // Like reserve, but returns false instead of throwing when the pool runs out (blocks taken so far
  // stay with the sequence). Still throws past max_positions.
  bool try_reserve(int seq, std::size_t n_positions);
  // Appends `blocks` (references already held for it, Whole) to the table of `seq`, creating it if
  // needed, and sets its length: how a sequence takes over cached blocks. Those its next query's
  // window does not reach are released at once (release_behind_window).
  void adopt(int seq, const std::vector<int>& blocks, std::size_t length);
  // The sequence's block table (empty for an unknown sequence).
  const std::vector<int>& blocks(int seq) const;
  // Stores one position's key and value rows (kv_dim floats each), converting to type().
  void write(std::size_t layer, int seq, std::size_t pos, const float* key, const float* value);
  // Copies position `from` of `seq` (every layer) over position `to`: how a verified token tree's
  // accepted path moves down into place behind the committed context, its rejected branches left
  // past the length to be overwritten.
  void move_position(int seq, std::size_t from, std::size_t to);
  // Reads them back as floats (tests, debugging, a token tree's ancestors). Throws Error where they
  // were released.
  void read(std::size_t layer, int seq, std::size_t pos, float* key, float* value);
  // Gives up the local layers' KV of the sequence's blocks that lie wholly before what its next
  // query (at `next_position`; by default length()) sees: queries only move forward, so none of the
  // sequence's later ones reads them. A block another holder still reads whole keeps it (see
  // BlockPool::Hold). Returns how many blocks' local segments became reusable.
  std::size_t release_behind_window(int seq, std::size_t next_position);
  std::size_t release_behind_window(int seq) { return release_behind_window(seq, length(seq)); }
  // The local layers' window, when their KV lives apart and is released behind it (0: never).
  std::size_t window() const { return window_; }
  // Block base pointers of `seq` for `layer` (keys and values, elements of type()), for attention;
  // pool().rows_of says where a head's rows lie from them.
  void block_pointers(std::size_t layer, int seq, std::vector<const void*>& keys, std::vector<const void*>& values);
  // Positions [0, length) of `seq` hold valid entries.
  std::size_t length(int seq) const;
  void set_length(int seq, std::size_t length);
  // Frees the sequence's blocks.
  void erase(int seq);
  // Tensor parallelism's other ranks: `seq` gets exactly this block table and length, as rank 0
  // decided them (no references are taken: rank 0's pool does the bookkeeping for all ranks), and
  // forget drops the table again after the step.
  void mirror(int seq, std::vector<int> blocks, std::size_t length);
  void forget(int seq) { seqs_.erase(seq); }

  std::size_t kv_dim() const { return pool_.kv_dim(); }
  KvType type() const { return pool_.type(); }
  std::size_t block_tokens() const { return pool_.block_tokens(); }
  std::size_t max_positions() const { return max_positions_; }
  const BlockPool& pool() const { return pool_; }
  BlockPool& pool() { return pool_; }

  // Where a device backend keeps this cache's blocks (backend/device.h): the host keeps the block
  // tables, lengths and reference counts, the device the keys and values, block ids the same.
  struct DeviceState {
    virtual ~DeviceState() = default;
    // The KV spool's way to the blocks' bytes (kv/block_transfer.h), in the layout of a host pool
    // of F16 rows stored head by head (what a device's cache is made with: Model::make_cache).
    // A copy of `block` as the passes so far left it, on its way to host memory; null when there
    // is no room to stage it now (the spool skips that write, as with a full queue).
    virtual std::shared_ptr<PendingBlock> save_block(int block) = 0;
    // Where a block read back from the spool into `block` goes.
    virtual BlockSink load_block(int block) = 0;
  };
  DeviceState* device_state() const { return device_state_.get(); }
  void set_device_state(std::unique_ptr<DeviceState> state) { device_state_ = std::move(state); }
  std::size_t n_sequences() const { return seqs_.size(); }

 private:
  struct Sequence {
    std::vector<int> blocks;
    std::size_t length = 0;
    std::size_t behind_window = 0;  // leading blocks release_behind_window has been through
  };
  Sequence& get(int seq);
  struct WithBlocks {};
  KvCache(WithBlocks, std::size_t n_layers, std::size_t kv_dim, std::size_t n_blocks, std::size_t max_positions, KvType type,
          std::size_t block_tokens, std::size_t head_dim, const LocalLayers& local, std::size_t n_local_segments);

  BlockPool pool_;
  std::size_t max_positions_;
  std::size_t window_ = 0;  // of the local layers, when their KV lives apart
  std::unordered_map<int, Sequence> seqs_;
  std::unique_ptr<DeviceState> device_state_;
};

}  // namespace promptly
