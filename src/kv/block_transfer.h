#pragma once
// A KV block's bytes on their way between the KV spool (kv/spool.h) and a device that keeps the
// blocks' contents in its own memory (a GPU: KvCache::DeviceState). The host pool's blocks are
// plain memory the spool copies from and reads into; a device's are not, so the spool takes them
// through these two instead, always in the host pool's layout (the files are the same either way).
#include <cstdint>
#include <functional>
#include <span>

namespace promptly {

// A block's bytes that reach host memory only later (copied back from the device behind the step
// that computed them): the spool's writer thread waits for them, so the engine's thread never does.
class PendingBlock {
 public:
  virtual ~PendingBlock() = default;
  // Blocks until the bytes are in host memory and returns them (valid while this object lives);
  // empty when they never will be (a device error): the write is then skipped.
  virtual std::span<const std::uint8_t> wait() = 0;
};

// Where a block read back from the spool goes when it is not host memory (a device's block): called
// on the spool's reader thread with the verified bytes; returns once they are stored there (the
// engine uses the block as soon as the read is done), false when they could not be.
using BlockSink = std::function<bool(std::span<const std::uint8_t>)>;

}  // namespace promptly
