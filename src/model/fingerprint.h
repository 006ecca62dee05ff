#pragma once
// A model file's identity for caches that outlive the process (the KV spool): a hash of its
// metadata, its tensor layout (names, types, shapes, offsets) and a sample of every tensor's data
// (its first and last 256 bytes), so that a re-quantized or retrained file with the same shapes
// does not reuse another's KV blocks. Reads a few pages per tensor, not the weights.
#include <cstdint>

#include "gguf/gguf.h"

namespace promptly {

std::uint64_t model_fingerprint(const gguf::File& file);

}  // namespace promptly
