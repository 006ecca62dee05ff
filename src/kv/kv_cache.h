#pragma once
// Per-sequence key/value storage for attention. This first version keeps one contiguous F32 region
// per (sequence, layer) that grows as tokens arrive; the paged block pool with prefix sharing replaces
// it behind the same accessors (issue "KV cache and scheduler").
#include <cstddef>
#include <cstdint>
#include <unordered_map>
#include <vector>

namespace promptly {

class KvCache {
 public:
  KvCache(std::size_t n_layers, std::size_t kv_dim, std::size_t max_positions);

  // Makes room for positions [0, n_positions) of `seq`; throws Error past max_positions.
  void reserve(int seq, std::size_t n_positions);
  float* key(std::size_t layer, int seq, std::size_t pos);
  float* value(std::size_t layer, int seq, std::size_t pos);
  // Positions [0, length) of `seq` hold valid entries.
  std::size_t length(int seq) const;
  void set_length(int seq, std::size_t length);
  void erase(int seq);

  std::size_t kv_dim() const { return kv_dim_; }
  std::size_t max_positions() const { return max_positions_; }

 private:
  struct Sequence {
    std::vector<std::vector<float>> keys, values;  // per layer: capacity x kv_dim
    std::size_t capacity = 0;
    std::size_t length = 0;
  };
  Sequence& get(int seq);

  std::size_t n_layers_, kv_dim_, max_positions_;
  std::unordered_map<int, Sequence> seqs_;
};

}  // namespace promptly
