#pragma once
// Model hyper-parameters read from GGUF metadata (`<arch>.*` keys).
#include <cstdint>
#include <string>

#include "gguf/gguf.h"

namespace promptly {

struct ModelConfig {
  std::string arch;            // "llama" or "qwen2"
  std::string name;            // general.name, if any
  std::uint32_t n_vocab = 0;
  std::uint32_t n_ctx_train = 0;
  std::uint32_t n_embd = 0;
  std::uint32_t n_layer = 0;
  std::uint32_t n_head = 0;
  std::uint32_t n_head_kv = 0;
  std::uint32_t head_dim = 0;  // key/value length per head
  std::uint32_t n_ff = 0;
  float rms_eps = 1e-5f;
  float rope_freq_base = 10000.0f;
  float rope_freq_scale = 1.0f;  // linear rope scaling: positions are multiplied by this
  std::uint32_t n_rot = 0;       // rotated dimensions per head
  bool rope_neox = false;        // NeoX pairing (x[i], x[i+n_rot/2]) instead of adjacent pairs

  std::uint32_t q_dim() const { return n_head * head_dim; }
  std::uint32_t kv_dim() const { return n_head_kv * head_dim; }

  // Throws Error naming the missing or inconsistent key.
  static ModelConfig from_gguf(const gguf::File& file);
};

// Architectures `from_gguf` accepts, for error messages.
inline constexpr const char* kSupportedArchitectures = "llama, qwen2";

}  // namespace promptly
