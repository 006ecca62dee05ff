#include "util/cpu_features.h"

#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>

namespace promptly {
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
  const bool avx_cpu = c & bit_AVX;
  f.fma = c & bit_FMA;
  f.f16c = c & bit_F16C;
  if (!osxsave) return f;
  unsigned xcr0_lo, xcr0_hi;
  __asm__("xgetbv" : "=a"(xcr0_lo), "=d"(xcr0_hi) : "c"(0));
  const bool ymm_state = (xcr0_lo & 0x6) == 0x6;           // the OS saves SSE and AVX registers
  f.avx = ymm_state && avx_cpu;
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

}  // namespace

const CpuFeatures& cpu_features() {
  static const CpuFeatures f = detect();
  return f;
}

}  // namespace promptly
