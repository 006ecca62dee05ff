#include "kv/kv_cache.h"

#include <algorithm>
#include <string>

#include "util/error.h"
#include "tensor/quant.h"

namespace promptly {

KvCache::KvCache(std::size_t n_layers, std::size_t kv_dim, std::size_t max_positions, std::size_t max_sequences, KvType type,
                 std::size_t block_tokens, std::size_t head_dim, const LocalLayers& local)
    : pool_(n_layers, kv_dim, block_tokens, ((max_positions + block_tokens - 1) / block_tokens) * std::max<std::size_t>(1, max_sequences),
            type, head_dim, local.window > 0 ? local.is_local : std::vector<bool>{}),
      max_positions_(max_positions),
      window_(pool_.has_separate_local_layers() ? local.window : 0) {}

KvCache::KvCache(WithBlocks, std::size_t n_layers, std::size_t kv_dim, std::size_t n_blocks, std::size_t max_positions, KvType type,
                 std::size_t block_tokens, std::size_t head_dim, const LocalLayers& local, std::size_t n_local_segments)
    : pool_(n_layers, kv_dim, block_tokens, n_blocks, type, head_dim, local.window > 0 ? local.is_local : std::vector<bool>{},
            n_local_segments),
      max_positions_(max_positions),
      window_(pool_.has_separate_local_layers() ? local.window : 0) {}

KvCache KvCache::with_blocks(std::size_t n_layers, std::size_t kv_dim, std::size_t n_blocks, std::size_t max_positions, KvType type,
                             std::size_t block_tokens, std::size_t head_dim, const LocalLayers& local, std::size_t n_local_segments) {
  return KvCache(WithBlocks{}, n_layers, kv_dim, n_blocks, max_positions, type, block_tokens, head_dim, local, n_local_segments);
}

KvCache::Sequence& KvCache::get(int seq) {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) throw Error("internal: KV cache has no sequence " + std::to_string(seq));
  return it->second;
}

bool KvCache::try_reserve(int seq, std::size_t n_positions) {
  if (n_positions > max_positions_) {
    throw Error("sequence needs " + std::to_string(n_positions) + " positions but the context holds " +
                std::to_string(max_positions_) + " (raise --ctx-size or shorten the prompt)");
  }
  Sequence& s = seqs_[seq];
  while (s.blocks.size() * pool_.block_tokens() < n_positions) {
    const int b = pool_.allocate();
    if (b < 0) return false;
    s.blocks.push_back(b);
  }
  return true;
}

void KvCache::reserve(int seq, std::size_t n_positions) {
  if (!try_reserve(seq, n_positions)) {
    throw Error("KV cache is full: all " + std::to_string(pool_.n_blocks()) + " blocks of " + std::to_string(pool_.block_tokens()) +
                " tokens are in use");
  }
}

void KvCache::adopt(int seq, const std::vector<int>& blocks, std::size_t length) {
  Sequence& s = seqs_[seq];
  s.blocks.insert(s.blocks.end(), blocks.begin(), blocks.end());
  if (length > s.blocks.size() * pool_.block_tokens()) throw Error("internal: adopted KV blocks are shorter than their length");
  s.length = length;
  release_behind_window(seq, length);
}

void KvCache::mirror(int seq, std::vector<int> blocks, std::size_t length) {
  for (int b : blocks) {
    if (b < 0 || static_cast<std::size_t>(b) >= pool_.n_blocks()) throw Error("tensor parallelism: rank 0 named KV block " + std::to_string(b) + " of " + std::to_string(pool_.n_blocks()));
  }
  if (length > blocks.size() * pool_.block_tokens()) throw Error("internal: mirrored KV blocks are shorter than their length");
  seqs_[seq] = Sequence{std::move(blocks), length, 0};
}

const std::vector<int>& KvCache::blocks(int seq) const {
  static const std::vector<int> kNone;
  auto it = seqs_.find(seq);
  return it == seqs_.end() ? kNone : it->second.blocks;
}

void KvCache::write(std::size_t layer, int seq, std::size_t pos, const float* key, const float* value) {
  const Sequence& s = get(seq);
  const int block = s.blocks[pos / pool_.block_tokens()];
  const std::size_t slot = pos % pool_.block_tokens();
  pool_.store(key, pool_.keys(block, layer), slot);
  pool_.store(value, pool_.values(block, layer), slot);
}

void KvCache::move_position(int seq, std::size_t from, std::size_t to) {
  const Sequence& s = get(seq);
  const std::size_t bt = pool_.block_tokens();
  if (from / bt >= s.blocks.size() || to / bt >= s.blocks.size()) throw Error("internal: moving a KV position the sequence has no block for");
  if (from == to) return;
  pool_.copy_row(s.blocks[from / bt], from % bt, s.blocks[to / bt], to % bt);
}

void KvCache::read(std::size_t layer, int seq, std::size_t pos, float* key, float* value) {
  const Sequence& s = get(seq);
  const int block = s.blocks[pos / pool_.block_tokens()];
  const std::size_t slot = pos % pool_.block_tokens();
  if (!pool_.keys(block, layer)) {
    throw Error("KV of layer " + std::to_string(layer) + " at position " + std::to_string(pos) + " was released (behind its sliding window)");
  }
  pool_.load(pool_.keys(block, layer), slot, key);
  pool_.load(pool_.values(block, layer), slot, value);
}

std::size_t KvCache::release_behind_window(int seq, std::size_t next_position) {
  if (window_ == 0) return 0;
  Sequence& s = get(seq);
  if (next_position + 1 <= window_) return 0;
  // The query at next_position sees (next_position - window, next_position].
  const std::size_t first_seen = next_position + 1 - window_;
  const std::size_t behind = std::min(first_seen / pool_.block_tokens(), s.blocks.size());
  std::size_t released = 0;
  for (; s.behind_window < behind; ++s.behind_window) released += pool_.unpin_local(s.blocks[s.behind_window]) ? 1 : 0;
  return released;
}

void KvCache::block_pointers(std::size_t layer, int seq, std::vector<const void*>& keys, std::vector<const void*>& values) {
  const Sequence& s = get(seq);
  keys.resize(s.blocks.size());
  values.resize(s.blocks.size());
  for (std::size_t i = 0; i < s.blocks.size(); ++i) {
    keys[i] = pool_.keys(s.blocks[i], layer);
    values[i] = pool_.values(s.blocks[i], layer);
  }
}

std::size_t KvCache::length(int seq) const {
  auto it = seqs_.find(seq);
  return it == seqs_.end() ? 0 : it->second.length;
}

void KvCache::set_length(int seq, std::size_t length) {
  Sequence& s = get(seq);
  // A query at position length would see (length - window, length]: none of it may be released.
  if (s.behind_window > 0 && length + 1 < window_ + s.behind_window * pool_.block_tokens()) {
    throw Error("internal: KV cache length " + std::to_string(length) + " reaches back into KV released behind the sliding window");
  }
  s.length = length;
}

void KvCache::erase(int seq) {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) return;
  const Sequence& s = it->second;
  for (std::size_t i = 0; i < s.blocks.size(); ++i) pool_.release(s.blocks[i], i < s.behind_window ? BlockPool::Hold::Cached : BlockPool::Hold::Whole);
  seqs_.erase(it);
}

}  // namespace promptly
