#pragma once
// general.file_type values (llama.cpp's LLAMA_FTYPE numbering), so other tools describe our files right.
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "tensor/dtype.h"

namespace promptly {

// With m_mix (over Q3_K, Q4_K or Q5_K), llama.cpp's numbers for the _M mixes.
std::uint32_t file_type_for(DType dominant, bool m_mix = false);

// What `quantize` and `gen-model` take: a type's name, or Q3_K_M / Q4_K_M / Q5_K_M (the base K-quant with
// llama.cpp's _M mix, see quantized_matrix_type). nullopt for anything else.
struct QuantTarget {
  DType base;
  bool m_mix;
};
std::optional<QuantTarget> parse_quant_target(std::string_view name);
constexpr const char* kQuantTargets = "F32, F16, BF16, Q8_0, Q4_0, Q5_0, Q3_K, Q3_K_M, Q4_K, Q4_K_M, Q5_K, Q5_K_M, Q6_K, IQ4_NL, IQ4_XS";

// The layer a tensor name belongs to ("blk.N."), or -1.
int layer_of(const std::string& name);

// The type matrix `name` (rows of `cols` elements) gets in a model quantized to `base`, as llama.cpp
// mixes them: the output matrix (output.weight; token_embd.weight when there is no output matrix,
// has_output false) Q6_K in every quantized type but Q8_0; with m_mix, llama.cpp's _M mix over base
// (Q4_K_M, Q5_K_M: attn_v and ffn_down(_exps) Q6_K in the layers that get more bits, the first and
// last eighth of n_layers and every third between; Q3_K_M: attn_v Q5_K in the first two layers and
// Q4_K after, attn_output Q4_K, ffn_down Q5_K in the first sixteenth and Q4_K after); rows that do
// not divide into the type's blocks fall back to IQ4_NL from IQ4_XS, as llama.cpp's, to Q8_0 from the
// others, and to F16 where not even 32-element blocks fit.
DType quantized_matrix_type(DType base, bool m_mix, const std::string& name, std::size_t cols, int n_layers, bool has_output);

}  // namespace promptly
