#include "model/config.h"

#include <algorithm>

#include "util/error.h"

namespace promptly {
namespace {

std::uint32_t required_u32(const gguf::File& f, const std::string& key) {
  const auto v = f.get_int(key);
  if (!v) throw Error("model '" + f.path() + "' lacks metadata key '" + key + "'");
  if (*v <= 0 || *v > (1 << 30)) throw Error("model '" + f.path() + "': '" + key + "' = " + std::to_string(*v) + " is out of range");
  return static_cast<std::uint32_t>(*v);
}

std::uint32_t optional_u32(const gguf::File& f, const std::string& key, std::uint32_t fallback) {
  return f.has(key) ? required_u32(f, key) : fallback;
}

}  // namespace

ModelConfig ModelConfig::from_gguf(const gguf::File& f) {
  ModelConfig c;
  const auto arch = f.get_string("general.architecture");
  if (!arch) throw Error("model '" + f.path() + "' lacks 'general.architecture'");
  c.arch = *arch;
  c.desc = arch::find(c.arch);
  if (!c.desc) {
    throw Error("model '" + f.path() + "': unsupported architecture '" + c.arch + "'; supported: " + arch::supported_list());
  }
  const arch::Arch& d = *c.desc;
  c.name = f.get_string("general.name").value_or("");
  const std::string p = c.arch + ".";
  c.n_embd = required_u32(f, p + "embedding_length");
  c.n_layer = required_u32(f, p + "block_count");
  c.n_head = required_u32(f, p + "attention.head_count");
  c.n_head_kv = optional_u32(f, p + "attention.head_count_kv", c.n_head);
  c.n_ctx_train = optional_u32(f, p + "context_length", 2048);
  c.head_dim = optional_u32(f, p + "attention.key_length", c.n_embd / c.n_head);
  if (f.has(p + "attention.value_length") && required_u32(f, p + "attention.value_length") != c.head_dim) {
    throw Error("model '" + f.path() + "': key and value head sizes differ, which is not supported");
  }
  if (c.n_head % c.n_head_kv != 0) {
    throw Error("model '" + f.path() + "': head_count " + std::to_string(c.n_head) + " is not a multiple of head_count_kv " +
                std::to_string(c.n_head_kv));
  }
  c.n_rot = optional_u32(f, p + "rope.dimension_count", c.head_dim);
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
  } else if (scaling != "none" && scaling != "llama3" && scaling != "longrope") {
    // llama3 scaling arrives as the rope_freqs.weight tensor, LongRoPE's as rope_factors_short/long,
    // applied by the model.
    throw Error("model '" + f.path() + "': rope scaling type '" + scaling +
                "' is not supported (supported: none, linear, llama3, longrope)");
  }
  c.rope_attn_factor = static_cast<float>(f.get_double(p + "rope.scaling.attn_factor").value_or(1.0));
  const std::int64_t orig_ctx = f.get_int(p + "rope.scaling.original_context_length").value_or(0);
  if (orig_ctx < 0 || orig_ctx > (std::int64_t{1} << 31)) throw Error("model '" + f.path() + "': rope.scaling.original_context_length is out of range");
  c.rope_orig_ctx = static_cast<std::uint32_t>(orig_ctx);
  if (!(c.rope_attn_factor > 0.0f)) throw Error("model '" + f.path() + "': rope.scaling.attn_factor must be positive");
  c.rope_neox = d.rope_neox;

  // The FFN: dense, or experts when the file says so (Mixtral is a llama with expert_count).
  const std::int64_t n_expert = f.get_int(p + "expert_count").value_or(0);  // dense files may say 0
  if (n_expert < 0 || n_expert > 65536) {
    throw Error("model '" + f.path() + "': '" + p + "expert_count' = " + std::to_string(n_expert) + " is out of range");
  }
  c.n_expert = static_cast<std::uint32_t>(n_expert);
  if (d.experts_required && c.n_expert == 0) throw Error("model '" + f.path() + "' lacks metadata key '" + p + "expert_count'");
  if (c.n_expert > 0) {
    c.n_expert_used = required_u32(f, p + "expert_used_count");
    if (c.n_expert_used > c.n_expert) {
      throw Error("model '" + f.path() + "': expert_used_count " + std::to_string(c.n_expert_used) + " exceeds expert_count " +
                  std::to_string(c.n_expert));
    }
    c.n_ff_expert = f.has(p + "expert_feed_forward_length") ? required_u32(f, p + "expert_feed_forward_length")
                                                            : required_u32(f, p + "feed_forward_length");
    c.n_ff = optional_u32(f, p + "feed_forward_length", c.n_ff_expert);
    c.expert_weights_norm = d.router == arch::Router::SoftmaxThenTopK && f.get_bool(p + "expert_weights_norm").value_or(true);
  } else {
    c.n_ff = required_u32(f, p + "feed_forward_length");
  }

  if (d.swa_pattern > 0) c.sliding_window = optional_u32(f, p + "attention.sliding_window", 0);
  if (c.sliding_window > 0 && d.swa_rope_base > 0) {
    c.swa_rope_base = static_cast<float>(f.get_double(p + "rope.freq_base_swa").value_or(d.swa_rope_base));
  }
  if (d.softcap) {
    c.attn_softcap = static_cast<float>(f.get_double(p + "attn_logit_softcapping").value_or(0.0));
    c.final_softcap = static_cast<float>(f.get_double(p + "final_logit_softcapping").value_or(0.0));
    if (c.attn_softcap < 0 || c.final_softcap < 0) throw Error("model '" + f.path() + "': soft-capping values must be positive");
  }
  return c;
}

std::uint64_t ModelConfig::active_parameters() const {
  const std::uint64_t D = n_embd;
  const std::uint64_t attention = D * (q_dim() + 2ull * kv_dim()) + static_cast<std::uint64_t>(q_dim()) * D;
  const std::uint64_t ffn = is_moe() ? D * n_expert + 3ull * D * n_ff_expert * n_expert_used : 3ull * D * n_ff;
  return n_layer * (attention + ffn) + D * n_vocab;  // the output projection; the embedding is one row read
}

double ModelConfig::kv_bytes_read(double positions, std::size_t row_bytes) const {
  double seen = 0;
  for (std::size_t il = 0; il < n_layer; ++il) seen += layer_is_local(il) ? std::min(positions, static_cast<double>(sliding_window)) : positions;
  return seen * 2.0 * static_cast<double>(row_bytes);  // keys and values
}

}  // namespace promptly
