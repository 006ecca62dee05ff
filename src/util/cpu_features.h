#pragma once
// What this x86-64 CPU and its OS support (CPUID and XCR0, read once). The kernels choose their
// path from it; the tensor conversions use F16C where it is there.
namespace promptly {

struct CpuFeatures {
  bool avx = false;  // the CPU has AVX and the OS saves the YMM registers
  bool avx2 = false, fma = false, f16c = false;
  bool avx512f = false, avx512bw = false, avx512vl = false, avx512vnni = false, avx512bf16 = false;
  // The CPU has AMX tiles with int8, the OS saves their state, and it let this process use them.
  bool amx_int8 = false;
};

const CpuFeatures& cpu_features();

}  // namespace promptly
