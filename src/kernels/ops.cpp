#include "kernels/ops.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/cpu.h"
#include "kernels/dispatch.h"
#include "tensor/quant.h"
#include "util/fp16.h"

namespace promptly::kernels {

void rmsnorm(const float* x, const float* weight, std::size_t n, float eps, float* out) {
  double sum = 0.0;  // double: the mean of squares over thousands of values loses bits in float
  for (std::size_t i = 0; i < n; ++i) sum += static_cast<double>(x[i]) * x[i];
  const float scale = static_cast<float>(1.0 / std::sqrt(sum / static_cast<double>(n) + eps));
  for (std::size_t i = 0; i < n; ++i) out[i] = x[i] * scale * weight[i];
}

void gelu_tanh_mul(float* gate, const float* up, std::size_t n) { kernel_table(active_isa()).gelu_tanh_mul(gate, up, n); }

namespace {

// One cached row (head_dim values from element `at` of a block) as floats: F32 in place, F16 and
// Q8_0 (whole blocks: `at` and head_dim multiples of 32) through tensor's row conversion.
const float* kv_row(const void* block, DType type, std::size_t at, std::size_t head_dim, float* buffer) {
  switch (type) {
    case DType::F16:
      dequantize_row(type, static_cast<const std::uint8_t*>(block) + at * sizeof(std::uint16_t), buffer, head_dim);
      return buffer;
    case DType::Q8_0:
      if (at % kQK8_0 == 0 && head_dim % kQK8_0 == 0) {
        dequantize_row(type, static_cast<const std::uint8_t*>(block) + at / kQK8_0 * sizeof(BlockQ8_0), buffer, head_dim);
      } else {
        const auto* b = static_cast<const BlockQ8_0*>(block);
        for (std::size_t i = 0; i < head_dim; ++i) {
          const std::size_t e = at + i;
          buffer[i] = fp16_to_fp32(b[e / kQK8_0].d) * static_cast<float>(b[e / kQK8_0].qs[e % kQK8_0]);
        }
      }
      return buffer;
    default: return static_cast<const float*>(block) + at;
  }
}

}  // namespace

void attention_range(const float* q, const void* const* k_blocks, const void* const* v_blocks, DType kv_type,
                     std::size_t block_tokens, std::size_t stride, std::size_t offset, std::size_t first, std::size_t n_ctx,
                     std::size_t head_dim, float scale, float softcap, float* out, float* lse) {
  thread_local std::vector<float> k_buffer, v_buffer;
  k_buffer.resize(head_dim);
  v_buffer.resize(head_dim);
  const KernelTable& kt = kernel_table(active_isa());
  float m = -INFINITY, l = 0.0f;
  std::fill_n(out, head_dim, 0.0f);
  for (std::size_t j = first; j < n_ctx; ++j) {
    const std::size_t at = (j % block_tokens) * stride + offset;
    float s = kt.dot_f32(q, kv_row(k_blocks[j / block_tokens], kv_type, at, head_dim, k_buffer.data()), head_dim) * scale;
    if (softcap > 0.0f) s = softcap * std::tanh(s / softcap);
    if (s > m) {
      const float correction = std::exp(m - s);  // exp(-inf) = 0 on the first position
      for (std::size_t i = 0; i < head_dim; ++i) out[i] *= correction;
      l *= correction;
      m = s;
    }
    const float p = std::exp(s - m);
    l += p;
    const float* v = kv_row(v_blocks[j / block_tokens], kv_type, at, head_dim, v_buffer.data());
    for (std::size_t i = 0; i < head_dim; ++i) out[i] += p * v[i];
  }
  const float inv = l > 0.0f ? 1.0f / l : 0.0f;
  for (std::size_t i = 0; i < head_dim; ++i) out[i] *= inv;
  if (lse) *lse = l > 0.0f ? m + std::log(l) : -INFINITY;
}

void rope_angles(std::size_t n_rot, const float* inv_freq, float position, float* cos, float* sin) {
  for (std::size_t i = 0; i < n_rot / 2; ++i) {
    const float theta = position * inv_freq[i];
    cos[i] = std::cos(theta);
    sin[i] = std::sin(theta);
  }
}

void rope(float* x, std::size_t n_rot, const float* cos, const float* sin, bool neox) {
  const std::size_t half = n_rot / 2;
  for (std::size_t i = 0; i < half; ++i) {
    const std::size_t a = neox ? i : 2 * i;
    const std::size_t b = neox ? i + half : 2 * i + 1;
    const float x0 = x[a], x1 = x[b];
    x[a] = x0 * cos[i] - x1 * sin[i];
    x[b] = x0 * sin[i] + x1 * cos[i];
  }
}

void silu_mul(float* gate, const float* up, std::size_t n) { kernel_table(active_isa()).silu_mul(gate, up, n); }

void prefetch_kv(const void* const* k_blocks, const void* const* v_blocks, std::size_t n_rows, std::size_t block_tokens,
                 std::size_t stride, std::size_t offset, std::size_t head_dim, DType type) {
  n_rows = std::min(n_rows, kPrefetchKvRows);
  constexpr std::size_t kLine = 64;
  // A block's rows of this head, first element to last (one contiguous run in the head-major layout).
  const auto end_of_rows = [&](std::size_t rows) { return row_bytes(type, offset + (rows - 1) * stride + head_dim); };
  const std::size_t begin = row_bytes(type, offset) / kLine * kLine, full_end = end_of_rows(block_tokens);
  for (std::size_t row0 = 0, blk = 0; row0 < n_rows; row0 += block_tokens, ++blk) {
    const std::size_t end = n_rows - row0 >= block_tokens ? full_end : end_of_rows(n_rows - row0);
    for (const void* block : {k_blocks[blk], v_blocks[blk]}) {
      const char* base = static_cast<const char*>(block);
      for (std::size_t b = begin; b < end; b += kLine) __builtin_prefetch(base + b, 0, 3);
    }
  }
}

}  // namespace promptly::kernels
