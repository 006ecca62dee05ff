#pragma once
// The per-ISA kernel table. Each instruction set has its own translation unit compiled with its own
// flags (kernels_scalar.cpp, kernels_avx2.cpp, kernels_avx512.cpp, kernels_amx.cpp); matmul.cpp picks the table of the
// active path at run time, so one binary runs on any x86-64.
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "kernels/cpu.h"
#include "kernels/ops.h"
#include "tensor/dtype.h"

namespace promptly::kernels {

constexpr std::size_t kQ4_0GroupBytes = 16 * 18;  // one 32-element block of 16 rows in the Q4_0x16 layout
constexpr std::size_t kQ8_0GroupBytes = 16 * 34;  // ... and in the Q8_0x16 layout
constexpr std::size_t kQ4KGroupBytes = 2368;      // one super-block of 16 rows in the Q4_Kx16 layout
constexpr std::size_t kQ5KGroupBytes = 2368 + 512;  // ... in the Q5_Kx16 layout: Q4_Kx16's, then the fifth bits
constexpr std::size_t kQ6KGroupBytes = 4384;      // ... and in the Q6_Kx16 layout
constexpr std::size_t kIQ4XSGroupBytes = 2208;    // ... and in the IQ4_XSx16 layout
constexpr std::size_t kQ3KGroupBytes = 1824;      // ... and in the Q3_Kx16 layout

// Activations quantized to Q8_0 for integer dot products: per token, n_blocks blocks, plus
// d * sum(q) per block (Q4_0's -8 offset is applied through it).
// One activation block as the 16-row VNNI kernels read it: the quants and, precomputed, what would
// otherwise cost float work per block and token (the scale as a float, and the offset of the
// weights' stored-unsigned quants times the block's sum, in integers; for Q4_K the sum as a float).
// Everything a tile needs per token and block in one place, so that one pointer per token keeps a
// 12-token tile's addresses in registers.
struct alignas(16) ActivationBlock {
  std::int8_t qs[32];
  float d;
  std::int32_t offset_q4;  // -8 * sum(qs): negated, so that it starts a VNNI chain as a broadcast load
  std::int32_t offset_q8;  // -128 * sum(qs)
  float sum;               // d * sum(qs), the same value as QuantizedRows::sums
};

// Tokens per tile of the tile-ordered copy of activations (KernelTable::token_tile).
constexpr std::size_t kTokenTile = 16;
// Fewest tokens for which the tiled (AMX) kernels are used at all. Unpacking a weight group into
// tiles costs about as much as one tile's products, and while AMX runs the core clocks down, which
// slows the float work around it (the per-block scaling, attention): end to end the VNNI kernel
// keeps up with AMX up to ~128 tokens (`PROMPTLY_ISA=avx512|amx promptly bench model -p N`, Q4_0
// TinyLlama shape: 189 vs 150 t/s at 48 tokens, 170-230 vs 136-139 at 96, 177-182 vs 155-184 at 128,
// a draw within this machine's noise at 512).
constexpr std::size_t kMinTiledTokens = 8 * kTokenTile;

struct QuantizedRows {
  const BlockQ8_0* blocks;
  const float* sums;
  std::size_t n_blocks;  // per token
  const float* half_sums;  // d * sum(q) of each block's two 16-element halves (Q6_K sub-blocks)
  // The same blocks, extended for the 16-row VNNI kernels and stored block-major: block b of token t
  // is act[b * act_stride + t]. Why: a tile's C tokens of one block then lie side by side, so one
  // pointer with constant offsets reaches all of them, and each VNNI instruction can take its
  // activation operand as an embedded broadcast from memory. Token-major, a 12-token tile needed 12
  // pointers (more than the free registers, so spills) and a separate broadcast load per
  // instruction, which this core issues at fewer per cycle than the dot products themselves.
  const ActivationBlock* act;
  std::size_t act_stride;  // >= the token count
  // For tables with token_tile set, the whole 16-token tiles of tokens [0, n_tokens) again, in tile
  // order: per tile and block, the 16 tokens' 32 quants back to back (tiled_qs, 512 bytes) and their
  // 16 scales (tiled_dx). Null otherwise.
  const std::int8_t* tiled_qs = nullptr;
  const float* tiled_dx = nullptr;
};

// Where one token's quantized activations go: every form that some matmul kernel reads (see
// QuantizedRows), written in one pass over the token.
// Null blocks, sums and half_sums: only the ActivationBlocks are wanted (see
// KernelTable::x16_reads_activation_blocks_only).
struct QuantizedToken {
  BlockQ8_0* blocks;      // n / 32 blocks
  float* sums;            // per block: d * sum(q)
  float* half_sums;       // per block: d * sum of each 16-element half
  ActivationBlock* act;   // block b at act[b * act_stride]
  std::size_t act_stride;
};

// Block b's sums and ActivationBlock, once its quants and scale are in `block` (out.blocks[b], or
// the caller's scratch where out.blocks is null): d is that scale as a float, lo and hi the integer
// sums of its two halves of quants. One helper for every path, so that all of them store the same
// values.
inline void store_activation_block(std::size_t b, const BlockQ8_0& block, float d, int lo, int hi, const QuantizedToken& out) {
  const int sum = lo + hi;
  const float d_sum = d * static_cast<float>(sum);
  if (out.sums) {
    out.sums[b] = d_sum;
    out.half_sums[2 * b] = d * static_cast<float>(lo);
    out.half_sums[2 * b + 1] = d * static_cast<float>(hi);
  }
  ActivationBlock& a = out.act[b * out.act_stride];
  std::memcpy(a.qs, block.qs, sizeof a.qs);
  a.d = d;
  a.offset_q4 = -8 * sum;
  a.offset_q8 = -128 * sum;
  a.sum = d_sum;
}

struct KernelTable {
  const char* name;
  // One token's n floats (n a multiple of 32) to Q8_0, in every form of `out`.
  void (*quantize_activations)(const float* x, std::size_t n, const QuantizedToken& out);
  // y[t * ldy + r] = dot(W row r, token t) for rows [r0, r1) and tokens [0, n_tokens).
  void (*gemm_q8_0)(const std::uint8_t* w, std::size_t w_stride, std::size_t r0, std::size_t r1, const QuantizedRows& x,
                    std::size_t n_tokens, float* y, std::size_t ldy);
  void (*gemm_q4_0)(const std::uint8_t* w, std::size_t w_stride, std::size_t r0, std::size_t r1, const QuantizedRows& x,
                    std::size_t n_tokens, float* y, std::size_t ldy);
  // F16 / BF16 / F32 weights against F32 activations (k values per token).
  void (*gemm_f16)(const std::uint8_t* w, std::size_t w_stride, std::size_t r0, std::size_t r1, const float* x, std::size_t k,
                   std::size_t n_tokens, float* y, std::size_t ldy);
  void (*gemm_bf16)(const std::uint8_t* w, std::size_t w_stride, std::size_t r0, std::size_t r1, const float* x, std::size_t k,
                    std::size_t n_tokens, float* y, std::size_t ldy);
  void (*gemm_f32)(const std::uint8_t* w, std::size_t w_stride, std::size_t r0, std::size_t r1, const float* x, std::size_t k,
                   std::size_t n_tokens, float* y, std::size_t ldy);
  float (*dot_f32)(const float* a, const float* b, std::size_t n);
  // One query head against n_ctx cached positions in a single pass with an online softmax (a running
  // max and sum, rescaled when the max grows): numerically stable, no score buffer. The cache is
  // paged: key j is k_blocks[j / block_tokens] + (j % block_tokens) * stride + offset (values alike),
  // in elements of kv_type: F32, F16 or Q8_0 (then stride is a multiple of 32, so every cached row
  // is whole Q8_0 blocks, and element e of a block is block e / 32, lane e % 32). With `lse` (else
  // null), *lse = log(sum_j exp(scale * q.k_j)), or -inf with no key: what a caller needs to merge
  // this softmax with one over further keys (a token tree's ancestors, model.cpp).
  void (*attention)(const float* q, const void* const* k_blocks, const void* const* v_blocks, DType kv_type, std::size_t block_tokens,
                    std::size_t stride, std::size_t offset, std::size_t n_ctx, std::size_t head_dim, float scale, float* out,
                    float* lse);
  // Q4_0x16 layout (see repack_q4_0_x16); r0 and r1 are multiples of 16.
  void (*gemm_q4_0_x16)(const std::uint8_t* w, std::size_t cols, std::size_t r0, std::size_t r1, const QuantizedRows& x,
                        std::size_t n_tokens, float* y, std::size_t ldy);
  void (*gemm_q8_0_x16)(const std::uint8_t* w, std::size_t cols, std::size_t r0, std::size_t r1, const QuantizedRows& x,
                        std::size_t n_tokens, float* y, std::size_t ldy);
  void (*gemm_q4_k_x16)(const std::uint8_t* w, std::size_t cols, std::size_t r0, std::size_t r1, const QuantizedRows& x,
                        std::size_t n_tokens, float* y, std::size_t ldy);
  void (*gemm_q5_k_x16)(const std::uint8_t* w, std::size_t cols, std::size_t r0, std::size_t r1, const QuantizedRows& x,
                        std::size_t n_tokens, float* y, std::size_t ldy);
  void (*gemm_q6_k_x16)(const std::uint8_t* w, std::size_t cols, std::size_t r0, std::size_t r1, const QuantizedRows& x,
                        std::size_t n_tokens, float* y, std::size_t ldy);
  void (*gemm_iq4_xs_x16)(const std::uint8_t* w, std::size_t cols, std::size_t r0, std::size_t r1, const QuantizedRows& x,
                          std::size_t n_tokens, float* y, std::size_t ldy);
  void (*gemm_q3_k_x16)(const std::uint8_t* w, std::size_t cols, std::size_t r0, std::size_t r1, const QuantizedRows& x,
                        std::size_t n_tokens, float* y, std::size_t ldy);
  // F16x4 / BF16x4 layouts against F32 activations (cols values per token); r0 and r1 are multiples of 4.
  void (*gemm_f16_x4)(const std::uint8_t* w, std::size_t cols, std::size_t r0, std::size_t r1, const float* x, std::size_t n_tokens,
                      float* y, std::size_t ldy);
  void (*gemm_bf16_x4)(const std::uint8_t* w, std::size_t cols, std::size_t r0, std::size_t r1, const float* x, std::size_t n_tokens,
                       float* y, std::size_t ldy);
  // Any other supported type: dequantize each row, then F32 dots.
  void (*gemm_dequant)(DType type, const std::uint8_t* w, std::size_t w_stride, std::size_t cols, std::size_t r0, std::size_t r1,
                       const float* x, std::size_t n_tokens, float* y, std::size_t ldy);
  // Up to kAttentionTile queries that read the same KV head (the query heads of a GQA group, for
  // one or more tokens of one sequence) in one pass over the keys: query i (head_dim floats at q[i])
  // sees positions [first[i], n_ctx[i]) (first null: from 0; a sliding window starts later) and its
  // result goes to out[i]. softcap > 0 caps every score at softcap * tanh(score / softcap) (Gemma 2).
  // No position before every query's first is read: blocks holding only such positions may be null. Each key and value is loaded and
  // converted once for all of them, and the score and value products become small matrix products
  // (one query per vector lane). Same paging and types as `attention`; with `lse` (else null),
  // lse[i] is query i's log-sum-exp as there (of the capped scores in [first[i], n_ctx[i])).
  void (*attention_tile)(const float* const* q, const std::size_t* first, const std::size_t* n_ctx, std::size_t n_q,
                         const void* const* k_blocks, const void* const* v_blocks, DType kv_type, std::size_t block_tokens,
                         std::size_t stride, std::size_t offset, std::size_t head_dim, float scale, float softcap, float* const* out,
                         float* lse);
  // Whether the matrix kernels want the tile-ordered activations of QuantizedRows.
  bool token_tile;
  // Whether the kernels for the Q4_0x16, Q8_0x16, Q4_Kx16, Q5_Kx16 and IQ4_XSx16 layouts read nothing of QuantizedRows
  // but the ActivationBlocks (act), so that an input only they read needs no other form.
  bool x16_reads_activation_blocks_only;
  // gate[i] = silu(gate[i]) * up[i].
  void (*silu_mul)(float* gate, const float* up, std::size_t n);
  // gate[i] = gelu_tanh(gate[i]) * up[i] (Gemma's GeGLU).
  void (*gelu_tanh_mul)(float* gate, const float* up, std::size_t n);
  // Runs `rounds` x 12 independent 512-bit VNNI instructions (64 int8 multiply-adds each) on
  // registers and returns a checksum: the core's int8 throughput with no memory traffic, which
  // `bench model` reports beside the nominal peak. Null on paths without VNNI.
  std::int32_t (*int8_throughput_probe)(std::size_t rounds);
};
// Multiply-adds per round of int8_throughput_probe.
constexpr std::size_t kInt8ProbeMacsPerRound = 12 * 64;

constexpr std::size_t kAttentionTile = 64;

// attention_tile for paths without a tiled kernel: one `attention` call per query (attention_range
// where a window or a cap applies).
template <auto Attention>
void attention_tile_each(const float* const* q, const std::size_t* first, const std::size_t* n_ctx, std::size_t n_q,
                         const void* const* k_blocks, const void* const* v_blocks, DType kv_type, std::size_t block_tokens,
                         std::size_t stride, std::size_t offset, std::size_t head_dim, float scale, float softcap, float* const* out,
                         float* lse) {
  for (std::size_t i = 0; i < n_q; ++i) {
    float* lse_i = lse ? lse + i : nullptr;
    if (first || softcap > 0.0f) {
      attention_range(q[i], k_blocks, v_blocks, kv_type, block_tokens, stride, offset, first ? first[i] : 0, n_ctx[i], head_dim,
                      scale, softcap, out[i], lse_i);
    } else {
      Attention(q[i], k_blocks, v_blocks, kv_type, block_tokens, stride, offset, n_ctx[i], head_dim, scale, out[i], lse_i);
    }
  }
}

// The scalar reference of the interleaved layout, shared by paths without a kernel of their own.
// silu(g) * u as g / (1 + exp(-g)) * u with the C library's exp.
void silu_mul_reference(float* gate, const float* up, std::size_t n);
// gelu_tanh(g) * u = 0.5 g (1 + tanh(a)) * u, a = sqrt(2/pi) (g + 0.044715 g^3), computed as
// g * sigmoid(2a) * u with the C library's exp.
void gelu_tanh_mul_reference(float* gate, const float* up, std::size_t n);
void gemm_q4_0_x16_reference(const std::uint8_t* w, std::size_t cols, std::size_t r0, std::size_t r1, const QuantizedRows& x,
                             std::size_t n_tokens, float* y, std::size_t ldy);
void gemm_q4_k_x16_reference(const std::uint8_t* w, std::size_t cols, std::size_t r0, std::size_t r1, const QuantizedRows& x,
                             std::size_t n_tokens, float* y, std::size_t ldy);
void gemm_q5_k_x16_reference(const std::uint8_t* w, std::size_t cols, std::size_t r0, std::size_t r1, const QuantizedRows& x,
                             std::size_t n_tokens, float* y, std::size_t ldy);
void gemm_q6_k_x16_reference(const std::uint8_t* w, std::size_t cols, std::size_t r0, std::size_t r1, const QuantizedRows& x,
                             std::size_t n_tokens, float* y, std::size_t ldy);
void gemm_q3_k_x16_reference(const std::uint8_t* w, std::size_t cols, std::size_t r0, std::size_t r1, const QuantizedRows& x,
                             std::size_t n_tokens, float* y, std::size_t ldy);
void gemm_iq4_xs_x16_reference(const std::uint8_t* w, std::size_t cols, std::size_t r0, std::size_t r1, const QuantizedRows& x,
                               std::size_t n_tokens, float* y, std::size_t ldy);
void gemm_q8_0_x16_reference(const std::uint8_t* w, std::size_t cols, std::size_t r0, std::size_t r1, const QuantizedRows& x,
                             std::size_t n_tokens, float* y, std::size_t ldy);
void gemm_f16_x4_reference(const std::uint8_t* w, std::size_t cols, std::size_t r0, std::size_t r1, const float* x,
                           std::size_t n_tokens, float* y, std::size_t ldy);
void gemm_bf16_x4_reference(const std::uint8_t* w, std::size_t cols, std::size_t r0, std::size_t r1, const float* x,
                            std::size_t n_tokens, float* y, std::size_t ldy);

const KernelTable& kernel_table(Isa isa);
const KernelTable& scalar_kernels();
const KernelTable& avx2_kernels();
const KernelTable& avx512_kernels();
const KernelTable& amx_kernels();  // avx512's, with AMX tiles for Q4_0 / Q8_0 / Q4_K x16 prompt batches

}  // namespace promptly::kernels
