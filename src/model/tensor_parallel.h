#pragma once
// Tensor parallelism (Megatron-style, over parallel/communicator.h): which slice of each weight a
// rank holds, and the message with which rank 0 tells the other ranks what each forward pass
// computes.
//
// Rank r of R holds query heads [r H/R, (r+1) H/R) with their KV heads (so its KV cache holds only
// those heads; with fewer KV heads than ranks, ranks whose queries share a KV head each hold it), rows of the same range of wq/wk/wv and their biases, the same columns of wo, rows
// [r F/R, (r+1) F/R) of the FFN's gate and up and those columns of down (per expert in an MoE
// layer), and rows [r V/R, (r+1) V/R) of the output projection. The attention and FFN outputs are
// partial sums over the slices: one all-reduce each per layer; the logits are gathered on rank 0.
// Norms, the router and the token embedding are whole on every rank.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "gguf/gguf.h"
#include "kernels/matmul.h"
#include "kv/kv_cache.h"
#include "model/batch.h"
#include "model/config.h"
#include "util/huge_pages.h"

namespace promptly {

struct LayerWeights;

namespace tensor_parallel {

// [first, end) of n items for `rank` of `ranks`.
struct Part {
  std::size_t first, end;
  std::size_t size() const { return end - first; }
};
inline Part part_of(std::size_t n, int rank, int ranks) {
  return {n * static_cast<std::size_t>(rank) / static_cast<std::size_t>(ranks), n * static_cast<std::size_t>(rank + 1) / static_cast<std::size_t>(ranks)};
}

// The KV dimensions [first, end) whose keys and values rank `rank` computes and caches.
Part kv_part_of(const ModelConfig& c, int rank, int ranks);

// Throws Error, naming the model's numbers, when its heads, KV heads or FFN width do not split into
// `ranks` equal parts whose column slices fall on the weights' quantization blocks.
void check_splittable(const ModelConfig& c, const LayerWeights& first_layer, int ranks);

// Buffers the column slices are copied into (a column range of a matrix is not contiguous): mappings
// of their own, so that the memory goes back to the system when one is dropped (after repacking),
// which the heap would keep.
using OwnedSlices = std::vector<HugePageBuffer>;

// Cuts a whole layer (as loaded) down to `rank`'s slices. The pages of the file that a column slice
// was copied from are given back (this rank's memory should hold its slices only).
void shard_layer(LayerWeights& l, const ModelConfig& c, int rank, int ranks, OwnedSlices& owned, const gguf::File& file);

// The config a rank computes with: heads, KV heads and FFN widths divided by `ranks`.
ModelConfig local_config(const ModelConfig& c, int ranks);

// Rank 0 -> every other rank, before each forward pass: the batch, the KV cache it runs on (its
// geometry, so each rank keeps a cache of the same blocks), the block table and length of each of
// the batch's sequences (its tree nodes' slots and ancestors included), and the row copies rank 0's
// pool made since the last pass (a prefix tree's copy-on-read, a verified token tree's moves).
struct Step {
  enum class Command : std::int64_t { Forward = 1, Stop = 2 };
  Command command = Command::Forward;
  std::uint64_t cache_id = 0;
  struct CacheGeometry {
    std::int64_t n_blocks = 0, max_positions = 0, kv_type = 0, block_tokens = 0, segment_dim = 0;
    bool operator==(const CacheGeometry&) const = default;
  };
  CacheGeometry cache;
  Batch batch;
  struct Sequence {
    int seq;
    std::size_t length;
    std::vector<int> blocks;
  };
  std::vector<Sequence> sequences;
  std::vector<BlockPool::RowCopy> copies;

  std::vector<std::int64_t> encode() const;
  static Step decode(const std::vector<std::int64_t>& words);  // throws Error on a malformed message
};

}  // namespace tensor_parallel
}  // namespace promptly
