#include "kv/block_pool.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "tensor/quant.h"
#include "util/error.h"

namespace promptly {

const char* kv_type_name(KvType t) {
  switch (t) {
    case KvType::F32: return "f32";
    case KvType::F16: return "f16";
    case KvType::Q8_0: return "q8_0";
  }
  return "?";
}

KvType parse_kv_type(const std::string& name) {
  if (name == "f32" || name == "F32") return KvType::F32;
  if (name == "f16" || name == "F16") return KvType::F16;
  if (name == "q8_0" || name == "Q8_0") return KvType::Q8_0;
  throw Error("unknown KV cache type '" + name + "'; supported: f16, q8_0, f32");
}

DType kv_type_dtype(KvType t) {
  switch (t) {
    case KvType::F32: return DType::F32;
    case KvType::F16: return DType::F16;
    case KvType::Q8_0: return DType::Q8_0;
  }
  return DType::F32;
}

std::size_t kv_row_bytes(std::size_t kv_dim, KvType t) {
  switch (t) {
    case KvType::F32: return 4 * kv_dim;
    case KvType::F16: return 2 * kv_dim;
    case KvType::Q8_0:
      if (kv_dim % kQK8_0 != 0) {
        throw Error("a Q8_0 KV cache needs rows that are a multiple of 32 values, but this model's are " + std::to_string(kv_dim) +
                    "; use --kv-type f16");
      }
      return kv_dim / kQK8_0 * sizeof(BlockQ8_0);
  }
  return 4 * kv_dim;
}

std::size_t BlockPool::block_bytes(std::size_t n_layers, std::size_t kv_dim, std::size_t block_tokens, KvType type) {
  return n_layers * 2 * block_tokens * kv_row_bytes(kv_dim, type);
}

namespace {

// Heads as segments where they divide the row and fit the type's blocks; else whole rows.
std::size_t pick_segment_dim(std::size_t kv_dim, std::size_t head_dim, KvType type) {
  if (head_dim == 0 || kv_dim % head_dim != 0) return kv_dim;
  if (type == KvType::Q8_0 && head_dim % kQK8_0 != 0) return kv_dim;
  return head_dim;
}

}  // namespace

BlockPool::BlockPool(std::size_t n_layers, std::size_t kv_dim, std::size_t block_tokens, std::size_t n_blocks, KvType type,
                     std::size_t head_dim, const std::vector<bool>& local_layers, std::size_t n_local_segments)
    : n_layers_(n_layers),
      kv_dim_(kv_dim),
      block_tokens_(block_tokens),
      type_(type),
      row_bytes_(kv_row_bytes(kv_dim, type)),
      segment_dim_(pick_segment_dim(kv_dim, head_dim, type)),
      segment_bytes_(kv_row_bytes(segment_dim_, type)),
      refs_(n_blocks, 0) {
  if (block_tokens == 0 || n_blocks == 0) throw Error("KV pool needs at least one block of at least one token");
  if (!local_layers.empty() && local_layers.size() != n_layers) {
    throw Error("internal: " + std::to_string(local_layers.size()) + " local-layer flags for " + std::to_string(n_layers) + " layers");
  }
  n_local_ = static_cast<std::size_t>(std::count(local_layers.begin(), local_layers.end(), true));
  const std::size_t n_together = n_layers - n_local_;
  if (n_together > 0) storage_ = HugePageBuffer(n_blocks * block_bytes(n_together, kv_dim, block_tokens, type));
  free_.reserve(n_blocks);
  for (std::size_t b = n_blocks; b-- > 0;) free_.push_back(static_cast<int>(b));
  if (n_local_ > 0) {
    is_local_ = local_layers;
    std::size_t next[2] = {0, 0};
    for (std::size_t l = 0; l < n_layers; ++l) group_index_.push_back(next[is_local_[l] ? 1 : 0]++);
    n_segments_ = n_local_segments == 0 ? n_blocks : std::min(n_local_segments, n_blocks);
    local_storage_ = HugePageBuffer(n_segments_ * block_bytes(n_local_, kv_dim, block_tokens, type));
    local_of_.assign(n_blocks, -1);
    whole_.assign(n_blocks, 0);
    left_behind_.assign(n_blocks, false);
    owner_of_.assign(n_segments_, -1);
    tier_.assign(n_segments_, kUnused);
    stamp_.assign(n_segments_, 0);
    for (std::size_t s = n_segments_; s-- > 0;) spare_[kUnused].push_back({static_cast<int>(s), 0});
  }
}

std::vector<std::span<std::uint8_t>> BlockPool::block_parts(int block, bool skip_missing) {
  std::vector<std::span<std::uint8_t>> parts;
  for (std::size_t layer = 0; layer < n_layers_; ++layer) {
    std::uint8_t* k = base(block, layer);
    if (!k && !skip_missing) throw Error("internal: KV block " + std::to_string(block) + " has given up its sliding-window layers' KV");
    if (!k && !parts.empty() && parts.back().data() == nullptr) {
      parts.back() = {static_cast<std::uint8_t*>(nullptr), parts.back().size() + layer_bytes()};
    } else if (!k) {
      parts.emplace_back(static_cast<std::uint8_t*>(nullptr), layer_bytes());
    } else if (!parts.empty() && parts.back().data() && parts.back().data() + parts.back().size() == k) {
      parts.back() = {parts.back().data(), parts.back().size() + layer_bytes()};
    } else {
      parts.emplace_back(k, layer_bytes());
    }
  }
  return parts;
}

std::vector<std::span<const std::uint8_t>> BlockPool::block_parts(int block) const {
  const std::vector<std::span<std::uint8_t>> parts = const_cast<BlockPool*>(this)->block_parts(block);  // reads only
  return {parts.begin(), parts.end()};
}

void BlockPool::offer_segment(int segment, Tier tier) {
  const std::size_t seg = static_cast<std::size_t>(segment);
  if (tier_[seg] == tier) return;  // queued there already
  tier_[seg] = tier;
  std::deque<SpareEntry>& queue = spare_[tier];
  queue.push_back({segment, ++stamp_[seg]});
  // Mostly stale entries: keep the valid ones, in order.
  if (queue.size() > 2 * n_segments_) std::erase_if(queue, [&](const SpareEntry& e) { return !is_valid(e, tier); });
}

int BlockPool::take_segment() {
  // Never runs dry unless out_of_segments(): every segment not read whole has a valid entry.
  for (const Tier tier : {kBehind, kUnused, kFrontier}) {
    std::deque<SpareEntry>& queue = spare_[tier];
    while (!queue.empty()) {
      // Unused segments: the most recently freed first (warm in cache, and the rest stay untouched).
      const SpareEntry e = tier == kUnused ? queue.back() : queue.front();
      if (tier == kUnused) {
        queue.pop_back();
      } else {
        queue.pop_front();
      }
      if (!is_valid(e, tier)) continue;
      tier_[static_cast<std::size_t>(e.segment)] = kNone;
      if (const int owner = owner_of_[static_cast<std::size_t>(e.segment)]; owner >= 0) local_of_[static_cast<std::size_t>(owner)] = -1;
      return e.segment;
    }
  }
  throw Error("internal: no local KV segment left for a free block");
}

void BlockPool::add_whole(int block) {
  const std::size_t b = static_cast<std::size_t>(block);
  if (whole_[b]++ == 0 && local_of_[b] >= 0) {
    ++held_segments_;
    tier_[static_cast<std::size_t>(local_of_[b])] = kNone;  // taken back: given up again later, it queues anew
  }
}

void BlockPool::drop_whole(int block, Tier tier) {
  const std::size_t b = static_cast<std::size_t>(block);
  if (whole_[b] <= 0) throw Error("internal: KV block " + std::to_string(block) + " has no holder reading it whole");
  if (--whole_[b] == 0 && local_of_[b] >= 0) {
    --held_segments_;
    offer_segment(local_of_[b], tier);
  }
}

bool BlockPool::unpin_local(int block) {
  if (n_local_ == 0) return false;
  left_behind_[static_cast<std::size_t>(block)] = true;
  drop_whole(block, kBehind);
  return whole_[static_cast<std::size_t>(block)] == 0 && local_of_[static_cast<std::size_t>(block)] >= 0;
}

std::size_t BlockPool::bytes_in_use() const {
  const std::size_t blocks = n_blocks() - free_.size();
  return (blocks * (n_layers_ - n_local_) + held_segments_ * n_local_) * layer_bytes();
}

int BlockPool::allocate_without_local() {
  if (free_.empty()) return -1;
  const int b = free_.back();
  free_.pop_back();
  refs_[static_cast<std::size_t>(b)] = 1;
  if (n_local_ > 0) add_whole(b);  // no segment: counts as a holder only, so that release is the same
  return b;
}

int BlockPool::allocate() {
  if (free_.empty() || out_of_segments()) return -1;
  const int b = free_.back();
  free_.pop_back();
  refs_[static_cast<std::size_t>(b)] = 1;
  if (n_local_ > 0) {
    const int segment = take_segment();
    local_of_[static_cast<std::size_t>(b)] = segment;
    owner_of_[static_cast<std::size_t>(segment)] = b;
    left_behind_[static_cast<std::size_t>(b)] = false;
    add_whole(b);
  }
  return b;
}

void BlockPool::retain(int block, Hold hold) {
  if (refs_[static_cast<std::size_t>(block)] <= 0) throw Error("internal: retaining free KV block " + std::to_string(block));
  ++refs_[static_cast<std::size_t>(block)];
  if (n_local_ > 0 && hold == Hold::Whole) add_whole(block);
}

void BlockPool::release(int block, Hold hold) {
  const std::size_t b = static_cast<std::size_t>(block);
  int& r = refs_[b];
  if (r <= 0) throw Error("internal: releasing free KV block " + std::to_string(block));
  if (n_local_ > 0 && hold == Hold::Whole) drop_whole(block, left_behind_[b] ? kBehind : kFrontier);
  if (--r == 0) {
    if (n_local_ > 0 && whole_[b] != 0) throw Error("internal: KV block " + std::to_string(block) + " freed while read whole");
    if (n_local_ > 0 && local_of_[b] >= 0) {
      const int segment = local_of_[b];
      local_of_[b] = -1;
      owner_of_[static_cast<std::size_t>(segment)] = -1;
      offer_segment(segment, kUnused);
    }
    free_.push_back(block);
  }
}

void BlockPool::copy_rows(int from, int to, std::size_t n_rows) {
  if (n_rows > block_tokens_) throw Error("internal: copying more rows than a KV block holds");
  if (log_copies_) copies_.push_back({from, 0, to, 0, n_rows});
  for (std::size_t layer = 0; layer < n_layers_; ++layer) {
    if (!keys(from, layer) || !keys(to, layer)) continue;  // a released local segment: nothing to copy, or nowhere
    for (std::size_t e = 0; e < kv_dim_; e += segment_dim_) {
      const std::size_t at = offset_of(0, e);
      std::memcpy(keys(to, layer) + at, keys(from, layer) + at, n_rows * segment_bytes_);
      std::memcpy(values(to, layer) + at, values(from, layer) + at, n_rows * segment_bytes_);
    }
  }
}

void BlockPool::copy_row(int from, std::size_t from_slot, int to, std::size_t to_slot) {
  if (from_slot >= block_tokens_ || to_slot >= block_tokens_) throw Error("internal: copying a KV row outside its block");
  if (log_copies_) copies_.push_back({from, from_slot, to, to_slot, 1});
  for (std::size_t layer = 0; layer < n_layers_; ++layer) {
    if (!keys(from, layer) || !keys(to, layer)) continue;  // a released local segment: nothing to copy, or nowhere
    for (std::size_t e = 0; e < kv_dim_; e += segment_dim_) {
      std::memcpy(keys(to, layer) + offset_of(to_slot, e), keys(from, layer) + offset_of(from_slot, e), segment_bytes_);
      std::memcpy(values(to, layer) + offset_of(to_slot, e), values(from, layer) + offset_of(from_slot, e), segment_bytes_);
    }
  }
}

void BlockPool::replay(const RowCopy& copy) {
  if (copy.from_slot == 0 && copy.to_slot == 0) {
    copy_rows(copy.from, copy.to, copy.n_rows);
    return;
  }
  if (copy.n_rows > block_tokens_ || copy.from_slot + copy.n_rows > block_tokens_ || copy.to_slot + copy.n_rows > block_tokens_) {
    throw Error("internal: a logged KV copy reaches past its block");
  }
  for (std::size_t i = 0; i < copy.n_rows; ++i) copy_row(copy.from, copy.from_slot + i, copy.to, copy.to_slot + i);
}

void BlockPool::store(const float* row, std::uint8_t* dst, std::size_t slot) const {
  const DType t = kv_type_dtype(type_);
  for (std::size_t e = 0; e < kv_dim_; e += segment_dim_) quantize_row(t, row + e, dst + offset_of(slot, e), segment_dim_);
}

void BlockPool::load(const std::uint8_t* src, std::size_t slot, float* row) const {
  const DType t = kv_type_dtype(type_);
  for (std::size_t e = 0; e < kv_dim_; e += segment_dim_) dequantize_row(t, src + offset_of(slot, e), row + e, segment_dim_);
}

}  // namespace promptly
