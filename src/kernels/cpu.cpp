#include "kernels/cpu.h"

#include <atomic>
#include <cstdlib>

#include "util/error.h"

namespace promptly::kernels {
namespace {

bool supports(Isa isa) {
  const CpuFeatures& f = cpu_features();
  switch (isa) {
    case Isa::Scalar: return true;
    case Isa::Avx2: return f.avx2 && f.fma && f.f16c;
    case Isa::Avx512: return f.avx2 && f.fma && f.f16c && f.avx512f && f.avx512bw && f.avx512vl && f.avx512vnni;
    case Isa::Amx: return supports(Isa::Avx512) && f.amx_int8;
  }
  return false;
}

Isa initial_isa() {
  if (const char* env = std::getenv("PROMPTLY_ISA"); env && *env) {
    const Isa want = parse_isa(env);
    if (!supports(want)) throw Error(std::string("PROMPTLY_ISA=") + env + " but this CPU lacks it");
    return want;
  }
  return best_isa();
}

std::atomic<int>& isa_slot() {
  static std::atomic<int> slot{static_cast<int>(initial_isa())};
  return slot;
}

}  // namespace


const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::Scalar: return "scalar";
    case Isa::Avx2: return "avx2";
    case Isa::Avx512: return "avx512";
    case Isa::Amx: return "amx";
  }
  return "?";
}

Isa best_isa() {
  if (supports(Isa::Amx)) return Isa::Amx;
  if (supports(Isa::Avx512)) return Isa::Avx512;
  if (supports(Isa::Avx2)) return Isa::Avx2;
  return Isa::Scalar;
}

Isa active_isa() { return static_cast<Isa>(isa_slot().load(std::memory_order_relaxed)); }

void set_isa(Isa isa) {
  if (!supports(isa)) throw Error(std::string("this CPU does not support the ") + isa_name(isa) + " kernels");
  isa_slot().store(static_cast<int>(isa), std::memory_order_relaxed);
}

Isa parse_isa(const std::string& name) {
  if (name == "scalar") return Isa::Scalar;
  if (name == "avx2") return Isa::Avx2;
  if (name == "avx512") return Isa::Avx512;
  if (name == "amx") return Isa::Amx;
  throw Error("unknown kernel path '" + name + "'; valid: scalar, avx2, avx512, amx");
}

}  // namespace promptly::kernels
