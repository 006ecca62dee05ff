#include "kernels/matmul.h"

#include <algorithm>
#include <vector>

#include "tensor/quant.h"

namespace promptly::kernels {

float dot_f32(const float* a, const float* b, std::size_t n) {
  // Eight independent partial sums let the compiler vectorize without -ffast-math.
  float acc[8] = {};
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    for (int k = 0; k < 8; ++k) acc[k] += a[i + k] * b[i + k];
  }
  float sum = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
  for (; i < n; ++i) sum += a[i] * b[i];
  return sum;
}

void matmul(const WeightMatrix& w, const float* x, std::size_t n_tokens, float* y, ThreadPool& pool) {
  // Waking a thread costs microseconds, so each share gets at least ~64K multiply-adds; small
  // matrices (tiny models, single tokens) run on the calling thread alone.
  constexpr std::size_t kMinMacsPerShare = 1 << 16;
  const std::size_t grain = std::max<std::size_t>(16, kMinMacsPerShare / std::max<std::size_t>(1, w.cols * n_tokens));
  pool.parallel_for(w.rows, grain, [&](std::size_t begin, std::size_t end, int) {
    thread_local std::vector<float> row_buf;
    if (w.type != DType::F32) row_buf.resize(w.cols);
    for (std::size_t r = begin; r < end; ++r) {
      const float* row;
      if (w.type == DType::F32) {
        row = reinterpret_cast<const float*>(w.row(r));
      } else {
        dequantize_row(w.type, w.row(r), row_buf.data(), w.cols);
        row = row_buf.data();
      }
      for (std::size_t t = 0; t < n_tokens; ++t) y[t * w.rows + r] = dot_f32(row, x + t * w.cols, w.cols);
    }
  });
}

}  // namespace promptly::kernels
