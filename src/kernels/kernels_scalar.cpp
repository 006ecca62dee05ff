// The reference path: plain C++ with no ISA assumptions. Every fast path is tested against it.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>
#include <vector>

#include "kernels/dispatch.h"
#include "tensor/quant.h"
#include "util/fp16.h"

namespace promptly::kernels {
namespace {

void quantize_activations(const float* x, std::size_t n, const QuantizedToken& out) {
  for (std::size_t b = 0; b < n / kQK8_0; ++b, x += kQK8_0) {
    float amax = 0.0f;
    for (int j = 0; j < kQK8_0; ++j) amax = std::max(amax, std::fabs(x[j]));
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    BlockQ8_0 scratch;
    BlockQ8_0& y = out.blocks ? out.blocks[b] : scratch;
    y.d = fp32_to_fp16(d);
    int half[2] = {0, 0};
    for (int j = 0; j < kQK8_0; ++j) {
      y.qs[j] = static_cast<std::int8_t>(std::lrintf(x[j] * id));
      half[j / 16] += y.qs[j];
    }
    store_activation_block(b, y, fp16_to_fp32(y.d), half[0], half[1], out);
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

// F16 or BF16 weights (`widen` makes one a float).
template <float (*widen)(std::uint16_t)>
void gemm_half(const std::uint8_t* w, std::size_t w_stride, std::size_t r0, std::size_t r1, const float* x, std::size_t k,
               std::size_t n_tokens, float* y, std::size_t ldy) {
  std::vector<float> row(k);
  for (std::size_t r = r0; r < r1; ++r) {
    const auto* h = reinterpret_cast<const std::uint16_t*>(w + r * w_stride);
    for (std::size_t i = 0; i < k; ++i) row[i] = widen(h[i]);
    for (std::size_t t = 0; t < n_tokens; ++t) y[t * ldy + r] = dot_f32(row.data(), x + t * k, k);
  }
}

// The F16x4 / BF16x4 layouts: row r's 16 elements of each step sit at (step * 4 + r % 4) * 16 of its group.
template <float (*widen)(std::uint16_t)>
void gemm_half_x4(const std::uint8_t* w, std::size_t cols, std::size_t r0, std::size_t r1, const float* x, std::size_t n_tokens, float* y,
                  std::size_t ldy) {
  const auto* halves = reinterpret_cast<const std::uint16_t*>(w);
  std::vector<float> row(cols);
  for (std::size_t r = r0; r < r1; ++r) {
    const std::uint16_t* group = halves + r / 4 * 4 * cols;
    for (std::size_t c = 0; c < cols; ++c) row[c] = widen(group[(c / 16 * 4 + r % 4) * 16 + c % 16]);
    for (std::size_t t = 0; t < n_tokens; ++t) y[t * ldy + r] = dot_f32(row.data(), x + t * cols, cols);
  }
}

}  // namespace

void gemm_f16_x4_reference(const std::uint8_t* w, std::size_t cols, std::size_t r0, std::size_t r1, const float* x,
                           std::size_t n_tokens, float* y, std::size_t ldy) {
  gemm_half_x4<fp16_to_fp32>(w, cols, r0, r1, x, n_tokens, y, ldy);
}

void gemm_bf16_x4_reference(const std::uint8_t* w, std::size_t cols, std::size_t r0, std::size_t r1, const float* x,
                            std::size_t n_tokens, float* y, std::size_t ldy) {
  gemm_half_x4<bf16_to_fp32>(w, cols, r0, r1, x, n_tokens, y, ldy);
}

namespace {

template <DType T>
float kv_at(const void* block, std::size_t i) {
  if constexpr (T == DType::F32) {
    return static_cast<const float*>(block)[i];
  } else if constexpr (T == DType::F16) {
    return fp16_to_fp32(static_cast<const std::uint16_t*>(block)[i]);
  } else {
    const BlockQ8_0& b = static_cast<const BlockQ8_0*>(block)[i / kQK8_0];
    return fp16_to_fp32(b.d) * static_cast<float>(b.qs[i % kQK8_0]);
  }
}

template <DType T>
void attention_impl(const float* q, const void* const* k_blocks, const void* const* v_blocks, std::size_t block_tokens,
                    std::size_t stride, std::size_t offset, std::size_t n_ctx, std::size_t head_dim, float scale, float* out,
                    float* lse) {
  float m = -INFINITY, l = 0.0f;
  std::fill_n(out, head_dim, 0.0f);
  for (std::size_t j = 0; j < n_ctx; ++j) {
    const std::size_t at = (j % block_tokens) * stride + offset;
    const void* kb = k_blocks[j / block_tokens];
    float s = 0.0f;
    for (std::size_t i = 0; i < head_dim; ++i) s += q[i] * kv_at<T>(kb, at + i);
    s *= scale;
    if (s > m) {
      const float correction = std::exp(m - s);  // exp(-inf) = 0 on the first position
      for (std::size_t i = 0; i < head_dim; ++i) out[i] *= correction;
      l *= correction;
      m = s;
    }
    const float p = std::exp(s - m);
    l += p;
    const void* vb = v_blocks[j / block_tokens];
    for (std::size_t i = 0; i < head_dim; ++i) out[i] += p * kv_at<T>(vb, at + i);
  }
  const float inv = l > 0.0f ? 1.0f / l : 0.0f;
  for (std::size_t i = 0; i < head_dim; ++i) out[i] *= inv;
  if (lse) *lse = l > 0.0f ? m + std::log(l) : -INFINITY;
}

void attention(const float* q, const void* const* k_blocks, const void* const* v_blocks, DType kv_type, std::size_t block_tokens,
               std::size_t stride, std::size_t offset, std::size_t n_ctx, std::size_t head_dim, float scale, float* out, float* lse) {
  switch (kv_type) {
    case DType::F16: attention_impl<DType::F16>(q, k_blocks, v_blocks, block_tokens, stride, offset, n_ctx, head_dim, scale, out, lse); break;
    case DType::Q8_0: attention_impl<DType::Q8_0>(q, k_blocks, v_blocks, block_tokens, stride, offset, n_ctx, head_dim, scale, out, lse); break;
    default: attention_impl<DType::F32>(q, k_blocks, v_blocks, block_tokens, stride, offset, n_ctx, head_dim, scale, out, lse); break;
  }
}

}  // namespace

namespace {

// Both layouts: 16 fp16 scales, then 4-byte groups of 16 rows; Q4_0 packs two elements per byte
// (low nibble j, high nibble j + 16, offset 8), Q8_0 stores one unsigned byte (offset 128).
template <bool Q8>
void gemm_x16_reference(const std::uint8_t* w, std::size_t cols, std::size_t r0, std::size_t r1, const QuantizedRows& x,
                        std::size_t n_tokens, float* y, std::size_t ldy) {
  const std::size_t nb = cols / 32;
  constexpr std::size_t kGroupBlock = 16 * (Q8 ? sizeof(BlockQ8_0) : sizeof(BlockQ4_0));
  for (std::size_t r = r0; r < r1; ++r) {
    const std::uint8_t* group = w + (r / 16) * nb * kGroupBlock;
    const std::size_t lane = r % 16;
    for (std::size_t t = 0; t < n_tokens; ++t) {
      const BlockQ8_0* xb = x.blocks + t * x.n_blocks;
      float acc = 0.0f;
      for (std::size_t b = 0; b < nb; ++b) {
        const std::uint8_t* gb = group + b * kGroupBlock;
        std::uint16_t d;
        std::memcpy(&d, gb + 2 * lane, 2);
        int dot = 0;
        for (int j = 0; j < (Q8 ? 32 : 16); ++j) {
          const int q = gb[32 + 64 * (j / 4) + 4 * lane + j % 4];
          if constexpr (Q8) {
            dot += (q - 128) * xb[b].qs[j];
          } else {
            dot += ((q & 0xf) - 8) * xb[b].qs[j] + ((q >> 4) - 8) * xb[b].qs[j + 16];
          }
        }
        acc += fp16_to_fp32(d) * fp16_to_fp32(xb[b].d) * static_cast<float>(dot);
      }
      y[t * ldy + r] = acc;
    }
  }
}

}  // namespace

// As x * sigmoid(2a) (= 0.5 x (1 + tanh(a))): 1 + tanh(a) loses every bit to cancellation where
// tanh(a) nears -1 (a gate of -5 or below), the sigmoid form none.
void gelu_tanh_mul_reference(float* gate, const float* up, std::size_t n) {
  constexpr float kTwoSqrt2OverPi = 2.0f * 0.7978845608028654f;
  for (std::size_t i = 0; i < n; ++i) {
    const float x = gate[i];
    const float z = kTwoSqrt2OverPi * (x + 0.044715f * x * x * x);
    gate[i] = x / (1.0f + std::exp(-z)) * up[i];
  }
}

void silu_mul_reference(float* gate, const float* up, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) {
    const float g = gate[i];
    gate[i] = g / (1.0f + std::exp(-g)) * up[i];
  }
}

void gemm_q4_0_x16_reference(const std::uint8_t* w, std::size_t cols, std::size_t r0, std::size_t r1, const QuantizedRows& x,
                             std::size_t n_tokens, float* y, std::size_t ldy) {
  gemm_x16_reference<false>(w, cols, r0, r1, x, n_tokens, y, ldy);
}

void gemm_q8_0_x16_reference(const std::uint8_t* w, std::size_t cols, std::size_t r0, std::size_t r1, const QuantizedRows& x,
                             std::size_t n_tokens, float* y, std::size_t ldy) {
  gemm_x16_reference<true>(w, cols, r0, r1, x, n_tokens, y, ldy);
}


void gemm_dequant(DType type, const std::uint8_t* w, std::size_t w_stride, std::size_t cols, std::size_t r0, std::size_t r1,
                  const float* x, std::size_t n_tokens, float* y, std::size_t ldy) {
  std::vector<float> row(cols);
  for (std::size_t r = r0; r < r1; ++r) {
    dequantize_row(type, w + r * w_stride, row.data(), cols);
    for (std::size_t t = 0; t < n_tokens; ++t) y[t * ldy + r] = dot_f32(row.data(), x + t * cols, cols);
  }
}

namespace {

// The Q4_Kx16 layout, or with q5 the Q5_Kx16 one (see repack_x16).
void gemm_k_x16_reference(bool q5, const std::uint8_t* w, std::size_t cols, std::size_t r0, std::size_t r1, const QuantizedRows& x,
                          std::size_t n_tokens, float* y, std::size_t ldy) {
  const std::size_t group_bytes = q5 ? kQ5KGroupBytes : kQ4KGroupBytes;
  const std::size_t nsb = cols / kQK_K;
  for (std::size_t r = r0; r < r1; ++r) {
    const std::uint8_t* group = w + (r / 16) * nsb * group_bytes;
    const std::size_t lane = r % 16;
    for (std::size_t t = 0; t < n_tokens; ++t) {
      const BlockQ8_0* xb = x.blocks + t * x.n_blocks;
      const float* xs = x.sums + t * x.n_blocks;
      float acc = 0.0f;
      for (std::size_t sb = 0; sb < nsb; ++sb) {
        const std::uint8_t* g = group + sb * group_bytes;
        std::uint16_t d16, dmin16;
        std::memcpy(&d16, g + 2 * lane, 2);
        std::memcpy(&dmin16, g + 32 + 2 * lane, 2);
        const float d = fp16_to_fp32(d16), dmin = fp16_to_fp32(dmin16);
        for (int s = 0; s < 8; ++s) {
          const std::uint8_t sc = g[64 + 32 * s + lane], m = g[64 + 32 * s + 16 + lane];
          const std::uint8_t* quants = g + 320 + 512 * (s / 2);
          int dot = 0;
          for (int e = 0; e < 32; ++e) {
            const std::uint8_t byte = quants[64 * (e / 4) + 4 * lane + e % 4];
            int level = (s % 2 == 0) ? (byte & 0xf) : (byte >> 4);
            if (q5) {
              const std::size_t bit = 4 * lane + e % 4;
              level |= ((g[kQ4KGroupBytes + 64 * s + 8 * (e / 4) + bit / 8] >> (bit % 8)) & 1) << 4;
            }
            dot += level * xb[sb * 8 + s].qs[e];
          }
          const std::size_t k = sb * 8 + s;
          acc += d * sc * fp16_to_fp32(xb[k].d) * static_cast<float>(dot) - dmin * m * xs[k];
        }
      }
      y[t * ldy + r] = acc;
    }
  }
}

}  // namespace

void gemm_q4_k_x16_reference(const std::uint8_t* w, std::size_t cols, std::size_t r0, std::size_t r1, const QuantizedRows& x,
                             std::size_t n_tokens, float* y, std::size_t ldy) {
  gemm_k_x16_reference(false, w, cols, r0, r1, x, n_tokens, y, ldy);
}

void gemm_q5_k_x16_reference(const std::uint8_t* w, std::size_t cols, std::size_t r0, std::size_t r1, const QuantizedRows& x,
                             std::size_t n_tokens, float* y, std::size_t ldy) {
  gemm_k_x16_reference(true, w, cols, r0, r1, x, n_tokens, y, ldy);
}

namespace {

// The 16-element sub-block layouts (Q6_Kx16, Q3_Kx16): the 16 fp16 d, each sub-block's int8 scales
// at 32 + 16s, and level(g, s, e, lane) element 16s + e's signed level.
template <std::size_t kGroupBytes, typename Level>
void gemm_sub16_x16_reference(const Level& level, const std::uint8_t* w, std::size_t cols, std::size_t r0, std::size_t r1,
                              const QuantizedRows& x, std::size_t n_tokens, float* y, std::size_t ldy) {
  const std::size_t nsb = cols / kQK_K;
  for (std::size_t r = r0; r < r1; ++r) {
    const std::uint8_t* group = w + (r / 16) * nsb * kGroupBytes;
    const std::size_t lane = r % 16;
    for (std::size_t t = 0; t < n_tokens; ++t) {
      const BlockQ8_0* xb = x.blocks + t * x.n_blocks;
      float acc = 0.0f;
      for (std::size_t sb = 0; sb < nsb; ++sb) {
        const std::uint8_t* g = group + sb * kGroupBytes;
        std::uint16_t d16;
        std::memcpy(&d16, g + 2 * lane, 2);
        const float d = fp16_to_fp32(d16);
        for (int s = 0; s < 16; ++s) {
          const float sc = static_cast<float>(static_cast<std::int8_t>(g[32 + 16 * s + lane]));
          const BlockQ8_0& xk = xb[sb * 8 + static_cast<std::size_t>(s / 2)];
          int dot = 0;
          for (int e = 0; e < 16; ++e) dot += level(g, s, e, lane) * xk.qs[16 * (s % 2) + e];
          acc += d * sc * fp16_to_fp32(xk.d) * static_cast<float>(dot);
        }
      }
      y[t * ldy + r] = acc;
    }
  }
}

}  // namespace

void gemm_q6_k_x16_reference(const std::uint8_t* w, std::size_t cols, std::size_t r0, std::size_t r1, const QuantizedRows& x,
                             std::size_t n_tokens, float* y, std::size_t ldy) {
  const auto level = [](const std::uint8_t* g, int s, int e, std::size_t lane) {
    const int el = 16 * s + e;  // element within the super-block: a byte, stored + 32
    return static_cast<int>(g[288 + 64 * (el / 4) + 4 * lane + el % 4]) - 32;
  };
  gemm_sub16_x16_reference<kQ6KGroupBytes>(level, w, cols, r0, r1, x, n_tokens, y, ldy);
}

void gemm_q3_k_x16_reference(const std::uint8_t* w, std::size_t cols, std::size_t r0, std::size_t r1, const QuantizedRows& x,
                             std::size_t n_tokens, float* y, std::size_t ldy) {
  const auto level = [](const std::uint8_t* g, int s, int e, std::size_t lane) {
    const std::size_t at = 4 * lane + static_cast<std::size_t>(e % 4);
    const int k = e / 4;  // the weight vector: low 2 bits at bits 2k of the sub-block's bytes, third bit in mask k
    const int low = (g[288 + 64 * s + at] >> (2 * k)) & 3, third = (g[1312 + 32 * s + 8 * k + at / 8] >> (at % 8)) & 1;
    return low + 4 * third - 4;
  };
  gemm_sub16_x16_reference<kQ3KGroupBytes>(level, w, cols, r0, r1, x, n_tokens, y, ldy);
}

void gemm_iq4_xs_x16_reference(const std::uint8_t* w, std::size_t cols, std::size_t r0, std::size_t r1, const QuantizedRows& x,
                               std::size_t n_tokens, float* y, std::size_t ldy) {
  const std::size_t nsb = cols / kQK_K;
  for (std::size_t r = r0; r < r1; ++r) {
    const std::uint8_t* group = w + (r / 16) * nsb * kIQ4XSGroupBytes;
    const std::size_t lane = r % 16;
    for (std::size_t t = 0; t < n_tokens; ++t) {
      const BlockQ8_0* xb = x.blocks + t * x.n_blocks;
      float acc = 0.0f;
      for (std::size_t sb = 0; sb < nsb; ++sb) {
        const std::uint8_t* g = group + sb * kIQ4XSGroupBytes;
        std::uint16_t d16;
        std::memcpy(&d16, g + 2 * lane, 2);
        const float d = fp16_to_fp32(d16);
        for (int s = 0; s < 8; ++s) {
          const float sc = static_cast<float>(static_cast<std::int8_t>(g[32 + 16 * s + lane]));
          const std::uint8_t* quants = g + 160 + 512 * (s / 2);
          const BlockQ8_0& xk = xb[sb * 8 + static_cast<std::size_t>(s)];
          int dot = 0;
          for (int e = 0; e < 32; ++e) {
            const std::uint8_t byte = quants[64 * (e / 4) + 4 * lane + e % 4];
            dot += kIQ4Levels[s % 2 == 0 ? byte & 0xf : byte >> 4] * xk.qs[e];
          }
          acc += d * sc * fp16_to_fp32(xk.d) * static_cast<float>(dot);
        }
      }
      y[t * ldy + r] = acc;
    }
  }
}

const KernelTable& scalar_kernels() {
  static const KernelTable table{"scalar", quantize_activations, gemm_q8_0, gemm_q4_0, gemm_half<fp16_to_fp32>, gemm_half<bf16_to_fp32>,
                                 gemm_f32, dot_f32, attention, gemm_q4_0_x16_reference, gemm_q8_0_x16_reference,
                                 gemm_q4_k_x16_reference, gemm_q5_k_x16_reference, gemm_q6_k_x16_reference, gemm_iq4_xs_x16_reference, gemm_q3_k_x16_reference,
                                 gemm_f16_x4_reference,
                                 gemm_bf16_x4_reference, gemm_dequant,
                                 attention_tile_each<attention>, false, false, silu_mul_reference,
                                 gelu_tanh_mul_reference, nullptr};
  return table;
}

const KernelTable& kernel_table(Isa isa) {
  switch (isa) {
    case Isa::Amx: return amx_kernels();
    case Isa::Avx512: return avx512_kernels();
    case Isa::Avx2: return avx2_kernels();
    default: return scalar_kernels();
  }
}

}  // namespace promptly::kernels
