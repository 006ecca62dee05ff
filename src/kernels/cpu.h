#pragma once
// Which instruction sets this CPU has (CPUID, checked once) and which kernel path runs.
#include <string>

#include "util/cpu_features.h"

namespace promptly::kernels {

// Ordered: each path needs everything the one before it needs. Amx = Avx512 plus the AMX tile unit
// for int8 matrix products (prompt-sized batches).
enum class Isa { Scalar = 0, Avx2 = 1, Avx512 = 2, Amx = 3 };

const char* isa_name(Isa isa);
// The best path this CPU supports.
Isa best_isa();
// The path in use: best_isa(), unless PROMPTLY_ISA (scalar|avx2|avx512|amx) or set_isa() chose another.
Isa active_isa();
// Forces a path; throws Error if the CPU lacks it.
void set_isa(Isa isa);
Isa parse_isa(const std::string& name);  // throws Error listing the valid names

}  // namespace promptly::kernels
