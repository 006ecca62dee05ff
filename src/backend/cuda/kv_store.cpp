#include "backend/cuda/kv_store.h"

#include <algorithm>
#include <string>
#include <vector>

#include "backend/cuda/check.h"

namespace promptly::backend::cuda {

namespace {
// Pinned memory the copies back may hold at once: the KV spool's write queue (SpoolOptions' 64 MiB)
// and two slots more, so that the queue, which counts what it skips, is what runs out first (a slot
// is held from the copy's start until the writer has written it, the queue's bytes a little less).
// Slots are allocated as needed (a pinned allocation of a few MB takes a fraction of a millisecond,
// a whole arena tens), and kept.
constexpr std::size_t kStagingBytes = std::size_t{64} << 20;
}  // namespace

// Blocks of pinned host memory, one block each, shared by the store and the pending copies (which
// the spool's writer thread may drop after the store is gone).
class StagingSlots {
 public:
  StagingSlots(int device, std::size_t slot_bytes)
      : device_(device), slot_bytes_(slot_bytes), max_slots_(kStagingBytes / slot_bytes + 2) {}
  ~StagingSlots() {
    cudaSetDevice(device_);
    for (Slot& s : slots_) {
      cudaFreeHost(s.host);
      cudaEventDestroy(s.copied);
    }
  }
  StagingSlots(const StagingSlots&) = delete;
  StagingSlots& operator=(const StagingSlots&) = delete;

  // A free slot, allocating one while under the cap; -1 when all are taken.
  int take() {
    std::lock_guard lock(mutex_);
    if (!free_.empty()) {
      const int slot = free_.back();
      free_.pop_back();
      return slot;
    }
    if (slots_.size() >= max_slots_) return -1;
    Slot s;
    // No room for another slot now is what -1 says too (the spool skips the write); the failure
    // must not stay behind as the thread's last error, which the next pass checks.
    if (cudaMallocHost(&s.host, slot_bytes_) != cudaSuccess) return cudaGetLastError(), -1;
    if (cudaEventCreateWithFlags(&s.copied, cudaEventDisableTiming) != cudaSuccess) {
      cudaFreeHost(s.host);
      return cudaGetLastError(), -1;
    }
    slots_.push_back(s);
    return static_cast<int>(slots_.size()) - 1;
  }
  void give_back(int slot) {
    std::lock_guard lock(mutex_);
    free_.push_back(slot);
  }
  std::uint8_t* host(int slot) {
    std::lock_guard lock(mutex_);  // slots_ may grow on the engine's thread meanwhile
    return static_cast<std::uint8_t*>(slots_[static_cast<std::size_t>(slot)].host);
  }
  cudaEvent_t copied(int slot) {
    std::lock_guard lock(mutex_);
    return slots_[static_cast<std::size_t>(slot)].copied;
  }
  int device() const { return device_; }
  std::size_t slot_bytes() const { return slot_bytes_; }

 private:
  struct Slot {
    void* host = nullptr;
    cudaEvent_t copied = nullptr;  // recorded after the copy into it
  };
  int device_;
  std::size_t slot_bytes_, max_slots_;
  std::mutex mutex_;
  std::vector<Slot> slots_;
  std::vector<int> free_;
};

namespace {

// A block on its way back, in a staging slot until the spool has written it.
class StagedBlock final : public PendingBlock {
 public:
  StagedBlock(std::shared_ptr<StagingSlots> staging, int slot) : staging_(std::move(staging)), slot_(slot) {}
  ~StagedBlock() override { staging_->give_back(slot_); }
  std::span<const std::uint8_t> wait() override {
    // On the spool's writer thread: no exceptions (a failed copy skips the write).
    if (cudaSetDevice(staging_->device()) != cudaSuccess || cudaEventSynchronize(staging_->copied(slot_)) != cudaSuccess) return {};
    return {staging_->host(slot_), staging_->slot_bytes()};
  }

