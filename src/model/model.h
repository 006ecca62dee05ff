#pragma once
// The llama-family transformer (llama, mistral, qwen2, ...). Weights are used in place from the
// mapped GGUF file in their stored type; the forward pass reads like the math and leaves speed to the
// kernels.
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "gguf/gguf.h"
#include "kernels/matmul.h"
#include "kv/kv_cache.h"
#include "model/batch.h"
#include "model/config.h"
#include "util/huge_pages.h"
#include "util/thread_pool.h"

namespace promptly {

struct LayerWeights {
  kernels::WeightMatrix wq, wk, wv, wo, w_gate, w_up, w_down;
  const float* attn_norm = nullptr;
  const float* ffn_norm = nullptr;
  const float* bq = nullptr;  // qwen2 QKV biases; null when absent
  const float* bk = nullptr;
  const float* bv = nullptr;
};

class Model {
 public:
  // Loads and validates every tensor; throws Error naming the tensor and what is wrong.
  explicit Model(std::shared_ptr<const gguf::File> file);

  const ModelConfig& config() const { return config_; }
  const gguf::File& file() const { return *file_; }

  // Runs the batch, appending K/V to `cache`, and writes the logits of each token whose
  // want_logits is set, in batch order, to `logits` (n_vocab floats per such token).
  //
  // `stop_before(layer)`, when given, is asked before each layer after the first; if it says yes,
  // the pass ends there and returns false: the sequences' lengths stay as they were and `logits` is
  // empty. The rows already written at the batch's positions hold nothing anyone reads (they lie
  // past the lengths) until the same tokens run again and write the same values. This is how the
  // engine lets a waiting follow-up go ahead of a step already in flight.
  bool forward(const Batch& batch, KvCache& cache, ThreadPool& pool, std::vector<float>& logits,
               const std::function<bool(std::size_t layer)>& stop_before = {}) const;

  KvCache make_cache(std::size_t max_positions, KvType type = KvType::F16, std::size_t max_sequences = 1) const;

 private:
  std::shared_ptr<const gguf::File> file_;
  ModelConfig config_;
  kernels::WeightMatrix token_embd_;
  kernels::WeightMatrix output_;
  const float* output_norm_ = nullptr;
  std::vector<LayerWeights> layers_;
  std::vector<float> inv_freq_;  // n_rot / 2 rope speeds, with llama3 frequency factors applied
  HugePageBuffer repacked_;  // weights moved into kernel-friendly layouts

  void repack_for_kernels();
};

}  // namespace promptly
