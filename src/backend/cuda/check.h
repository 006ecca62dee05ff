#pragma once
// CUDA and cuBLAS failures as promptly::Error, naming the call and the runtime's reason.
#include <cuda_runtime.h>

#include <string>

#include "util/error.h"

namespace promptly::backend::cuda {

inline void check(cudaError_t status, const char* what) {
  if (status != cudaSuccess) throw Error(std::string("CUDA: ") + what + " failed: " + cudaGetErrorString(status));
}

}  // namespace promptly::backend::cuda

#define PROMPTLY_CUDA_CHECK(call) ::promptly::backend::cuda::check((call), #call)
