// The reference path: plain C++ with no ISA assumptions. Every fast path is tested against it.
#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/dispatch.h"
#include "util/fp16.h"

namespace promptly::kernels {
namespace {

void quantize_q8_0(const float* x, BlockQ8_0* y, float* sums, std::size_t n) {
  for (std::size_t b = 0; b < n / kQK8_0; ++b, x += kQK8_0) {
    float amax = 0.0f;
    for (int j = 0; j < kQK8_0; ++j) amax = std::max(amax, std::fabs(x[j]));
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    y[b].d = fp32_to_fp16(d);
    int sum = 0;
    for (int j = 0; j < kQK8_0; ++j) {
      y[b].qs[j] = static_cast<std::int8_t>(std::lrintf(x[j] * id));
      sum += y[b].qs[j];
    }
    sums[b] = fp16_to_fp32(y[b].d) * static_cast<float>(sum);
  }
}

void gemm_q8_0(const std::uint8_t* w, std::size_t w_stride, std::size_t r0, std::size_t r1, const QuantizedRows& x,
               std::size_t n_tokens, float* y, std::size_t ldy) {
  for (std::size_t r = r0; r < r1; ++r) {
    const auto* wb = reinterpret_cast<const BlockQ8_0*>(w + r * w_stride);
    for (std::size_t t = 0; t < n_tokens; ++t) {
      const BlockQ8_0* xb = x.blocks + t * x.n_blocks;
      float acc = 0.0f;
      for (std::size_t b = 0; b < x.n_blocks; ++b) {
        int dot = 0;
        for (int j = 0; j < kQK8_0; ++j) dot += wb[b].qs[j] * xb[b].qs[j];
        acc += fp16_to_fp32(wb[b].d) * fp16_to_fp32(xb[b].d) * static_cast<float>(dot);
      }
      y[t * ldy + r] = acc;
    }
  }
}

void gemm_q4_0(const std::uint8_t* w, std::size_t w_stride, std::size_t r0, std::size_t r1, const QuantizedRows& x,
               std::size_t n_tokens, float* y, std::size_t ldy) {
  for (std::size_t r = r0; r < r1; ++r) {
    const auto* wb = reinterpret_cast<const BlockQ4_0*>(w + r * w_stride);
    for (std::size_t t = 0; t < n_tokens; ++t) {
      const BlockQ8_0* xb = x.blocks + t * x.n_blocks;
      float acc = 0.0f;
      for (std::size_t b = 0; b < x.n_blocks; ++b) {
        int dot = 0;
        for (int j = 0; j < kQK4_0 / 2; ++j) {
          dot += ((wb[b].qs[j] & 0xf) - 8) * xb[b].qs[j];
          dot += ((wb[b].qs[j] >> 4) - 8) * xb[b].qs[j + kQK4_0 / 2];
        }
        acc += fp16_to_fp32(wb[b].d) * fp16_to_fp32(xb[b].d) * static_cast<float>(dot);
      }
      y[t * ldy + r] = acc;
    }
  }
}

float dot_f32(const float* a, const float* b, std::size_t n) {
  float acc[8] = {};
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int k = 0; k < 8; ++k) acc[k] += a[i + k] * b[i + k];
  float sum = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
  for (; i < n; ++i) sum += a[i] * b[i];
  return sum;
}

void gemm_f32(const std::uint8_t* w, std::size_t w_stride, std::size_t r0, std::size_t r1, const float* x, std::size_t k,
              std::size_t n_tokens, float* y, std::size_t ldy) {
  for (std::size_t r = r0; r < r1; ++r) {
    const auto* row = reinterpret_cast<const float*>(w + r * w_stride);
    for (std::size_t t = 0; t < n_tokens; ++t) y[t * ldy + r] = dot_f32(row, x + t * k, k);
  }
}

void gemm_f16(const std::uint8_t* w, std::size_t w_stride, std::size_t r0, std::size_t r1, const float* x, std::size_t k,
              std::size_t n_tokens, float* y, std::size_t ldy) {
  std::vector<float> row(k);
  for (std::size_t r = r0; r < r1; ++r) {
    const auto* h = reinterpret_cast<const std::uint16_t*>(w + r * w_stride);
    for (std::size_t i = 0; i < k; ++i) row[i] = fp16_to_fp32(h[i]);
    for (std::size_t t = 0; t < n_tokens; ++t) y[t * ldy + r] = dot_f32(row.data(), x + t * k, k);
  }
}

}  // namespace

const KernelTable& scalar_kernels() {
  static const KernelTable table{"scalar", quantize_q8_0, gemm_q8_0, gemm_q4_0, gemm_f16, gemm_f32, dot_f32};
  return table;
}

const KernelTable& kernel_table(Isa isa) {
  switch (isa) {
    case Isa::Avx512: return avx512_kernels();
    case Isa::Avx2: return avx2_kernels();
    default: return scalar_kernels();
  }
}

}  // namespace promptly::kernels
