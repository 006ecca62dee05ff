#pragma once
// Device memory that frees itself, and says how much was free when an allocation fails.
#include <cuda_runtime.h>

#include <cstddef>
#include <string>
#include <utility>

#include "util/error.h"

namespace promptly::backend::cuda {

template <typename T>
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(std::size_t n) { resize(n); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& o) noexcept : p_(std::exchange(o.p_, nullptr)), n_(std::exchange(o.n_, 0)) {}
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    std::swap(p_, o.p_), std::swap(n_, o.n_);
    return *this;
  }
  ~DeviceBuffer() {
    if (p_) cudaFree(p_);
  }
  // Grows (contents lost) to hold at least n; returns whether it moved.
  bool reserve(std::size_t n) {
    if (n <= n_) return false;
    resize(n);
    return true;
  }
  T* get() const { return p_; }
  std::size_t size() const { return n_; }

 private:
  void resize(std::size_t n) {
    if (p_) cudaFree(std::exchange(p_, nullptr));
    n_ = 0;
    if (n == 0) return;
    void* p = nullptr;
    const cudaError_t status = cudaMalloc(&p, n * sizeof(T));
    if (status != cudaSuccess) {
      cudaGetLastError();
      std::size_t free_bytes = 0, total = 0;
      cudaMemGetInfo(&free_bytes, &total);
      throw Error("CUDA: could not allocate " + std::to_string(n * sizeof(T) >> 20) + " MiB on the GPU (" +
                  std::to_string(free_bytes >> 20) + " MiB free of " + std::to_string(total >> 20) + "): " + cudaGetErrorString(status));
    }
    p_ = static_cast<T*>(p);
    n_ = n;
  }
  T* p_ = nullptr;
  std::size_t n_ = 0;
};

}  // namespace promptly::backend::cuda
