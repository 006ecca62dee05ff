#include "kv/kv_cache.h"

#include <algorithm>
#include <string>

#include "util/error.h"

namespace promptly {

KvCache::KvCache(std::size_t n_layers, std::size_t kv_dim, std::size_t max_positions)
    : n_layers_(n_layers), kv_dim_(kv_dim), max_positions_(max_positions) {}

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
  if (s.keys.empty()) {
    s.keys.resize(n_layers_);
    s.values.resize(n_layers_);
  }
  if (n_positions <= s.capacity) return;
  // Geometric growth keeps decode from reallocating every token.
  const std::size_t cap = std::min(max_positions_, std::max<std::size_t>({n_positions, 2 * s.capacity, 64}));
  for (std::size_t l = 0; l < n_layers_; ++l) {
    s.keys[l].resize(cap * kv_dim_);
    s.values[l].resize(cap * kv_dim_);
  }
  s.capacity = cap;
}

float* KvCache::key(std::size_t layer, int seq, std::size_t pos) { return get(seq).keys[layer].data() + pos * kv_dim_; }
float* KvCache::value(std::size_t layer, int seq, std::size_t pos) { return get(seq).values[layer].data() + pos * kv_dim_; }

std::size_t KvCache::length(int seq) const {
  auto it = seqs_.find(seq);
  return it == seqs_.end() ? 0 : it->second.length;
}

void KvCache::set_length(int seq, std::size_t length) { get(seq).length = length; }

void KvCache::erase(int seq) { seqs_.erase(seq); }

}  // namespace promptly
