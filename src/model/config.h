#pragma once
// Model hyper-parameters read from GGUF metadata (`<arch>.*` keys).
#include <cstdint>
#include <string>

#include "gguf/gguf.h"
#include "model/arch/arch.h"

namespace promptly {

struct ModelConfig {
  std::string arch;            // general.architecture: one of arch::supported_list()
  const arch::Arch* desc = nullptr;  // its description (never null after from_gguf)
  std::string name;            // general.name, if any
  std::uint32_t n_vocab = 0;
  std::uint32_t n_ctx_train = 0;
  std::uint32_t n_embd = 0;
  std::uint32_t n_layer = 0;
  std::uint32_t n_head = 0;
  std::uint32_t n_head_kv = 0;
  std::uint32_t head_dim = 0;  // key/value length per head
  std::uint32_t n_ff = 0;      // dense FFN width
  float rms_eps = 1e-5f;
  float rope_freq_base = 10000.0f;
  float rope_freq_scale = 1.0f;  // linear rope scaling: positions are multiplied by this
  float rope_attn_factor = 1.0f;  // LongRoPE (phi3): cos and sin multiplied by this (rope.scaling.attn_factor)
  // LongRoPE (phi3): rope.scaling.original_context_length; a context longer than this uses the long
  // frequency factors (0: none given).
  std::uint32_t rope_orig_ctx = 0;
  std::uint32_t n_rot = 0;       // rotated dimensions per head
  bool rope_neox = false;        // NeoX pairing (x[i], x[i+n_rot/2]) instead of adjacent pairs

  // Mixture of experts (n_expert == 0: a dense FFN).
  std::uint32_t n_expert = 0;
  std::uint32_t n_expert_used = 0;
  std::uint32_t n_ff_expert = 0;     // each expert's FFN width
  bool expert_weights_norm = false;  // SoftmaxThenTopK: renormalise the chosen weights to sum 1

  // Sliding-window attention: a local layer's token at position p sees positions (p - window, p].
  std::uint32_t sliding_window = 0;  // 0: none
  float swa_rope_base = 0.0f;        // RoPE base of local layers (0: rope_freq_base, with its scaling)
  float attn_softcap = 0.0f;         // attention logits: cap * tanh(s / cap); 0: none
  float final_softcap = 0.0f;        // output logits likewise

  std::uint32_t q_dim() const { return n_head * head_dim; }
  std::uint32_t kv_dim() const { return n_head_kv * head_dim; }
  bool is_moe() const { return n_expert > 0; }
  // Whether layer il attends within the sliding window only.
  bool layer_is_local(std::size_t il) const {
    if (sliding_window == 0 || desc->swa_pattern == 0) return false;
    const std::uint32_t n = desc->swa_pattern;
    return n == 1 || il % n < n - 1;
  }
  // Parameters a token's forward pass reads (MoE: the routed experts only), for bench/metrics.
  std::uint64_t active_parameters() const;
  // Bytes of KV cache a token's attention reads when it sees `positions` positions (itself
  // included; fractional for a mean over steps): every layer's keys and values, a local layer's
  // within its window. row_bytes: a position's keys (or values) in one layer, as the cache stores
  // them (kv_row_bytes). What a decode step reads besides the weights.
  double kv_bytes_read(double positions, std::size_t row_bytes) const;

  // Throws Error naming the missing or inconsistent key.
  static ModelConfig from_gguf(const gguf::File& file);
};

}  // namespace promptly
