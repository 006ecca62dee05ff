#pragma once
// The element-wise and row-wise operations of a llama-family layer.
#include <cstddef>

#include "tensor/dtype.h"

namespace promptly::kernels {

// out = x / rms(x) * weight
void rmsnorm(const float* x, const float* weight, std::size_t n, float eps, float* out);

// Rotary position embedding, in two steps: a forward pass rotates every head of every layer at the
// same positions, so cos and sin of each pair's angle at `position` (n_rot / 2 each; inv_freq[i] is
// the angular speed of pair i) are computed once per token, then applied in place to each head
// vector of head_dim values, of which the first n_rot rotate. Normal ordering rotates adjacent pairs
// (x[2i], x[2i+1]); NeoX ordering rotates (x[i], x[i + n_rot/2]).
void rope_angles(std::size_t n_rot, const float* inv_freq, float position, float* cos, float* sin);
void rope(float* x, std::size_t n_rot, const float* cos, const float* sin, bool neox);

// gate = silu(gate) * up, on the active kernel path (see dispatch.h).
void silu_mul(float* gate, const float* up, std::size_t n);

// gate = gelu(gate) * up with GELU's tanh approximation (Gemma's GeGLU).
void gelu_tanh_mul(float* gate, const float* up, std::size_t n);

// One query head against cached positions [first, n_ctx) only, with optional logit soft-capping
// (score = softcap * tanh(score / softcap) when softcap > 0): the attention of sliding-window layers
// (first = n_ctx - window when the context is longer) and of Gemma 2. Same paging and KV types as
// KernelTable::attention; plain loops: the reference the tiled kernels' windows and caps are tested
// against, and attention_tile's path where no tiled kernel applies (scalar, AVX2, odd head sizes).
// `lse` as KernelTable::attention's (of the capped scores).
void attention_range(const float* q, const void* const* k_blocks, const void* const* v_blocks, DType kv_type,
                     std::size_t block_tokens, std::size_t stride, std::size_t offset, std::size_t first, std::size_t n_ctx,
                     std::size_t head_dim, float scale, float softcap, float* out, float* lse = nullptr);

// Asks the caches for the first n_rows positions (at most kPrefetchKvRows) of one KV head's keys and
// values, laid out as attention_tile reads them (see dispatch.h), ahead of the tile that reads them.
constexpr std::size_t kPrefetchKvRows = 128;
void prefetch_kv(const void* const* k_blocks, const void* const* v_blocks, std::size_t n_rows, std::size_t block_tokens,
                 std::size_t stride, std::size_t offset, std::size_t head_dim, DType type);

}  // namespace promptly::kernels
