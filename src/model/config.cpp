#include "model/config.h"

#include "util/error.h"

namespace promptly {
namespace {

std::uint32_t required_u32(const gguf::File& f, const std::string& key) {
  const auto v = f.get_int(key);
  if (!v) throw Error("model '" + f.path() + "' lacks metadata key '" + key + "'");
  if (*v <= 0 || *v > (1 << 30)) throw Error("model '" + f.path() + "': '" + key + "' = " + std::to_string(*v) + " is out of range");
  return static_cast<std::uint32_t>(*v);
}

}  // namespace

ModelConfig ModelConfig::from_gguf(const gguf::File& f) {
  ModelConfig c;
  const auto arch = f.get_string("general.architecture");
  if (!arch) throw Error("model '" + f.path() + "' lacks 'general.architecture'");
  c.arch = *arch;
  if (c.arch != "llama" && c.arch != "qwen2") {
    throw Error("model '" + f.path() + "': unsupported architecture '" + c.arch + "'; supported: " + kSupportedArchitectures);
  }
  c.name = f.get_string("general.name").value_or("");
  const std::string p = c.arch + ".";
  c.n_embd = required_u32(f, p + "embedding_length");
  c.n_layer = required_u32(f, p + "block_count");
  c.n_ff = required_u32(f, p + "feed_forward_length");
  c.n_head = required_u32(f, p + "attention.head_count");
  c.n_head_kv = f.has(p + "attention.head_count_kv") ? required_u32(f, p + "attention.head_count_kv") : c.n_head;
  c.n_ctx_train = f.has(p + "context_length") ? required_u32(f, p + "context_length") : 2048;
  c.head_dim = f.has(p + "attention.key_length") ? required_u32(f, p + "attention.key_length") : c.n_embd / c.n_head;
  if (f.has(p + "attention.value_length") && required_u32(f, p + "attention.value_length") != c.head_dim) {
    throw Error("model '" + f.path() + "': key and value head sizes differ, which is not supported");
  }
  if (c.n_head % c.n_head_kv != 0) {
    throw Error("model '" + f.path() + "': head_count " + std::to_string(c.n_head) + " is not a multiple of head_count_kv " +
                std::to_string(c.n_head_kv));
  }
  c.n_rot = f.has(p + "rope.dimension_count") ? required_u32(f, p + "rope.dimension_count") : c.head_dim;
  if (c.n_rot > c.head_dim || c.n_rot % 2 != 0) {
    throw Error("model '" + f.path() + "': rope.dimension_count " + std::to_string(c.n_rot) + " does not fit head size " +
                std::to_string(c.head_dim));
  }
  c.rms_eps = static_cast<float>(f.get_double(p + "attention.layer_norm_rms_epsilon").value_or(1e-5));
  c.rope_freq_base = static_cast<float>(f.get_double(p + "rope.freq_base").value_or(10000.0));
  const std::string scaling = f.get_string(p + "rope.scaling.type").value_or("none");
  if (scaling == "linear") {
    const double factor = f.get_double(p + "rope.scaling.factor").value_or(1.0);
    if (factor <= 0) throw Error("model '" + f.path() + "': rope.scaling.factor must be positive");
    c.rope_freq_scale = static_cast<float>(1.0 / factor);
  } else if (scaling != "none" && scaling != "llama3") {
    // llama3 scaling arrives as the rope_freqs.weight tensor, applied by the model.
    throw Error("model '" + f.path() + "': rope scaling type '" + scaling + "' is not supported (supported: none, linear, llama3)");
  }
  c.rope_neox = c.arch == "qwen2";
  return c;
}

}  // namespace promptly
