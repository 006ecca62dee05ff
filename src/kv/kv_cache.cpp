#include "kv/kv_cache.h"

#include <algorithm>
#include <string>

#include "util/error.h"

namespace promptly {

KvCache::KvCache(std::size_t n_layers, std::size_t kv_dim, std::size_t max_positions, std::size_t max_sequences,
                 std::size_t block_tokens)
    : pool_(n_layers, kv_dim, block_tokens, ((max_positions + block_tokens - 1) / block_tokens) * std::max<std::size_t>(1, max_sequences)),
      max_positions_(max_positions) {}

KvCache::Sequence& KvCache::get(int seq) {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) throw Error("internal: KV cache has no sequence " + std::to_string(seq));
  return it->second;
}

void KvCache::reserve(int seq, std::size_t n_positions) {
  if (n_positions > max_positions_) {
    throw Error("sequence needs " + std::to_string(n_positions) + " positions but the context holds " +
                std::to_string(max_positions_) + " (raise --ctx-size or shorten the prompt)");
  }
  Sequence& s = seqs_[seq];
  while (s.blocks.size() * pool_.block_tokens() < n_positions) {
    const int b = pool_.allocate();
    if (b < 0) {
      throw Error("KV cache is full: all " + std::to_string(pool_.n_blocks()) + " blocks of " + std::to_string(pool_.block_tokens()) +
                  " tokens are in use");
    }
    s.blocks.push_back(b);
  }
}

float* KvCache::key(std::size_t layer, int seq, std::size_t pos) {
  const Sequence& s = get(seq);
  return pool_.keys(s.blocks[pos / pool_.block_tokens()], layer) + (pos % pool_.block_tokens()) * pool_.kv_dim();
}

float* KvCache::value(std::size_t layer, int seq, std::size_t pos) {
  const Sequence& s = get(seq);
  return pool_.values(s.blocks[pos / pool_.block_tokens()], layer) + (pos % pool_.block_tokens()) * pool_.kv_dim();
}

void KvCache::block_pointers(std::size_t layer, int seq, std::vector<const float*>& keys, std::vector<const float*>& values) {
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
