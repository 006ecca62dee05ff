#pragma once
// general.file_type values (llama.cpp's LLAMA_FTYPE numbering), so other tools describe our files right.
#include <cstdint>
#include <string_view>

#include "tensor/dtype.h"

namespace promptly {

std::uint32_t file_type_for(DType dominant);
constexpr std::uint32_t kFileTypeQ4_K_M = 15;

}  // namespace promptly
