#pragma once
// general.file_type values (llama.cpp's LLAMA_FTYPE numbering), so other tools describe our files right.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "tensor/dtype.h"

namespace promptly {

std::uint32_t file_type_for(DType dominant);
constexpr std::uint32_t kFileTypeQ4_K_M = 15;

// The layer a tensor name belongs to ("blk.N."), or -1.
int layer_of(const std::string& name);

// The type matrix `name` (rows of `cols` elements) gets in a model quantized to `base`, as llama.cpp
// mixes them: the output matrix (output.weight; token_embd.weight when there is no output matrix,
// has_output false) Q6_K in every quantized type but Q8_0; with q4_k_m (base Q4_K), also attn_v and
// ffn_down(_exps) Q6_K in the layers that get more bits (the first and last eighth of n_layers and
// every third between); rows that do not divide into the type's blocks fall back to Q8_0, else F16.
DType quantized_matrix_type(DType base, bool q4_k_m, const std::string& name, std::size_t cols, int n_layers, bool has_output);

}  // namespace promptly
