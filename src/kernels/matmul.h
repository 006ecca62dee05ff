#pragma once
// Matrix multiplication against weights in their stored type. A weight matrix is ggml-shaped:
// `rows` output features, each a contiguous row of `cols` input features.
#include <cstddef>
#include <cstdint>

#include "tensor/dtype.h"
#include "util/thread_pool.h"

namespace promptly::kernels {

struct WeightMatrix {
  DType type = DType::F32;
  const std::uint8_t* data = nullptr;
  std::size_t rows = 0;
  std::size_t cols = 0;

  std::size_t row_stride() const { return row_bytes(type, cols); }
  const std::uint8_t* row(std::size_t r) const { return data + r * row_stride(); }
};

// y[t * w.rows + r] = dot(w.row(r), x[t * w.cols ...]) for every token t < n_tokens.
// Each weight row is read once per call whatever n_tokens is: a batch of sequences or a prefill
// chunk costs one pass over the weights.
void matmul(const WeightMatrix& w, const float* x, std::size_t n_tokens, float* y, ThreadPool& pool);

float dot_f32(const float* a, const float* b, std::size_t n);

}  // namespace promptly::kernels
