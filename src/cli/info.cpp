#include <cstdio>
#include <map>
#include <memory>

#include "cli/commands.h"
#include "model/builtin_model.h"
#include "gguf/gguf.h"
#include "model/config.h"
#include "tokenizer/vocab.h"
#include "util/error.h"

namespace promptly::cli {

int info(const InfoOptions& o) {
  std::shared_ptr<const gguf::File> f = open_model_file(o.model);
  std::printf("file:          %s (%.2f MB, GGUF v%u, %zu metadata keys, %zu tensors, alignment %u)\n", f->path().c_str(),
              static_cast<double>(f->file_size()) / 1e6, f->version(), f->metadata().size(), f->tensors().size(), f->alignment());
  if (auto name = f->get_string("general.name")) std::printf("name:          %s\n", name->c_str());
  const std::string arch = f->get_string("general.architecture").value_or("(none)");
  std::printf("architecture:  %s\n", arch.c_str());
  if (!f->tensors().empty()) {
    try {
      const ModelConfig c = ModelConfig::from_gguf(*f);
      std::printf("shape:         %u layers, %u wide, %u heads (%u KV heads, head dim %u), ffn %u, context %u\n", c.n_layer,
                  c.n_embd, c.n_head, c.n_head_kv, c.head_dim, c.n_ff, c.n_ctx_train);
      std::printf("rope:          %s, %u dims, base %g, scale %g\n", c.rope_neox ? "neox" : "normal", c.n_rot, c.rope_freq_base,
                  c.rope_freq_scale);
      if (c.is_moe()) {
        std::printf("experts:       %u, %u per token, ffn %u each (%.1f M parameters active per token)\n", c.n_expert,
                    c.n_expert_used, c.n_ff_expert, static_cast<double>(c.active_parameters()) / 1e6);
      }
      if (c.sliding_window > 0) {
        std::size_t local = 0;
        for (std::size_t il = 0; il < c.n_layer; ++il) local += c.layer_is_local(il) ? 1 : 0;
        std::printf("attention:     sliding window %u on %zu of %u layers", c.sliding_window, local, c.n_layer);
        if (c.swa_rope_base > 0) std::printf(" (their rope base %g)", c.swa_rope_base);
        std::printf("\n");
      }
      if (c.attn_softcap > 0 || c.final_softcap > 0) {
        std::printf("soft-capping:  attention %g, final logits %g\n", c.attn_softcap, c.final_softcap);
      }
    } catch (const Error& e) {
      std::printf("shape:         not loadable: %s\n", e.what());
    }
  }

  std::map<std::string, std::pair<std::uint64_t, std::uint64_t>> by_type;  // elements, bytes
  std::uint64_t params = 0, bytes = 0;
  for (const auto& t : f->tensors()) {
    auto& e = by_type[std::string(dtype_name(t.type))];
    e.first += t.n_elements;
    e.second += t.n_bytes;
    params += t.n_elements;
    bytes += t.n_bytes;
  }
  if (!f->tensors().empty()) {
    std::printf("parameters:    %.3f M in %.2f MB (%.2f bits per weight)\n", static_cast<double>(params) / 1e6,
                static_cast<double>(bytes) / 1e6, 8.0 * static_cast<double>(bytes) / static_cast<double>(params));
    for (const auto& [name, e] : by_type) {
      std::printf("  %-8s %12.3f M params %10.2f MB%s\n", name.c_str(), static_cast<double>(e.first) / 1e6,
                  static_cast<double>(e.second) / 1e6, dtype_info(*dtype_from_name(name)).supported ? "" : "  (unsupported)");
    }
  }

  try {
    const Vocab v = Vocab::from_gguf(*f);
    std::printf("tokenizer:     %s (pre %s), %zu tokens, bos %d, eos %d, add_bos %s, add_space_prefix %s\n", v.model_name.c_str(),
                v.pre.c_str(), v.size(), v.bos, v.eos, v.add_bos ? "yes" : "no", v.add_space_prefix ? "yes" : "no");
  } catch (const Error& e) {
    std::printf("tokenizer:     not loadable: %s\n", e.what());
  }
  if (auto tmpl = f->get_string("tokenizer.chat_template")) std::printf("chat template: %zu bytes\n", tmpl->size());

  if (o.metadata) {
    std::printf("\nmetadata:\n");
    for (const auto& [key, value] : f->metadata()) {
      std::printf("  %-45s %s\n", key.c_str(), value.to_display_string().c_str());
    }
  }
  if (o.tensors) {
    std::printf("\ntensors:\n");
    for (const auto& t : f->tensors()) {
      std::printf("  %-32s %-6s %-20s %10.3f MB\n", t.name.c_str(), std::string(dtype_name(t.type)).c_str(),
                  t.shape_string().c_str(), static_cast<double>(t.n_bytes) / 1e6);
    }
  }
  return 0;
}

}  // namespace promptly::cli
