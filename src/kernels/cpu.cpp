#include "kernels/cpu.h"

#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>

#include "util/error.h"

namespace promptly::kernels {
namespace {

// Linux hands out the 8 KiB of AMX tile state only to processes that ask for it (once, for all
// threads); without the permission the first tile instruction faults.
bool request_amx_permission() {
#if defined(__linux__) && defined(SYS_arch_prctl)
  constexpr long kReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
  return syscall(SYS_arch_prctl, kReqXcompPerm, kXfeatureXtiledata) == 0;
#else
  return false;
#endif
}

CpuFeatures detect() {
  CpuFeatures f;
  unsigned a, b, c, d;
  if (!__get_cpuid(1, &a, &b, &c, &d)) return f;
  const bool osxsave = c & bit_OSXSAVE;
  f.fma = c & bit_FMA;
  f.f16c = c & bit_F16C;
  if (!osxsave) return f;
  unsigned xcr0_lo, xcr0_hi;
  __asm__("xgetbv" : "=a"(xcr0_lo), "=d"(xcr0_hi) : "c"(0));
  const bool ymm_state = (xcr0_lo & 0x6) == 0x6;           // the OS saves SSE and AVX registers
  const bool zmm_state = (xcr0_lo & 0xe6) == 0xe6;         // ... and the AVX-512 ones
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return f;
  f.avx2 = ymm_state && (b & bit_AVX2);
  f.avx512f = zmm_state && (b & bit_AVX512F);
  f.avx512bw = zmm_state && (b & bit_AVX512BW);
  f.avx512vl = zmm_state && (b & bit_AVX512VL);
  f.avx512vnni = zmm_state && (c & bit_AVX512VNNI);
  const bool amx_cpu = (d & (1u << 24)) && (d & (1u << 25));  // AMX-TILE, AMX-INT8
  const bool amx_state = (xcr0_lo & (3u << 17)) == (3u << 17);  // XTILECFG, XTILEDATA
  if (__get_cpuid_count(7, 1, &a, &b, &c, &d)) f.avx512bf16 = zmm_state && (a & bit_AVX512BF16);
  f.amx_int8 = amx_cpu && amx_state && request_amx_permission();
  return f;
}

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

const CpuFeatures& cpu_features() {
  static const CpuFeatures f = detect();
  return f;
}

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
