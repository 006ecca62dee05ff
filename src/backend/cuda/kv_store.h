#pragma once
// The cache's keys and values on the device, block for block with the host pool, and their way to
// and from the KV spool (KvCache::DeviceState): a block to spool is copied back on a stream of its
// own into pinned staging memory while the next steps run (the spool's writer thread waits for it,
// the engine's never does); a block read from the spool is copied up on another stream by the
// spool's reader thread before the read counts as done. The bytes are the host pool's layout
// (F16, head by head, every layer together), so the spool's files are the same as the CPU's.
// Rows the pool logged (copy-on-write, a token tree's accepted path moved into place) are replayed
// before a block goes to or comes from the spool: a pass replays them at its start, but a block
// saved before the next pass would otherwise be spooled as it was, and one read into a block a
// pending copy reads or writes would be overwritten by the replay.
#include <cuda_runtime.h>

#include <cstddef>
#include <memory>
#include <mutex>
#include <set>
#include <span>

#include "backend/cuda/device_buffer.h"
#include "backend/cuda/kernels.cuh"
#include "kv/kv_cache.h"

namespace promptly::backend::cuda {

class StagingSlots;

class DeviceKvStore final : public KvCache::DeviceState {
 public:
  // Room for every block of `cache`'s pool, on `device`. The store belongs to the cache
  // (KvCache::set_device_state), whose pool it keeps a reference to.
  DeviceKvStore(int device, int n_layer, int n_head_kv, int head_dim, KvCache& cache);
  ~DeviceKvStore() override;
  DeviceKvStore(const DeviceKvStore&) = delete;
  DeviceKvStore& operator=(const DeviceKvStore&) = delete;

  const DeviceKv& desc() const { return desc_; }

  std::shared_ptr<PendingBlock> save_block(int block) override;
  // The pool's logged row copies (copy-on-write, a tree's accepted path), in order, on `stream`.
  void replay(std::span<const BlockPool::RowCopy> copies, cudaStream_t stream) const;
  BlockSink load_block(int block) override;

  // Whether any copy back or replayed row copy may still be running (a pass then asks
  // order_writes_after_saves).
  bool saves_in_flight();
  // Makes `stream` wait for the copies back of any of `blocks` still running (a pass about to write
  // into them: a freed block taken again before its copy for the spool was done), and for any row
  // copies replayed on the spool's behalf (which the pass may read).
  void order_writes_after_saves(std::span<const int> blocks, cudaStream_t stream);

 private:
  __half* block_data(int block) const;
  bool load(int block, std::span<const std::uint8_t> bytes);
  void forget_finished_saves();  // holds mutex_
  void replay_logged_copies();   // holds mutex_; on the engine's thread, which logs them

  int device_;
  BlockPool& pool_;
  DeviceKv desc_{};
  DeviceBuffer<__half> data_;
  std::size_t block_bytes_ = 0;
  bool spoolable_ = false;  // the host pool's layout is the device's (it always is when made by Model::make_cache)
  cudaStream_t saves_ = nullptr, loads_ = nullptr;
  cudaEvent_t saves_done_ = nullptr;  // recorded after each copy back: once it has passed, all have
  std::mutex mutex_;                  // the engine's thread saves and passes, the spool's reader loads
  std::set<int> saving_;              // blocks whose copies back, or replayed row copies, may still be running
  bool replayed_ = false;             // row copies replayed on saves_ that a pass has not waited for
  std::shared_ptr<StagingSlots> staging_;
};

}  // namespace promptly::backend::cuda
