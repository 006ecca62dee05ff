#include "kv/kv_cache.h"

#include <algorithm>
#include <string>

#include "util/error.h"
#include "util/fp16.h"

namespace promptly {

KvCache::KvCache(std::size_t n_layers, std::size_t kv_dim, std::size_t max_positions, std::size_t max_sequences, KvType type,
                 std::size_t block_tokens)
    : pool_(n_layers, kv_dim, block_tokens, ((max_positions + block_tokens - 1) / block_tokens) * std::max<std::size_t>(1, max_sequences),
            type),
      max_positions_(max_positions) {}

KvCache::KvCache(WithBlocks, std::size_t n_layers, std::size_t kv_dim, std::size_t n_blocks, std::size_t max_positions, KvType type,
                 std::size_t block_tokens)
    : pool_(n_layers, kv_dim, block_tokens, n_blocks, type), max_positions_(max_positions) {}

KvCache KvCache::with_blocks(std::size_t n_layers, std::size_t kv_dim, std::size_t n_blocks, std::size_t max_positions, KvType type,
                             std::size_t block_tokens) {
  return KvCache(WithBlocks{}, n_layers, kv_dim, n_blocks, max_positions, type, block_tokens);
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
}

const std::vector<int>& KvCache::blocks(int seq) const {
  static const std::vector<int> kNone;
  auto it = seqs_.find(seq);
  return it == seqs_.end() ? kNone : it->second.blocks;
}

void KvCache::write(std::size_t layer, int seq, std::size_t pos, const float* key, const float* value) {
  const Sequence& s = get(seq);
  const int block = s.blocks[pos / pool_.block_tokens()];
  const std::size_t at = (pos % pool_.block_tokens()) * pool_.kv_dim();
  if (pool_.type() == KvType::F32) {
    std::copy_n(key, pool_.kv_dim(), reinterpret_cast<float*>(pool_.keys(block, layer)) + at);
    std::copy_n(value, pool_.kv_dim(), reinterpret_cast<float*>(pool_.values(block, layer)) + at);
    return;
  }
  auto* k = reinterpret_cast<std::uint16_t*>(pool_.keys(block, layer)) + at;
  auto* v = reinterpret_cast<std::uint16_t*>(pool_.values(block, layer)) + at;
  for (std::size_t i = 0; i < pool_.kv_dim(); ++i) {
    k[i] = fp32_to_fp16(key[i]);
    v[i] = fp32_to_fp16(value[i]);
  }
}

void KvCache::read(std::size_t layer, int seq, std::size_t pos, float* key, float* value) {
  const Sequence& s = get(seq);
  const int block = s.blocks[pos / pool_.block_tokens()];
  const std::size_t at = (pos % pool_.block_tokens()) * pool_.kv_dim();
  for (std::size_t i = 0; i < pool_.kv_dim(); ++i) {
    if (pool_.type() == KvType::F32) {
      key[i] = reinterpret_cast<const float*>(pool_.keys(block, layer))[at + i];
      value[i] = reinterpret_cast<const float*>(pool_.values(block, layer))[at + i];
    } else {
      key[i] = fp16_to_fp32(reinterpret_cast<const std::uint16_t*>(pool_.keys(block, layer))[at + i]);
      value[i] = fp16_to_fp32(reinterpret_cast<const std::uint16_t*>(pool_.values(block, layer))[at + i]);
    }
  }
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

void KvCache::set_length(int seq, std::size_t length) { get(seq).length = length; }

void KvCache::erase(int seq) {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) return;
  for (int b : it->second.blocks) pool_.release(b);
  seqs_.erase(it);
}

}  // namespace promptly
