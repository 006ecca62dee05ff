#include "convert/file_type.h"

#include <cstdlib>

#include "tensor/quant.h"

namespace promptly {
namespace {

// llama.cpp's rule for which layers get more bits in the _M mixes: the first and last eighth of the
// layers and every third layer in between.
bool use_more_bits(int layer, int n_layers) {
  return layer < n_layers / 8 || layer >= 7 * n_layers / 8 || (layer - n_layers / 8) % 3 == 2;
}

bool every_layer(int, int) { return true; }
bool first_two_layers(int layer, int) { return layer < 2; }
bool first_sixteenth(int layer, int n_layers) { return layer < n_layers / 16; }

// llama.cpp's _M mixes (dense models; its Falcon, 70B and MoE special cases are left out): a matrix
// of the mix over `base` whose name ends with `suffix` gets `type` in the layers `in` picks; the
// first rule that matches wins, and a matrix no rule matches keeps the base type.
struct MixRule {
  DType base;
  const char* suffix;
  bool (*in)(int layer, int n_layers);
  DType type;
};
constexpr MixRule kMixRules[] = {
    {DType::Q3_K, "attn_v.weight", first_two_layers, DType::Q5_K},
    {DType::Q3_K, "attn_v.weight", every_layer, DType::Q4_K},
    {DType::Q3_K, "attn_output.weight", every_layer, DType::Q4_K},
    {DType::Q3_K, "ffn_down.weight", first_sixteenth, DType::Q5_K},
    {DType::Q3_K, "ffn_down.weight", every_layer, DType::Q4_K},
    {DType::Q3_K, "ffn_down_exps.weight", first_sixteenth, DType::Q5_K},
    {DType::Q3_K, "ffn_down_exps.weight", every_layer, DType::Q4_K},
    {DType::Q4_K, "attn_v.weight", use_more_bits, DType::Q6_K},
    {DType::Q4_K, "ffn_down.weight", use_more_bits, DType::Q6_K},
    {DType::Q4_K, "ffn_down_exps.weight", use_more_bits, DType::Q6_K},
    {DType::Q5_K, "attn_v.weight", use_more_bits, DType::Q6_K},
    {DType::Q5_K, "ffn_down.weight", use_more_bits, DType::Q6_K},
    {DType::Q5_K, "ffn_down_exps.weight", use_more_bits, DType::Q6_K},
};

bool has_m_mix(DType base) {
  for (const MixRule& rule : kMixRules) {
    if (rule.base == base) return true;
  }
  return false;
}

}  // namespace

int layer_of(const std::string& name) {
  if (name.rfind("blk.", 0) != 0) return -1;
  return std::atoi(name.c_str() + 4);
}

DType quantized_matrix_type(DType base, bool m_mix, const std::string& name, std::size_t cols, int n_layers, bool has_output) {
  DType type = base;
  const bool quantized = base != DType::F32 && base != DType::F16 && base != DType::BF16;
  const bool is_output = name == "output.weight" || (!has_output && name == "token_embd.weight");
  if (quantized && is_output && base != DType::Q8_0) type = DType::Q6_K;
  for (const MixRule& rule : kMixRules) {
    if (m_mix && rule.base == base && name.ends_with(rule.suffix) && rule.in(layer_of(name), n_layers)) {
      type = rule.type;
      break;
    }
  }
  if (cols % dtype_info(type).block_size != 0) {
    // llama.cpp's choice for IQ4_XS (IQ4_NL: the same levels in 32-element blocks); ours for the rest.
    type = cols % kQK8_0 != 0 ? DType::F16 : type == DType::IQ4_XS ? DType::IQ4_NL : DType::Q8_0;
  }
  return type;
}

std::optional<QuantTarget> parse_quant_target(std::string_view name) {
  const bool m_mix = name.ends_with("_K_M");
  const auto base = dtype_from_name(m_mix ? name.substr(0, name.size() - 2) : name);
  if (!base || !can_quantize_to(*base) || (m_mix && !has_m_mix(*base))) return std::nullopt;
  return QuantTarget{*base, m_mix};
}

std::uint32_t file_type_for(DType dominant, bool m_mix) {
  if (m_mix && dominant == DType::Q3_K) return 12;
  if (m_mix && dominant == DType::Q4_K) return 15;
  if (m_mix && dominant == DType::Q5_K) return 17;
  switch (dominant) {
    case DType::F32: return 0;
    case DType::F16: return 1;
    case DType::Q4_0: return 2;
    case DType::Q8_0: return 7;
    case DType::Q5_0: return 8;
    case DType::Q3_K: return 11;  // Q3_K_S: (nearly) every matrix Q3_K
    case DType::Q4_K: return 14;  // Q4_K_S: every matrix Q4_K
    case DType::Q5_K: return 16;  // Q5_K_S
    case DType::Q6_K: return 18;
    case DType::IQ4_NL: return 25;
    case DType::IQ4_XS: return 30;
    case DType::BF16: return 32;
    default: return 0;
  }
}

}  // namespace promptly
