#pragma once
// The CUDA backend's kernels, as host functions that launch them on a stream. Shapes and pointers
// that stay the same across decode steps are arguments; what changes every step (tokens,
// positions, block tables, context lengths) is read from device memory, so that a step's launches
// can be captured once in a CUDA graph and replayed (cuda_forward.cpp).
#include <cstddef>
#include <cstdint>

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "backend/cuda/blocks.h"
#include "backend/cuda/step_layout.h"

namespace promptly::backend::cuda {

// Most tokens the matrix-vector kernels take at once; larger batches go through cuBLAS.
constexpr int kGemvMaxTokens = 8;
// Most head_dim attention takes (8 elements a lane of a warp).
constexpr int kMaxHeadDim = 256;

// Programmatic dependent launches (sm_90 and a driver that takes them): whether they work on the
// stream's device (two launches, direct and in a graph); while a DependentLaunches(true) lives, the
// launches below from its thread are made that way.
bool dependent_launches_work(cudaStream_t stream);
class DependentLaunches {
 public:
  explicit DependentLaunches(bool on);
  ~DependentLaunches();
  DependentLaunches(const DependentLaunches&) = delete;
  DependentLaunches& operator=(const DependentLaunches&) = delete;

 private:
  bool previous_;
};

// Per-token facts of one pass, in device memory (written by the host before each step).
struct StepMeta {
  const std::int32_t* tokens;       // [T]
  const std::int32_t* positions;    // [T] what RoPE rotates by; the query sees positions [0, position]
  const std::int32_t* slots;        // [T] where its K/V go (its position)
  const std::int32_t* table_start;  // [T] where its sequence's block table starts in `tables`
  const std::int32_t* tables;       // block ids, sequence after sequence
  // Token trees (model/batch.h): [T] -1 for an ordinary token; for a tree node, its tree's context
  // C: it sees positions [0, C) and the slots C + j of the bits j of its ancestors ([T] pairs of
  // 32-bit halves, low first).
  const std::int32_t* tree_context;
  const std::uint32_t* tree_ancestors;
  // Attention tiles (attention_tiles): pairs of first token and count, tokens of one sequence;
  // and the tokens in none, for the per-token kernel (AttentionArgs::tokens).
  const std::int32_t* tiles;
  const std::int32_t* lone;
};

// The paged KV store on the device: for block b and layer l, keys then values, each n_head_kv runs
// of block_tokens rows of head_dim halves (the host pool's head-by-head order).
struct DeviceKv {
  __half* data;
  int n_layer;
  int n_head_kv;
  int head_dim;
  int block_tokens;
  // Halves from one block's (layer, K or V) part to the next.
  PROMPTLY_HD std::size_t part_elems() const { return static_cast<std::size_t>(block_tokens) * n_head_kv * head_dim; }
};

// x[t] = row tokens[t] of the embedding table (decoded) times scale.
void embed(const std::uint8_t* table, WeightFormat format, int d, const StepMeta& meta, int T, float scale, float* x,
           cudaStream_t stream);

// x as int8 blocks of 32 for the integer GEMV (quantize_q8's layout, below); q null: not wanted.
struct Q8Out {
  std::int8_t* q = nullptr;
  float2* scale_sum = nullptr;
};

// Per token: if delta: x += (delta_norm ? rmsnorm(delta) * delta_norm : delta); then out = rmsnorm(x) * weight,
// and with q8 (d a multiple of 32) out as int8 too, in the same kernel (decode steps are many small
// launches: each one saved is a few microseconds of a step's critical path).
void add_rmsnorm(float* x, const float* delta, const float* delta_norm, const float* weight, int d, int T, float eps, float* out,
                 cudaStream_t stream, const Q8Out& q8 = {});

// y[t][r] = W[r] . x[t] for T <= kGemvMaxTokens tokens (W rows of `cols` elements in `format`;
// the float formats' rows may have any length, the block formats' are whole blocks).
void gemv(const std::uint8_t* w, WeightFormat format, int rows, int cols, const float* x, int T, float* y, cudaStream_t stream);

// The integer GEMV (decode batches over Q4_K, Q6_K, Q8_0 and Q4_0 weights): x's T rows of cols floats (cols a multiple of
// 32) as int8 blocks of 32, q[t * cols + k], with each block's scale d = max|x| / 127 and d times
// the sum of its q in scale_sum[t * cols / 32 + block]; then y[t][r] = W[r] . x[t] by dp4a on the
// weights' own integers, scaled per block. What gemv_q8 takes: gemv_q8_takes (for a part it does
// not take, it does nothing). Past kGemvMaxTokens tokens (no tails then) each warp takes its row's
// tokens in rounds of that many, reading the row from HBM once.
void quantize_q8(const float* x, int T, int cols, std::int8_t* q, float2* scale_sum, cudaStream_t stream);
bool gemv_q8_takes(WeightFormat format, int cols);
// Up to three matrices of the same width against the same x, in one launch (q/k/v, gate/up).
struct GemvPart {
  const std::uint8_t* w;
  WeightFormat format;
  int rows;
  float* y;  // [T][rows]
};
// With arrivals (two parts, gate then up, of the same rows): the gate part's y becomes
// act(gate) * up, and with q8 (rows a multiple of 32; never the x the launch reads) its int8 form,
// in the same launch (gated_activation's work, one launch fewer a decode layer). Each group of 32
// rows is finished by the last of its blocks to be done; arrivals holds a counter for each group,
// zero before the launch and left zero after it (gated_arrivals_needed).
struct GatedTail {
  int* arrivals = nullptr;
  Q8Out q8;
  bool gelu = false;
};
// With arrivals (one part, whose y is `delta`, and T == 1): the launch ends with add_rmsnorm's work
// on its output, by the last block to be done (the o and down projections of a lone decoding
// stream: one launch fewer a sublayer on its critical path). The counter is left zero.
struct NormTail {
  int* arrivals = nullptr;
  float* x;
  const float* delta_norm;
  const float* weight;
  int d;
  float eps;
  float* out;
  Q8Out q8;
};
struct GemvParts {
  GemvPart part[3];
  int n;
  int cols;
  GatedTail gated;
  NormTail norm;
};
void gemv_q8(const GemvParts& parts, const std::int8_t* q, const float2* scale_sum, int T, cudaStream_t stream);
// The counters a fused launch needs (gemv_q8 with a GatedTail over `rows`, attention with
// arrivals over T tokens and n_head heads): zeroed once, reused by every launch after.
constexpr std::size_t gated_arrivals_needed(int rows) { return static_cast<std::size_t>(rows + 31) / 32; }
constexpr std::size_t attention_arrivals_needed(int T, int n_head) { return static_cast<std::size_t>(T) * n_head; }

// W decoded to halves (rows x cols, row-major), for cuBLAS.
void dequantize_to_half(const std::uint8_t* w, WeightFormat format, int rows, int cols, __half* out, cudaStream_t stream);
void float_to_half(const float* x, std::size_t n, __half* out, cudaStream_t stream);

// After the q/k/v matmuls: biases, per-head norms, RoPE (angles from the positions and inv_freq),
// keys and values stored into the paged cache at their slots; q rotated in place.
struct QkvPost {
  float* q;  // the rotated queries, [T][n_head * head_dim]; the products too unless q_in says
  const float* k;
  const float* v;
  const float *bq, *bk, *bv;          // null: none
  const float *q_norm, *k_norm;       // null: none
  const float* inv_freq;              // n_rot / 2 speeds
  int n_head, n_head_kv, head_dim, n_rot;
  bool neox;
  float attn_factor, eps;
  int layer;
  // Where prefill's one GEMM for the three products wrote them (a token's q, k and v in one row of
  // in_stride floats): the queries' products at q_in, rotated into q. Null and 0: q, k and v each
  // [T][their heads * head_dim], q rotated in place.
  const float* q_in = nullptr;
  int in_stride = 0;
};
void qkv_post(const QkvPost& p, const StepMeta& meta, int T, const DeviceKv& kv, cudaStream_t stream);
// The q/k/v products (gemv_q8 over parts q, k, v, whose y are post's q, k and v) with qkv_post's
// work at the launch's end (one launch fewer a decode layer), each head finished by the last of its
// blocks to be done; arrivals: qkv_arrivals_needed counters, zero before the launch and left zero.
// What it takes: gemv_q8_qkv_takes (every part in a format gemv_q8 takes; heads of a multiple of 4).
bool gemv_q8_qkv_takes(const GemvParts& parts, const QkvPost& post);
void gemv_q8_qkv(const GemvParts& parts, const std::int8_t* q, const float2* scale_sum, int T, const QkvPost& post, const StepMeta& meta,
                 const DeviceKv& kv, int* arrivals, cudaStream_t stream);
constexpr std::size_t qkv_arrivals_needed(int n_head, int n_head_kv) { return static_cast<std::size_t>(n_head) + n_head_kv; }

// Causal attention over the paged cache, split over the context in chunks of `chunk` positions
// (FlashDecoding): partials [T][n_head][n_splits][head_dim + 2], then combined into out [T][n_head * head_dim].
struct AttentionArgs {
  const float* q;
  float* out;
  float* partials;
  int n_head, n_head_kv, head_dim, layer;
  int window;  // 0: none
  float scale, softcap;
  int chunk, n_splits;
  // With arrivals (a zeroed counter per (token, head), left zeroed): the splits merge in the same
  // launch, by the last of each (token, head)'s split blocks to be done (one launch fewer a layer);
  // null: in a launch of their own.
  int* arrivals = nullptr;
  // The tokens to attend for (blocks' x: T of them; partials and counters for T queries); null: 0
  // to T - 1.
  const std::int32_t* tokens = nullptr;
};
// With q8, and heads whose size attention_writes_q8 takes, the output as int8 too (for the o
// projection's integer GEMV: one launch fewer a layer).
void attention(const AttentionArgs& a, const StepMeta& meta, int T, const DeviceKv& kv, cudaStream_t stream, const Q8Out& q8 = {});
// The most splits a query's context may have (the merge keeps each split's weight in shared memory).
constexpr int kMaxAttentionSplits = 256;
constexpr bool attention_writes_q8(int head_dim) { return head_dim % 32 == 0; }

// Prefill's attention: a block per (tile, head), a tile being up to attention_tile_tokens(head_dim)
// tokens of one sequence (meta.tiles, as pack_step plans them), which load each cached key and value
// they see once for the whole tile rather than once a token, and score them from shared memory: the
// per-token kernel reads the context from L2 once per query, some 2 GB a layer for a 512-token
// prompt of an 8B model. The tile's queries see what attention's would (windows, trees, soft
// caps); no splits (a.partials, a.chunk, a.n_splits and a.arrivals are not used). Heads of the
// sizes attention_tiles_take says; with q8 as attention.
// tensor_cores: the products on the tensor cores (queries, keys, values and the softmax weights as
// halves, sums in float: within ~1e-3 of the float kernel's outputs), for heads of the sizes
// attention_tiles_mma_take says; else in float on the CUDA cores.
constexpr bool attention_tiles_take(int head_dim) { return attention_tile_tokens(head_dim) > 0; }
constexpr int kAttentionTileMmaMaxHeadDim = 128;
constexpr bool attention_tiles_mma_take(int head_dim) { return head_dim % 16 == 0 && head_dim > 0 && head_dim <= kAttentionTileMmaMaxHeadDim; }
void attention_tiles(const AttentionArgs& a, const StepMeta& meta, int n_tiles, const DeviceKv& kv, cudaStream_t stream,
                     const Q8Out& q8 = {}, bool tensor_cores = false);

// gate = act(gate) * up over n values (SwiGLU, or GeGLU with tanh when gelu); with q8 (rows of a
// multiple of 32) the result as int8 too.
void gated_activation(float* gate, const float* up, std::size_t n, bool gelu, cudaStream_t stream, const Q8Out& q8 = {});
// The same from one GEMM of gate and up joined: out[t][c] = act(joined[t][c]) * joined[t][F + c]
// for T rows of 2F.
void gated_activation_joined(const float* joined, int T, int F, bool gelu, float* out, cudaStream_t stream);

// dst[i] = src[rows[i]] (d floats each): the rows that want logits, an expert's tokens.
void gather_rows(const float* src, const std::int32_t* rows, int n, int d, float* dst, cudaStream_t stream);
// dst[rows[i]] += weights[i] * src[i] (d floats each; rows distinct): an expert's outputs joining
// its tokens' FFN sums.
void add_weighted_rows(const float* src, const std::int32_t* rows, const float* weights, int n, int d, float* dst, cudaStream_t stream);
// Mixtures of experts in decode-sized batches, routed on the device so that a step needs no trip
// to the host (and can be a graph): route_experts, each (token, chosen expert) pair's matrices
// (gemv_experts), then moe_combine.
// Each token's k experts (k <= 32, n_expert <= kMaxRoutedExperts) as model/moe.h's route_experts
// chooses and weighs them (softmax_over_all: SoftmaxThenTopK without renormalising, else a softmax
// over the chosen), written in expert order: pair t * k + i.
constexpr int kRouteExpertsPerLane = 8;
constexpr int kMaxRoutedExperts = 32 * kRouteExpertsPerLane;  // a warp's lanes, 8 experts each
struct ExpertRoutes {
  std::int32_t* experts;  // [T * k]
  float* weights;         // [T * k]
};
void route_experts(const float* logits, int T, int n_expert, int k, bool softmax_over_all, const ExpertRoutes& routes, cudaStream_t stream);
// y[p][r] = W_e[r] . x[p / pairs_per_x] for each pair p, e its expert (x rows: the tokens' for
// gate/up, the pairs' own for down): a quantized part reads x as int8 (xq, xds: quantize_q8's
// layout), a float part x as floats. Both parts' matrices have rows x cols.
struct ExpertMatrices {
  const std::uint8_t* w;  // expert 0's matrix; expert e's at w + e * stride
  std::size_t stride;
  WeightFormat format;
  float* y;  // [pairs][rows]
};
// With gated.arrivals (gate then up; gemv_experts_gated_takes): each pair's gate rows become
// act(gate) * up, and with q8 (rows a multiple of 32) its int8 form, pair after pair, in the same
// launch (GatedTail; gated_arrivals_needed(rows) counters a pair).
struct ExpertGemv {
  ExpertMatrices part[2];
  int n;
  int rows, cols, pairs_per_x;
  GatedTail gated;
};
bool gemv_experts_takes(WeightFormat format, int cols);
bool gemv_experts_gated_takes(const ExpertGemv& g);
void gemv_experts(const ExpertGemv& g, const std::int32_t* experts, int n_pairs, const float* x, const std::int8_t* xq, const float2* xds,
                  cudaStream_t stream);
// out[t] = the sum of token t's pairs' rows of y with their weights, in expert order (as the CPU adds them).
void moe_combine(const float* y, const ExpertRoutes& routes, int T, int k, int d, float* out, cudaStream_t stream);

// x = cap * tanh(x / cap).
void softcap(float* x, std::size_t n, float cap, cudaStream_t stream);

// One host pool copy (BlockPool::RowCopy) repeated on the device: n_rows positions of every layer,
// keys and values, from (from, from_slot) on to (to, to_slot) on.
void copy_kv_rows(const DeviceKv& kv, int from, int from_slot, int to, int to_slot, int n_rows, cudaStream_t stream);

}  // namespace promptly::backend::cuda
