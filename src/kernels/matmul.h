#pragma once
// Matrix multiplication against weights in their stored type. A weight matrix is ggml-shaped:
// `rows` output features, each a contiguous row of `cols` input features.
#include <cstddef>
#include <cstdint>
#include <vector>

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

// The input of one or more matmuls: n_tokens rows of k floats. Integer kernels need it quantized to
// Q8_0; that happens once, on first use, and is shared by every matmul that reads the same input
// (q/k/v, gate/up).
class Activations {
 public:
  Activations(const float* x, std::size_t n_tokens, std::size_t k) : x_(x), n_tokens_(n_tokens), k_(k) {}

  const float* data() const { return x_; }
  std::size_t n_tokens() const { return n_tokens_; }
  std::size_t k() const { return k_; }

  // Q8_0 blocks (and d * sum per block) of every token; computed on first call.
  void quantize(ThreadPool& pool);
  const BlockQ8_0* q8() const { return q8_.data(); }
  const float* q8_sums() const { return sums_.data(); }
  bool quantized() const { return quantized_; }

 private:
  const float* x_;
  std::size_t n_tokens_, k_;
  bool quantized_ = false;
  std::vector<BlockQ8_0> q8_;
  std::vector<float> sums_;
};

// y[t * w.rows + r] = dot(w.row(r), token t) for every token. Each weight row is read once per call
// whatever the number of tokens: a batch of sequences or a prefill chunk costs one pass over the
// weights. Uses the kernel path of kernels::active_isa().
void matmul(const WeightMatrix& w, Activations& x, float* y, ThreadPool& pool);

// Convenience for a one-off input.
void matmul(const WeightMatrix& w, const float* x, std::size_t n_tokens, float* y, ThreadPool& pool);

float dot_f32(const float* a, const float* b, std::size_t n);

}  // namespace promptly::kernels
