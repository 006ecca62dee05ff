#include "backend/cuda/runtime.h"

#include <cuda_runtime.h>

#include <cstdio>

namespace promptly::backend::cuda {

int device_count(std::string& error) {
  int n = 0;
  const cudaError_t status = cudaGetDeviceCount(&n);
  if (status != cudaSuccess) {
    // Without a driver the runtime answers "driver version is insufficient": say what it means.
    const bool no_driver = status == cudaErrorInsufficientDriver || status == cudaErrorNoDevice;
    error = std::string(no_driver ? "no NVIDIA driver or GPU found; the CUDA runtime says: " : "") + cudaGetErrorString(status);
    cudaGetLastError();  // the runtime keeps the error otherwise
    return 0;
  }
  return n;
}

std::vector<std::string> describe_devices() {
  std::string error;
  const int n = device_count(error);
  if (n == 0) return {"no CUDA devices: " + (error.empty() ? std::string("none found") : error)};
  std::vector<std::string> lines;
  for (int i = 0; i < n; ++i) {
    cudaDeviceProp p{};
    if (cudaGetDeviceProperties(&p, i) != cudaSuccess) {
      lines.push_back("cuda:" + std::to_string(i) + " (properties unreadable)");
      continue;
    }
    char gib[32];
    std::snprintf(gib, sizeof gib, "%.1f", static_cast<double>(p.totalGlobalMem) / (1u << 30));
    lines.push_back("cuda:" + std::to_string(i) + " " + p.name + ", " + gib + " GiB, compute " + std::to_string(p.major) + "." +
                    std::to_string(p.minor) + ", " + std::to_string(p.multiProcessorCount) + " multiprocessors, " +
                    std::to_string(p.l2CacheSize >> 20) + " MiB L2");
  }
  return lines;
}

}  // namespace promptly::backend::cuda