 private:
  std::shared_ptr<StagingSlots> staging_;
  int slot_;
};

}  // namespace

DeviceKvStore::DeviceKvStore(int device, int n_layer, int n_head_kv, int head_dim, KvCache& cache) : device_(device), pool_(cache.pool()) {
  desc_.n_layer = n_layer;
  desc_.n_head_kv = n_head_kv;
  desc_.head_dim = head_dim;
  desc_.block_tokens = static_cast<int>(cache.block_tokens());
  block_bytes_ = static_cast<std::size_t>(n_layer) * 2 * desc_.part_elems() * sizeof(__half);
  spoolable_ = pool_.type() == KvType::F16 && pool_.segment_dim() == static_cast<std::size_t>(head_dim) && !pool_.has_separate_local_layers() &&
               BlockPool::block_bytes(pool_.n_layers(), pool_.kv_dim(), pool_.block_tokens(), pool_.type()) == block_bytes_;
  PROMPTLY_CUDA_CHECK(cudaSetDevice(device_));
  try {
    data_ = DeviceBuffer<__half>(pool_.n_blocks() * block_bytes_ / sizeof(__half));
  } catch (const Error& e) {
    throw Error(std::string(e.what()) + ", for the KV cache; lower --kv-memory or --ctx-size");
  }
  desc_.data = data_.get();
  PROMPTLY_CUDA_CHECK(cudaStreamCreateWithFlags(&saves_, cudaStreamNonBlocking));
  PROMPTLY_CUDA_CHECK(cudaStreamCreateWithFlags(&loads_, cudaStreamNonBlocking));
  PROMPTLY_CUDA_CHECK(cudaEventCreateWithFlags(&saves_done_, cudaEventDisableTiming));
  staging_ = std::make_shared<StagingSlots>(device_, block_bytes_);
}

DeviceKvStore::~DeviceKvStore() {
  cudaSetDevice(device_);
  cudaStreamSynchronize(saves_);  // the staging slots may outlive this, the copies into them may not
  cudaStreamSynchronize(loads_);
  cudaEventDestroy(saves_done_);
  cudaStreamDestroy(saves_);
  cudaStreamDestroy(loads_);
}

__half* DeviceKvStore::block_data(int block) const { return data_.get() + static_cast<std::size_t>(block) * desc_.n_layer * 2 * desc_.part_elems(); }

void DeviceKvStore::forget_finished_saves() {
  if (!saving_.empty() && cudaEventQuery(saves_done_) == cudaSuccess) saving_.clear(), replayed_ = false;
}

void DeviceKvStore::replay(std::span<const BlockPool::RowCopy> copies, cudaStream_t stream) const {
  for (const BlockPool::RowCopy& copy : copies) {
    copy_kv_rows(desc_, copy.from, static_cast<int>(copy.from_slot), copy.to, static_cast<int>(copy.to_slot), static_cast<int>(copy.n_rows),
                 stream);
  }
}

void DeviceKvStore::replay_logged_copies() {
  const std::vector<BlockPool::RowCopy> copies = pool_.take_copies();
  if (copies.empty()) return;
  // The passes that logged them have finished (CudaForward::forward waits for its compute stream
  // before it returns); the next pass waits for these (order_writes_after_saves).
  replay(copies, saves_);
  for (const BlockPool::RowCopy& copy : copies) saving_.insert(copy.from), saving_.insert(copy.to);
  PROMPTLY_CUDA_CHECK(cudaGetLastError());
  PROMPTLY_CUDA_CHECK(cudaEventRecord(saves_done_, saves_));
  replayed_ = true;
}

std::shared_ptr<PendingBlock> DeviceKvStore::save_block(int block) {
  if (!spoolable_) return nullptr;
  std::lock_guard lock(mutex_);
  PROMPTLY_CUDA_CHECK(cudaSetDevice(device_));
  forget_finished_saves();
  replay_logged_copies();
  const int slot = staging_->take();
  if (slot < 0) return nullptr;  // as many copies on their way as the spool's queue holds
  // The passes that wrote the block have finished (CudaForward::forward waits for its compute
  // stream before it returns), so the copy needs no event from them.
  PROMPTLY_CUDA_CHECK(cudaMemcpyAsync(staging_->host(slot), block_data(block), block_bytes_, cudaMemcpyDeviceToHost, saves_));
  PROMPTLY_CUDA_CHECK(cudaEventRecord(staging_->copied(slot), saves_));
  PROMPTLY_CUDA_CHECK(cudaEventRecord(saves_done_, saves_));
  saving_.insert(block);
  return std::make_shared<StagedBlock>(staging_, slot);
}

BlockSink DeviceKvStore::load_block(int block) {
  {
    // Here, on the engine's thread, before the reader's copy into the block: a logged copy from or
    // into it runs first, and the copy up waits for it (load).
    std::lock_guard lock(mutex_);
    PROMPTLY_CUDA_CHECK(cudaSetDevice(device_));
    forget_finished_saves();
    replay_logged_copies();
  }
  return [this, block](std::span<const std::uint8_t> bytes) { return load(block, bytes); };
}

bool DeviceKvStore::load(int block, std::span<const std::uint8_t> bytes) {
  // On the spool's reader thread: no exceptions, a failure only sends the tokens to be recomputed.
  if (!spoolable_ || bytes.size() != block_bytes_ || cudaSetDevice(device_) != cudaSuccess) return false;
  {
    // The block was free and taken for this read: a copy back of what it held before may still run.
    std::lock_guard lock(mutex_);
    forget_finished_saves();
    if (saving_.count(block) > 0 && cudaStreamWaitEvent(loads_, saves_done_, 0) != cudaSuccess) return false;
  }
  // From pageable memory (the spool's read buffer), which the copy has read once it returns.
  return cudaMemcpyAsync(block_data(block), bytes.data(), bytes.size(), cudaMemcpyHostToDevice, loads_) == cudaSuccess &&
         cudaStreamSynchronize(loads_) == cudaSuccess;
}

bool DeviceKvStore::saves_in_flight() {
  std::lock_guard lock(mutex_);
  forget_finished_saves();
  return !saving_.empty();
}

void DeviceKvStore::order_writes_after_saves(std::span<const int> blocks, cudaStream_t stream) {
  std::lock_guard lock(mutex_);
  forget_finished_saves();
  if (replayed_ || std::any_of(blocks.begin(), blocks.end(), [&](int b) { return saving_.count(b) > 0; })) {
    PROMPTLY_CUDA_CHECK(cudaStreamWaitEvent(stream, saves_done_, 0));
  }
}

}  // namespace promptly::backend::cuda
