#pragma once
// cuBLAS, opened at run time: the binary links only the CUDA runtime statically, so it starts on
// machines without the toolkit's libraries and fails with a clear message only when a GPU pass
// needs cuBLAS and cannot find it.
#include <cublas_v2.h>

namespace promptly::backend::cuda {

// The entry points used, by their C names (cublasGemmEx is overloaded in C++, so spelled out).
struct CublasApi {
  cublasStatus_t (*create)(cublasHandle_t*);
  cublasStatus_t (*destroy)(cublasHandle_t);
  cublasStatus_t (*set_stream)(cublasHandle_t, cudaStream_t);
  cublasStatus_t (*gemm_ex)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int m, int n, int k, const void* alpha, const void* a,
                            cudaDataType a_type, int lda, const void* b, cudaDataType b_type, int ldb, const void* beta, void* c,
                            cudaDataType c_type, int ldc, cublasComputeType_t compute, cublasGemmAlgo_t algo);
  const char* (*status_string)(cublasStatus_t);
};

// Loads libcublas.so.13 (or .so) once; throws Error naming the library when it is missing.
const CublasApi& cublas();

}  // namespace promptly::backend::cuda
