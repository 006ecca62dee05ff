#include "backend/cuda/cublas_loader.h"

#include <dlfcn.h>

#include <mutex>
#include <string>

#include "util/error.h"

namespace promptly::backend::cuda {
namespace {

template <typename Fn>
void bind(void* lib, const char* name, Fn& fn) {
  fn = reinterpret_cast<Fn>(dlsym(lib, name));
  if (!fn) throw Error(std::string("cuBLAS: the library lacks ") + name + " (a cuBLAS of CUDA 12 or 13 is needed)");
}

}  // namespace

const CublasApi& cublas() {
  static std::once_flag once;
  static CublasApi api{};
  static std::string failure;
  std::call_once(once, [] {
    void* lib = nullptr;
    for (const char* name : {"libcublas.so.13", "libcublas.so.12", "libcublas.so", "/usr/local/cuda/lib64/libcublas.so"}) {
      if ((lib = dlopen(name, RTLD_NOW | RTLD_LOCAL))) break;
    }
    if (!lib) {
      failure = "cuBLAS (libcublas.so) could not be loaded: install the CUDA toolkit's cuBLAS or add its folder to LD_LIBRARY_PATH";
      return;
    }
    try {
      bind(lib, "cublasCreate_v2", api.create);
      bind(lib, "cublasDestroy_v2", api.destroy);
      bind(lib, "cublasSetStream_v2", api.set_stream);
      bind(lib, "cublasGemmEx", api.gemm_ex);
      bind(lib, "cublasGetStatusString", api.status_string);
    } catch (const Error& e) {
      failure = e.what();
    }
  });
  if (!failure.empty()) throw Error(failure);
  return api;
}

}  // namespace promptly::backend::cuda
