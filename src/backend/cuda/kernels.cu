// The CUDA backend's kernels (see kernels.cuh). Written for clarity first: one warp per matrix row
// or cached position, 32-element chunks decoded by blocks.h's decoders, float accumulation.
#include <algorithm>
#include <cfloat>
#include <climits>

#include <mma.h>

#include "backend/cuda/block_loops.cuh"
#include "backend/cuda/kernels.cuh"
#include "backend/cuda/step_layout.h"
#include "util/error.h"

namespace promptly::backend::cuda {
namespace {

constexpr int kWarp = 32;

// Programmatic dependent launch (sm_90): a kernel launched with it may start while the one before
// it in the stream is still finishing, so that its launch and ramp overlap that kernel's tail
// instead of following it (a decode step is hundreds of short kernels). Every kernel here first
// waits for the previous grid's completion and memory (griddepcontrol.wait, before touching global
// memory, so the order of reads and writes is the stream's), then lets the next one launch. Where
// the launch is an ordinary one, both instructions do nothing.
__device__ __forceinline__ void dependent_launch_prologue() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;" :::);
#endif
}

// Set for the calling thread's launches by DependentLaunches (each forward pass its own way).
thread_local bool t_dependent_launches = false;

template <typename... Params, typename... Args>
void launch_as(bool dependent, void (*kernel)(Params...), dim3 grid, dim3 block, std::size_t shared, cudaStream_t stream, Args... args) {
  // No blocks is nothing to do, where a GPU would fail the launch (an invalid configuration): the
  // one check for every launcher here.
  if (grid.x == 0 || grid.y == 0 || grid.z == 0) return;
  if (!dependent) {
    kernel<<<grid, block, shared, stream>>>(args...);
    return;
  }
  cudaLaunchAttribute attribute[1];
  attribute[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute[0].val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = shared;
  config.stream = stream;
  config.attrs = attribute;
  config.numAttrs = 1;
  // A failure is the stream's last error, which the forward pass checks after its launches.
  (void)cudaLaunchKernelEx(&config, kernel, static_cast<Params>(args)...);
}

template <typename... Params, typename... Args>
void launch(void (*kernel)(Params...), dim3 grid, dim3 block, std::size_t shared, cudaStream_t stream, Args... args) {
  launch_as(t_dependent_launches, kernel, grid, block, shared, stream, args...);
}

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = kWarp / 2; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
  for (int o = kWarp / 2; o > 0; o /= 2) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// A warp reduction (warp_sum, warp_max) over the block (blockDim.x a multiple of 32, at most 1024);
// every thread gets the result. `none`: what a missing warp adds.
template <float (*kWarpReduce)(float)>
__device__ float block_reduce(float v, float none) {
  __shared__ float partial[32];
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp, n_warps = blockDim.x / kWarp;
  v = kWarpReduce(v);
  __syncthreads();  // partial may still be read by a previous call
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  v = lane < n_warps ? partial[lane] : none;
  return kWarpReduce(v);
}
__device__ float block_sum(float v) { return block_reduce<warp_sum>(v, 0.0f); }
__device__ float block_max(float v) { return block_reduce<warp_max>(v, -FLT_MAX); }

// Whether this block is the last of `expected` to arrive at *counter, each after writing its
// results (a launch whose blocks finish in any order, and whose last one does the work that needs
// them all, rather than a launch of its own). Every thread's writes are made visible before its
// block arrives; the last block resets the counter (every other block has arrived: none touches it
// again in this launch) and, once this returns true, reads the others' results past L1 (__ldcg),
// which is not coherent between blocks. Every thread of the block calls it.
__device__ bool last_to_arrive(int* counter, int expected) {
  __shared__ bool last;
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) {
    last = atomicAdd(counter, 1) == expected - 1;
    if (last) *counter = 0;
  }
  __syncthreads();
  if (last) __threadfence();
  return last;
}

__device__ __forceinline__ const __half* kv_part(const DeviceKv& kv, int block, int layer, int which) {
  return kv.data + ((static_cast<std::size_t>(block) * kv.n_layer + layer) * 2 + which) * kv.part_elems();
}

__global__ void embed_kernel(const std::uint8_t* table, WeightFormat format, int d, StepMeta meta, float scale, float* x) {
  dependent_launch_prologue();
  const int t = blockIdx.x;
  const std::uint8_t* row = table + format_row_bytes(format, d) * static_cast<std::size_t>(meta.tokens[t]);
  float chunk[32];
  if (d % 32) {  // a float format's row of any length
    for (int i = threadIdx.x; i < d; i += blockDim.x) x[static_cast<std::size_t>(t) * d + i] = decode_element(format, row, i) * scale;
    return;
  }
  for (int c = threadIdx.x; c < d / 32; c += blockDim.x) {
    decode_chunk(format, row, c, chunk);
    for (int l = 0; l < 32; ++l) x[static_cast<std::size_t>(t) * d + c * 32 + l] = chunk[l] * scale;
  }
}

// The warp's 32 values (lane l's v: element l) as int8 block b of `out` (quantize_q8's layout:
// scale max|v| / 127, round to nearest even). Every lane of the warp calls it with the same `store`.
__device__ __forceinline__ void warp_quantize_q8(float v, std::size_t b, bool store, const Q8Out& out) {
  float amax = fabsf(v);
  for (int o = kWarp / 2; o > 0; o /= 2) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
  const float d = amax / 127.0f;
  const int qi = d > 0.0f ? __float2int_rn(v / d) : 0;
  int sum = qi;
  for (int o = kWarp / 2; o > 0; o /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, o);
  if (!store) return;
  const int lane = threadIdx.x % kWarp;
  out.q[b * kWarp + lane] = static_cast<std::int8_t>(qi);
  if (lane == 0) out.scale_sum[b] = make_float2(d, d * static_cast<float>(sum));
}

// add_rmsnorm's work for token t, by the whole block (its own kernel: a block a token; a GEMV's
// NormTail: the launch's last block). delta is read past L1 (__ldcg): other blocks of a GEMV launch
// wrote it. The same sums in the same order for the same block size: add_rmsnorm launches
// kGemvWarps warps a block, as the GEMV does, so that the two give the same bits.
// Each thread loads kNormAhead of its elements (i = threadIdx.x + k x blockDim.x) before it uses
// the first: an element at a time, with a store between two loads (which the compiler may not move
// a load past), a thread waited once an element, ~32 waits a pass at 4096 elements and 4 warps and
// three passes, the norm's weights coming from HBM (the layer's matrices went through L2 since the
// last token): an estimated 10-20 µs a norm, on the critical path twice a layer at decode.
constexpr int kNormAhead = 8;
// The residual add's inputs for one element: x, the delta, and (Gemma 2's post-norm) its weight.
struct AddInputs {
  float x, delta, delta_norm;
};
// The output pass's: the summed x and the norm's weight.
struct NormInputs {
  float x, weight;
};
__device__ void add_rmsnorm_row(int t, float* x, const float* delta, const float* delta_norm, const float* weight, int d, float eps,
                                float* out, const Q8Out& q8) {
  float* xt = x + static_cast<std::size_t>(t) * d;
  float ss = 0.0f;  // of the sum's x, a thread's elements in order
  if (delta) {
    const float* dt = delta + static_cast<std::size_t>(t) * d;
    float delta_scale = 1.0f;
    if (delta_norm) {
      float delta_ss = 0.0f;
      for_block_elements<kNormAhead>(
          d, [&](int i) { return __ldcg(dt + i); },
          [&](float v, int, bool) { delta_ss += v * v; });  // zeros past the row add nothing
      delta_scale = rsqrtf(block_sum(delta_ss) / d + eps);
    }
    for_block_elements<kNormAhead>(
        d, [&](int i) { return AddInputs{xt[i], __ldcg(dt + i), delta_norm ? delta_norm[i] : 0.0f}; },
        [&](const AddInputs& e, int i, bool in) {
          const float v = e.x + (delta_norm ? e.delta * delta_scale * e.delta_norm : e.delta);
          if (in) xt[i] = v, ss += v * v;
        });
  } else {
    for_block_elements<kNormAhead>(d, [&](int i) { return xt[i]; }, [&](float v, int, bool) { ss += v * v; });
  }
  const float scale = rsqrtf(block_sum(ss) / d + eps);
  float* ot = out + static_cast<std::size_t>(t) * d;
  // With q8, also as int8 for the integer GEMV (d a multiple of 32: each warp's 32 elements are one
  // block). Every thread takes the same turns, as warp_quantize_q8's shuffles need.
  for_block_elements<kNormAhead>(
      d, [&](int i) { return NormInputs{xt[i], weight[i]}; },
      [&](const NormInputs& e, int i, bool in) {
        const float v = in ? e.x * scale * e.weight : 0.0f;
        if (in) ot[i] = v;
        if (q8.q) warp_quantize_q8(v, (static_cast<std::size_t>(t) * d + i) / kWarp, in, q8);
      });
}

__global__ void add_rmsnorm_kernel(float* x, const float* delta, const float* delta_norm, const float* weight, int d, float eps,
                                   float* out, Q8Out q8) {
  dependent_launch_prologue();
  add_rmsnorm_row(blockIdx.x, x, delta, delta_norm, weight, d, eps, out, q8);
}

// The GEMV kernels' end: y[t][row] = the warp's sum of acc[t], for each token (every warp takes
// part in the sums; only an active one writes).
__device__ __forceinline__ void write_row_sums(const float (&acc)[kGemvMaxTokens], int T, bool active, float* y, int rows, int row) {
#pragma unroll
  for (int t = 0; t < kGemvMaxTokens; ++t) {
    if (t < T) {
      const float s = warp_sum(acc[t]);
      if (active && threadIdx.x % kWarp == 0) y[static_cast<std::size_t>(t) * rows + row] = s;
    }
  }
}

// A warp's share of one row of a float-decoded GEMV against every token's x, added to acc (before
// the warp's sum): each lane decodes 32-element chunks lane, lane + 32, ... and dots them with every
// token's x.
template <WeightFormat F>
__device__ __forceinline__ void float_row(const std::uint8_t* wr, bool active, int cols, const float* x, int T, float (&acc)[kGemvMaxTokens]) {
  const int lane = threadIdx.x % kWarp;
  float wc[32];
  for (int c = lane; active && c < cols / 32; c += kWarp) {
    decode_chunk<F>(wr, c, wc);
#pragma unroll
    for (int t = 0; t < kGemvMaxTokens; ++t) {
      if (t < T) {
        const float4* xc = reinterpret_cast<const float4*>(x + static_cast<std::size_t>(t) * cols + c * 32);
        float s = 0.0f;
#pragma unroll
        for (int i = 0; i < 8; ++i) {
          const float4 v = __ldg(xc + i);
          s += wc[4 * i] * v.x + wc[4 * i + 1] * v.y + wc[4 * i + 2] * v.z + wc[4 * i + 3] * v.w;
        }
        acc[t] += s;
      }
    }
  }
}

// One warp per row.
constexpr int kGemvWarps = 4;
template <WeightFormat F>
__global__ void __launch_bounds__(kGemvWarps * kWarp) gemv_kernel(const std::uint8_t* w, int rows, int cols, const float* x, int T,
                                                                  float* y) {
  dependent_launch_prologue();
  const int row = blockIdx.x * kGemvWarps + threadIdx.x / kWarp;
  // Warps past the last row stay to the end doing nothing rather than return: every warp of a
  // block then meets the same shuffles, which CPU runtimes of this code (HIP-CPU) need.
  const bool active = row < rows;
  const std::uint8_t* wr = w + format_row_bytes(F, cols) * static_cast<std::size_t>(active ? row : 0);
  float acc[kGemvMaxTokens] = {};
  float_row<F>(wr, active, cols, x, T, acc);
  write_row_sums(acc, T, active, y, rows, row);
}

// ---- integer GEMV: x quantized to int8 blocks of 32, dot products by dp4a ------------------------
//
// Why: the float kernel above reads every token's x as floats once per weight row (4 bytes of L1
// traffic per weight element, seven times a Q4_K row's own bytes) and spends ~4.7 instructions per
// element decoding and multiplying (its PTX); at Llama-3-8B's shape either alone takes about as long as the
// weights' stream from HBM. As int8 (quantize_q8), x costs 1 byte per element, and dp4a does four
// multiply-adds in one instruction on the weights' own integers.

// One warp per block of 32: scale max|x| / 127, round to nearest.
__global__ void quantize_q8_kernel(const float* x, std::size_t n_blocks, Q8Out out) {
  dependent_launch_prologue();
  const std::size_t b = static_cast<std::size_t>(blockIdx.x) * (blockDim.x / kWarp) + threadIdx.x / kWarp;
  const bool active = b < n_blocks;  // no early return: every warp meets the shuffles (see gemv_kernel)
  warp_quantize_q8(active ? x[b * kWarp + threadIdx.x % kWarp] : 0.0f, b, active, out);
}

// Byte k (0..11) of a Q4_K block's packed scales, which are bytes 4..15 of the block's first 16
// (head.y, head.z, head.w): selected from registers, not an array a lane would index dynamically.
struct Q4kHeadScaleBytes {
  uint4 head;
  __device__ int operator()(int k) const {
    const unsigned word = k < 4 ? head.y : (k < 8 ? head.z : head.w);
    return static_cast<int>((word >> (8 * (k % 4))) & 0xffu);
  }
};

// A warp's share of one Q4_K row against every token's x, added to acc (before the warp's sum):
// lane = (superblock lane / 4 of every 8, quarter g = lane % 4); the quarter's 32 bytes of nibbles
// hold sub-blocks 2g (low nibbles) and 2g + 1 (high), 64 elements against 64 int8 of each token's
// x. Weights stay in registers across the tokens.
__device__ __forceinline__ void q4k_row_q8(const std::uint8_t* wr, bool active, int cols, const std::int8_t* xq, const float2* xds, int T,
                                           float (&acc)[kGemvMaxTokens]) {
  constexpr int kNibbles = 0x0f0f0f0f;
  const int lane = threadIdx.x % kWarp;
  const int n_super = cols / 256, x_blocks = cols / 32, g = lane % 4;
  for (int sb = lane / 4; active && sb < n_super; sb += kWarp / 4) {
    const std::uint8_t* block = wr + static_cast<std::size_t>(sb) * 144;  // 144 = 9 x 16: aligned
    const uint4 head = *reinterpret_cast<const uint4*>(block);
    const uint4 qa = *reinterpret_cast<const uint4*>(block + 16 + 32 * g);
    const uint4 qb = *reinterpret_cast<const uint4*>(block + 32 + 32 * g);
    const float d = half_to_float(static_cast<std::uint16_t>(head.x & 0xffffu)), dmin = half_to_float(static_cast<std::uint16_t>(head.x >> 16));
    const int j = 2 * g;  // the low sub-block; j + 1 the high one
    int sc_lo, m_lo, sc_hi, m_hi;
    q4k_scale_min_of(j, Q4kHeadScaleBytes{head}, sc_lo, m_lo);
    q4k_scale_min_of(j + 1, Q4kHeadScaleBytes{head}, sc_hi, m_hi);
    const int q[8] = {static_cast<int>(qa.x), static_cast<int>(qa.y), static_cast<int>(qa.z), static_cast<int>(qa.w),
                      static_cast<int>(qb.x), static_cast<int>(qb.y), static_cast<int>(qb.z), static_cast<int>(qb.w)};
#pragma unroll
    for (int t = 0; t < kGemvMaxTokens; ++t) {
      if (t < T) {
        const int4* xt = reinterpret_cast<const int4*>(xq + static_cast<std::size_t>(t) * cols + sb * 256 + g * 64);
        const int4 x0 = __ldg(xt), x1 = __ldg(xt + 1), x2 = __ldg(xt + 2), x3 = __ldg(xt + 3);
        const int xl[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
        const int xh[8] = {x2.x, x2.y, x2.z, x2.w, x3.x, x3.y, x3.z, x3.w};
        int lo = 0, hi = 0;
#pragma unroll
        for (int i = 0; i < 8; ++i) {
          lo = __dp4a(q[i] & kNibbles, xl[i], lo);
          hi = __dp4a((q[i] >> 4) & kNibbles, xh[i], hi);
        }
        const float2 ds_lo = xds[static_cast<std::size_t>(t) * x_blocks + sb * 8 + j], ds_hi = xds[static_cast<std::size_t>(t) * x_blocks + sb * 8 + j + 1];
        acc[t] += d * (static_cast<float>(sc_lo) * ds_lo.x * static_cast<float>(lo) + static_cast<float>(sc_hi) * ds_hi.x * static_cast<float>(hi)) -
                  dmin * (static_cast<float>(m_lo) * ds_lo.y + static_cast<float>(m_hi) * ds_hi.y);
      }
    }
  }
}

// Token t's 32 int8 of x from element `at` (a multiple of 32) of its row of `cols`, as 8 words.
struct XChunk {
  int w[8];
};
__device__ __forceinline__ XChunk x_chunk(const std::int8_t* xq, int t, int cols, int at) {
  const int4* xt = reinterpret_cast<const int4*>(xq + static_cast<std::size_t>(t) * cols + at);
  const int4 x0 = __ldg(xt), x1 = __ldg(xt + 1);
  return {{x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w}};
}

// The dot product of 32 int8 weights (four to a word) with a chunk of x.
__device__ __forceinline__ int chunk_dot(const int (&v)[8], const XChunk& x) {
  int dot = 0;
#pragma unroll
  for (int i = 0; i < 8; ++i) dot = __dp4a(v[i], x.w[i], dot);
  return dot;
}

// The same for a Q5_K row (Q4_K's superblock with 32 bytes of fifth bits between the scales and
// the nibbles), mapped as Q6_K's: lane = (superblock lane / 8 of every 4, sub-block j = lane % 8).
// A sub-block's 32 levels (nibble | fifth bit << 4, 0..31) are rebuilt once, in 8 registers; two
// lanes read the same nibble bytes (low and high), all eight the same fifth bits (bit j of each).
// (Q4_K's mapping, a lane a pair of sub-blocks, held 16 words of levels: ptxas -v gave the decode
// launches, which take every format, 16-24 more registers and spills.)
__device__ __forceinline__ void q5k_row_q8(const std::uint8_t* wr, bool active, int cols, const std::int8_t* xq, const float2* xds, int T,
                                           float (&acc)[kGemvMaxTokens]) {
  const int lane = threadIdx.x % kWarp;
  const int n_super = cols / 256, x_blocks = cols / 32, j = lane % 8, shift = (j % 2) * 4;
  for (int sb = lane / 8; active && sb < n_super; sb += kWarp / 8) {
    const std::uint8_t* block = wr + static_cast<std::size_t>(sb) * 176;  // 176 = 11 x 16: aligned
    const uint4 head = *reinterpret_cast<const uint4*>(block);
    const uint4 fa = *reinterpret_cast<const uint4*>(block + 16), fb = *reinterpret_cast<const uint4*>(block + 32);
    const uint4 na = *reinterpret_cast<const uint4*>(block + 48 + 32 * (j / 2)), nb = *reinterpret_cast<const uint4*>(block + 64 + 32 * (j / 2));
    const float d = half_to_float(static_cast<std::uint16_t>(head.x & 0xffffu)), dmin = half_to_float(static_cast<std::uint16_t>(head.x >> 16));
    int sc, m;
    q4k_scale_min_of(j, Q4kHeadScaleBytes{head}, sc, m);
    const unsigned nibbles[8] = {na.x, na.y, na.z, na.w, nb.x, nb.y, nb.z, nb.w}, fifth[8] = {fa.x, fa.y, fa.z, fa.w, fb.x, fb.y, fb.z, fb.w};
    int v[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) v[i] = static_cast<int>(((nibbles[i] >> shift) & 0x0f0f0f0fu) | (((fifth[i] >> j) & 0x01010101u) << 4));
#pragma unroll
    for (int t = 0; t < kGemvMaxTokens; ++t) {
      if (t < T) {
        const int dot = chunk_dot(v, x_chunk(xq, t, cols, sb * 256 + j * 32));
        const float2 ds = xds[static_cast<std::size_t>(t) * x_blocks + sb * 8 + j];
        acc[t] += d * static_cast<float>(sc) * ds.x * static_cast<float>(dot) - dmin * static_cast<float>(m) * ds.y;
      }
    }
  }
}

// Four IQ4 levels as int8 bytes (what dp4a takes) from four level indices (0..15), one per byte of
// idx: __byte_perm looks the low 3 bits up in levels 0..7 and in levels 8..15 (two words each), and
// the fourth bit picks between the two, byte by byte.
__device__ __forceinline__ int iq4_levels4(unsigned idx) {
  const unsigned select = (idx & 0x7u) | ((idx >> 4) & 0x70u) | ((idx >> 8) & 0x700u) | ((idx >> 12) & 0x7000u);
  const unsigned low = __byte_perm(kIQ4LevelsFrom0, kIQ4LevelsFrom4, select);
  const unsigned high = __byte_perm(kIQ4LevelsFrom8, kIQ4LevelsFrom12, select);
  const unsigned upper = ((idx >> 3) & 0x01010101u) * 0xffu;
  return static_cast<int>((low & ~upper) | (high & upper));
}

// The same for an IQ4_XS row, mapped as Q5_K's: lane = (superblock lane / 8 of every 4, sub-block
// j = lane % 8). A sub-block's 32 levels are looked up once, in 8 registers (iq4_levels4); they are
// signed, as dp4a takes them, so no offset term.
__device__ __forceinline__ void iq4xs_row_q8(const std::uint8_t* wr, bool active, int cols, const std::int8_t* xq, const float2* xds, int T,
                                             float (&acc)[kGemvMaxTokens]) {
  const int lane = threadIdx.x % kWarp;
  const int n_super = cols / 256, x_blocks = cols / 32, j = lane % 8;
  for (int sb = lane / 8; active && sb < n_super; sb += kWarp / 8) {
    const std::uint8_t* block = wr + static_cast<std::size_t>(sb) * 136;  // 136 = 17 x 8: 8-aligned
    const uint2 qa = *reinterpret_cast<const uint2*>(block + 8 + 16 * j), qb = *reinterpret_cast<const uint2*>(block + 16 + 16 * j);
    const float scale = half_to_float(load_u16(block)) * static_cast<float>(iq4_xs_scale_of(block, j));
    const unsigned q[4] = {qa.x, qa.y, qb.x, qb.y};  // element l's index in the low nibble of byte l, l + 16's in the high
    int v[8];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      v[i] = iq4_levels4(q[i] & 0x0f0f0f0fu);
      v[i + 4] = iq4_levels4((q[i] >> 4) & 0x0f0f0f0fu);
    }
#pragma unroll
    for (int t = 0; t < kGemvMaxTokens; ++t) {
      if (t < T) {
        const int dot = chunk_dot(v, x_chunk(xq, t, cols, sb * 256 + j * 32));
        acc[t] += scale * xds[static_cast<std::size_t>(t) * x_blocks + sb * 8 + j].x * static_cast<float>(dot);
      }
    }
  }
}

// Four bytes at an address only 2-aligned (Q6_K's 210-byte blocks), as two 16-bit loads.
__device__ __forceinline__ unsigned load_u32_2aligned(const std::uint8_t* p) {
  const std::uint16_t* h = reinterpret_cast<const std::uint16_t*>(p);
  return static_cast<unsigned>(h[0]) | (static_cast<unsigned>(h[1]) << 16);
}

// A 32-element chunk's two 16-element scale groups against token t's x: levels v stored with
// `offset` added (unsigned bytes, four to a word), so (v - offset) . x = v . x - offset sum(x), the
// sums by dp4a against ones; returns sc0 * group 0's product + sc1 * group 1's.
__device__ __forceinline__ int offset_pair_dot(const int (&v)[8], const XChunk& x, int offset, int sc0, int sc1) {
  int dot0 = 0, dot1 = 0, sum0 = 0, sum1 = 0;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    dot0 = __dp4a(v[i], x.w[i], dot0);
    sum0 = __dp4a(0x01010101, x.w[i], sum0);
    dot1 = __dp4a(v[i + 4], x.w[i + 4], dot1);
    sum1 = __dp4a(0x01010101, x.w[i + 4], sum1);
  }
  return sc0 * (dot0 - offset * sum0) + sc1 * (dot1 - offset * sum1);
}

// The same for a Q6_K row: lane = (superblock lane / 8 of every 4, 32-element chunk j = lane % 8).
// A chunk's 6-bit values v (q = v - 32) are rebuilt from its low and high bits once, in registers;
// per token dp4a gives v . x and the sums of x over each 16-element scale group (offset_pair_dot).
__device__ __forceinline__ void q6k_row_q8(const std::uint8_t* wr, bool active, int cols, const std::int8_t* xq, const float2* xds, int T,
                                           float (&acc)[kGemvMaxTokens]) {
  const int lane = threadIdx.x % kWarp;
  const int n_super = cols / 256, x_blocks = cols / 32, j = lane % 8, half = j / 4, g = j % 4;
  const int low_shift = (g / 2) * 4, high_shift = 2 * g;
  for (int sb = lane / 8; active && sb < n_super; sb += kWarp / 8) {
    const std::uint8_t* b = wr + static_cast<std::size_t>(sb) * 210;
    const std::uint8_t* ql = b + 64 * half + (g & 1) * 32;
    const std::uint8_t* qh = b + 128 + 32 * half;
    const unsigned scales = load_u16(b + 192 + 8 * half + 2 * g);
    const int sc0 = static_cast<std::int8_t>(scales & 0xffu), sc1 = static_cast<std::int8_t>(scales >> 8);
    const float d = half_to_float(load_u16(b + 208));
    int v[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      v[i] = static_cast<int>(((load_u32_2aligned(ql + 4 * i) >> low_shift) & 0x0f0f0f0fu) |
                              (((load_u32_2aligned(qh + 4 * i) >> high_shift) & 0x03030303u) << 4));
    }
#pragma unroll
    for (int t = 0; t < kGemvMaxTokens; ++t) {
      if (t < T) {
        const int dot = offset_pair_dot(v, x_chunk(xq, t, cols, sb * 256 + j * 32), 32, sc0, sc1);
        acc[t] += d * xds[static_cast<std::size_t>(t) * x_blocks + sb * 8 + j].x * static_cast<float>(dot);
      }
    }
  }
}

// The same for a Q3_K row, mapped as Q6_K's (a lane a 32-element chunk j = 32h + c of its
// super-block): the chunk's levels + 4 (0..7) rebuilt once from qs (2 bits, shift 2c) and hmask
// (bit 4h + c), in registers; offset_pair_dot with offset 4.
__device__ __forceinline__ void q3k_row_q8(const std::uint8_t* wr, bool active, int cols, const std::int8_t* xq, const float2* xds, int T,
                                           float (&acc)[kGemvMaxTokens]) {
  const int lane = threadIdx.x % kWarp;
  const int n_super = cols / 256, x_blocks = cols / 32, j = lane % 8, h = j / 4, c = j % 4;
  for (int sb = lane / 8; active && sb < n_super; sb += kWarp / 8) {
    const std::uint8_t* b = wr + static_cast<std::size_t>(sb) * 110;  // 2-aligned only
    const int sc0 = q3k_scale_of(2 * j, b + 96), sc1 = q3k_scale_of(2 * j + 1, b + 96);
    const float d = half_to_float(load_u16(b + 108));
    int v[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      v[i] = static_cast<int>(((load_u32_2aligned(b + 32 + 32 * h + 4 * i) >> (2 * c)) & 0x03030303u) |
                              (((load_u32_2aligned(b + 4 * i) >> (4 * h + c)) & 0x01010101u) << 2));
    }
#pragma unroll
    for (int t = 0; t < kGemvMaxTokens; ++t) {
      if (t < T) {
        const int dot = offset_pair_dot(v, x_chunk(xq, t, cols, sb * 256 + j * 32), 4, sc0, sc1);
        acc[t] += d * xds[static_cast<std::size_t>(t) * x_blocks + sb * 8 + j].x * static_cast<float>(dot);
      }
    }
  }
}

// Q8_0 and Q4_0 rows (34- and 18-byte blocks of 32, only 2-aligned): lane = block lane, lane + 32,
// ...; Q4_0's values are nibbles - 8: (n - 8) . x = n . x - 8 sum(x).
template <WeightFormat F>
__device__ __forceinline__ void q8_0_or_q4_0_row_q8(const std::uint8_t* wr, bool active, int cols, const std::int8_t* xq, const float2* xds,
                                                    int T, float (&acc)[kGemvMaxTokens]) {
  constexpr int kBlockBytes = F == WeightFormat::Q8_0 ? 34 : 18;
  const int lane = threadIdx.x % kWarp;
  const int n_blocks = cols / 32;
  for (int blk = lane; active && blk < n_blocks; blk += kWarp) {
    const std::uint8_t* b = wr + static_cast<std::size_t>(blk) * kBlockBytes;
    const float d = half_to_float(load_u16(b));
    int v[8];  // the block's 32 values as int8, in element order
    if constexpr (F == WeightFormat::Q8_0) {
#pragma unroll
      for (int i = 0; i < 8; ++i) v[i] = static_cast<int>(load_u32_2aligned(b + 2 + 4 * i));
    } else {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const unsigned n = load_u32_2aligned(b + 2 + 4 * i);
        v[i] = static_cast<int>(n & 0x0f0f0f0fu);             // elements 4i..4i+3
        v[i + 4] = static_cast<int>((n >> 4) & 0x0f0f0f0fu);  // elements 16+4i..
      }
    }
#pragma unroll
    for (int t = 0; t < kGemvMaxTokens; ++t) {
      if (t < T) {
        const XChunk x = x_chunk(xq, t, cols, blk * 32);
        int dot = 0, sum = 0;
#pragma unroll
        for (int i = 0; i < 8; ++i) {
          dot = __dp4a(v[i], x.w[i], dot);
          if constexpr (F == WeightFormat::Q4_0) sum = __dp4a(0x01010101, x.w[i], sum);
        }
        if constexpr (F == WeightFormat::Q4_0) dot -= 8 * sum;
        acc[t] += d * xds[static_cast<std::size_t>(t) * n_blocks + blk].x * static_cast<float>(dot);
      }
    }
  }
}

// act(g) * u: SwiGLU's SiLU, or GeGLU's tanh GELU.
__device__ __forceinline__ float gated_value(float g, float u, bool gelu) {
  if (gelu) {
    constexpr float kSqrt2OverPi = 0.7978845608028654f;
    return 0.5f * g * (1.0f + tanhf(kSqrt2OverPi * (g + 0.044715f * g * g * g))) * u;
  }
  return g / (1.0f + expf(-g)) * u;
}

// The gate/up launch's end (GatedTail): the block that finishes its group of 32 rows last (of the
// group's blocks in both parts: `group_blocks` each) turns the group's gate rows into
// act(gate) * up for each of the T rows of `rows` values at gate and up, a warp a row, each warp's
// 32 values one int8 block of the down projection's input (q8, laid out as gate).
__device__ void gated_tail(const GatedTail& tail, int* counter, float* gate, const float* up, int rows, int group, int T, const Q8Out& q8) {
  const int group_rows = min(kWarp, rows - group * kWarp);
  if (!last_to_arrive(counter, 2 * ((group_rows + kGemvWarps - 1) / kGemvWarps))) return;
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  const int r = group * kWarp + lane;
  for (int t0 = 0; t0 < T; t0 += kGemvWarps) {  // every warp the same turns (see gemv_kernel)
    const int t = t0 + warp;
    const bool in = t < T && r < rows;
    const std::size_t at = static_cast<std::size_t>(t) * rows + r;
    const float v = in ? gated_value(__ldcg(gate + at), __ldcg(up + at), tail.gelu) : 0.0f;
    if (in) gate[at] = v;
    if (q8.q) warp_quantize_q8(v, (static_cast<std::size_t>(t) * rows + group * kWarp) / kWarp, t < T, q8);
  }
}

// One warp per row of the parts' rows taken in turn (q, k and v, or gate and up, in one launch: a
// decode step is many small kernels, and each launch costs a few microseconds on its own); a
// block's warps all in one part. Returns the block's part and its block index within it.
// kRounds: T may pass kGemvMaxTokens, taken in rounds of that many (an instance of its own: the
// loop in the decode launches cost them registers by ptxas, 64 -> 72 for the plain one, and spills
// in the q/k/v one).
struct GemvBlock {
  int part, block_in_part;
};
template <bool kRounds = false>
__device__ __forceinline__ GemvBlock gemv_q8_block(const GemvParts& parts, const std::int8_t* xq, const float2* xds, int T) {
  // Selected by branches, not an index: a dynamic index would copy the parameters to local memory.
  const int b = static_cast<int>(blockIdx.x);
  const int blocks0 = (parts.part[0].rows + kGemvWarps - 1) / kGemvWarps, blocks1 = (parts.part[1].rows + kGemvWarps - 1) / kGemvWarps;
  GemvPart part = parts.part[0];
  GemvBlock which{0, b};
  if (parts.n > 2 && b >= blocks0 + blocks1) {
    part = parts.part[2], which = {2, b - blocks0 - blocks1};
  } else if (parts.n > 1 && b >= blocks0) {
    part = parts.part[1], which = {1, b - blocks0};
  }
  const int row = which.block_in_part * kGemvWarps + threadIdx.x / kWarp;
  const bool active = row < part.rows;  // no early return (see gemv_kernel)
  const int cols = parts.cols;
  const std::uint8_t* wr = part.w + format_row_bytes(part.format, cols) * static_cast<std::size_t>(active ? row : 0);
  const auto row_sums = [&](const std::int8_t* xq_at, const float2* xds_at, int n, float* y) {
    float acc[kGemvMaxTokens] = {};
    switch (part.format) {  // the same for the whole warp: no divergence
      case WeightFormat::Q4_K: q4k_row_q8(wr, active, cols, xq_at, xds_at, n, acc); break;
      case WeightFormat::Q5_K: q5k_row_q8(wr, active, cols, xq_at, xds_at, n, acc); break;
      case WeightFormat::Q6_K: q6k_row_q8(wr, active, cols, xq_at, xds_at, n, acc); break;
      case WeightFormat::IQ4_XS: iq4xs_row_q8(wr, active, cols, xq_at, xds_at, n, acc); break;
      case WeightFormat::Q3_K: q3k_row_q8(wr, active, cols, xq_at, xds_at, n, acc); break;
      case WeightFormat::Q8_0: q8_0_or_q4_0_row_q8<WeightFormat::Q8_0>(wr, active, cols, xq_at, xds_at, n, acc); break;
      default: q8_0_or_q4_0_row_q8<WeightFormat::Q4_0>(wr, active, cols, xq_at, xds_at, n, acc); break;
    }
    write_row_sums(acc, n, active, y, part.rows, row);
  };
  if constexpr (kRounds) {
    // The row comes from HBM in the first round and from L1/L2 in the others (a warp's row is a
    // few KB), where a launch a round would stream every matrix from HBM again.
    for (int t0 = 0; t0 < T; t0 += kGemvMaxTokens) {
      row_sums(xq + static_cast<std::size_t>(t0) * cols, xds + static_cast<std::size_t>(t0) * (cols / 32), min(kGemvMaxTokens, T - t0),
               part.y + static_cast<std::size_t>(t0) * part.rows);
    }
  } else {
    row_sums(xq, xds, T, part.y);
  }
  return which;
}

// kNormTail: the launch ends with parts.norm's work (a template parameter, so that the other
// launches keep their registers). Eight blocks an SM: ptxas -v (sm_90) gives both instances 64
// registers with no spills; unbounded, Q5_K's branch took the plain one from 64 to 72 (seven
// blocks), and the norm tail's was at 72.
template <bool kNormTail>
__global__ void __launch_bounds__(kGemvWarps * kWarp, 8) gemv_q8_parts_kernel(GemvParts parts, const std::int8_t* xq, const float2* xds, int T) {
  dependent_launch_prologue();
  const GemvBlock which = gemv_q8_block(parts, xq, xds, T);
  if (parts.gated.arrivals) {
    const int group = which.block_in_part * kGemvWarps / kWarp;
    gated_tail(parts.gated, parts.gated.arrivals + group, parts.part[0].y, parts.part[1].y, parts.part[0].rows, group, T, parts.gated.q8);
  }
  const NormTail& norm = parts.norm;
  if (kNormTail && last_to_arrive(norm.arrivals, static_cast<int>(gridDim.x))) {
    add_rmsnorm_row(0, norm.x, parts.part[0].y, norm.delta_norm, norm.weight, norm.d, norm.eps, norm.out, norm.q8);
  }
}

// Batches past kGemvMaxTokens tokens (no tails: those are decode steps' launches). Six blocks an SM:
// ptxas gives the loop 128 registers unbounded (four blocks, 16 warps to hide HBM's latency), 80 with
// no spills at six, and spills at eight.
__global__ void __launch_bounds__(kGemvWarps * kWarp, 6) gemv_q8_rounds_kernel(GemvParts parts, const std::int8_t* xq, const float2* xds, int T) {
  dependent_launch_prologue();
  gemv_q8_block<true>(parts, xq, xds, T);
}

// ---- mixtures of experts, routed on the device -----------------------------------------------

// One warp per token: route_experts' choice (the k largest logits, the lower index first among
// equals; NaN counts as -inf, so k distinct experts are always chosen) by k rounds of a warp
// argmax over the experts not yet taken, lane i keeping choice i; written in expert order.
// Lane i holds experts i, i + 32, ... in registers (all loaded at once) and which of them are
// taken as bits. (They were in shared memory, loaded one at a time: each of the k rounds then read
// a lane's experts and their flags from it, ~4 x 2 shared loads a round in a row at 128 experts,
// an estimated 1-2 µs a layer on the critical path at decode, 8 rounds for Qwen3-30B-A3B's k.)
__global__ void route_experts_kernel(const float* logits, int n_expert, int k, bool softmax_over_all, ExpertRoutes routes) {
  dependent_launch_prologue();
  const int t = blockIdx.x, lane = threadIdx.x;
  const float* row = logits + static_cast<std::size_t>(t) * n_expert;
  // Past the row: -inf, which loses every tie to an expert of the row by index (k <= n_expert).
  float l[kRouteExpertsPerLane];
#pragma unroll
  for (int j = 0; j < kRouteExpertsPerLane; ++j) {
    const int e = lane + j * kWarp;
    const float v = e < n_expert ? row[e] : -INFINITY;
    l[j] = isnan(v) ? -INFINITY : v;
  }
  unsigned taken = 0;  // bit j: expert lane + 32 j chosen
  int mine = -1;  // lane i < k: choice i's expert
  float mine_logit = -INFINITY, max = -INFINITY;
  for (int i = 0; i < k; ++i) {
    float best = -INFINITY;
    int best_e = INT_MAX;
#pragma unroll
    for (int j = 0; j < kRouteExpertsPerLane; ++j) {
      const int e = lane + j * kWarp;
      if (!(taken >> j & 1u) && (l[j] > best || (l[j] == best && e < best_e))) best = l[j], best_e = e;
    }
    for (int o = kWarp / 2; o > 0; o /= 2) {
      const float other = __shfl_xor_sync(0xffffffffu, best, o);
      const int other_e = __shfl_xor_sync(0xffffffffu, best_e, o);
      if (other > best || (other == best && other_e < best_e)) best = other, best_e = other_e;
    }
    if (best_e != INT_MAX && best_e % kWarp == lane) taken |= 1u << (best_e / kWarp);
    if (lane == i) mine = best_e, mine_logit = best;
    if (i == 0) max = best;
  }
  const float weight = lane < k ? expf(mine_logit - max) : 0.0f;
  float denominator = 0.0f;
  if (softmax_over_all) {
#pragma unroll
    for (int j = 0; j < kRouteExpertsPerLane; ++j) {
      if (lane + j * kWarp < n_expert) denominator += expf(l[j] - max);
    }
  } else {
    denominator = weight;
  }
  denominator = warp_sum(denominator);
  int rank = 0;  // among the chosen, by expert
  for (int j = 0; j < k; ++j) rank += __shfl_sync(0xffffffffu, mine, j) < mine;
  if (lane < k) {
    routes.experts[t * k + rank] = mine;
    routes.weights[t * k + rank] = weight / denominator;
  }
}

// Each (token, chosen expert) pair, blockIdx.y, through its expert's matrix: one warp per row of
// the parts' rows taken in turn (gate and up in one launch), the pair's x row pair / pairs_per_x;
// kInteger: the quantized formats by dp4a on x as int8, else the float formats on x as floats.
template <bool kInteger>
__global__ void __launch_bounds__(kGemvWarps * kWarp) gemv_experts_kernel(ExpertGemv g, const std::int32_t* experts, const float* x,
                                                                          const std::int8_t* xq, const float2* xds) {
  dependent_launch_prologue();
  const int pair = static_cast<int>(blockIdx.y);
  const int row_blocks = (g.rows + kGemvWarps - 1) / kGemvWarps;
  const bool second = g.n > 1 && static_cast<int>(blockIdx.x) >= row_blocks;
  const ExpertMatrices m = second ? g.part[1] : g.part[0];
  const int row = (static_cast<int>(blockIdx.x) - (second ? row_blocks : 0)) * kGemvWarps + threadIdx.x / kWarp;
  const bool active = row < g.rows;  // no early return (see gemv_kernel)
  const std::uint8_t* wr = m.w + m.stride * static_cast<std::size_t>(experts[pair]) +
                           format_row_bytes(m.format, g.cols) * static_cast<std::size_t>(active ? row : 0);
  const std::size_t x_row = static_cast<std::size_t>(pair / g.pairs_per_x);
  float acc[kGemvMaxTokens] = {};
  if constexpr (kInteger) {
    const std::int8_t* q = xq + x_row * g.cols;
    const float2* ds = xds + x_row * (g.cols / 32);
    switch (m.format) {
      case WeightFormat::Q4_K: q4k_row_q8(wr, active, g.cols, q, ds, 1, acc); break;
      case WeightFormat::Q5_K: q5k_row_q8(wr, active, g.cols, q, ds, 1, acc); break;
      case WeightFormat::Q6_K: q6k_row_q8(wr, active, g.cols, q, ds, 1, acc); break;
      case WeightFormat::IQ4_XS: iq4xs_row_q8(wr, active, g.cols, q, ds, 1, acc); break;
      case WeightFormat::Q3_K: q3k_row_q8(wr, active, g.cols, q, ds, 1, acc); break;
      case WeightFormat::Q8_0: q8_0_or_q4_0_row_q8<WeightFormat::Q8_0>(wr, active, g.cols, q, ds, 1, acc); break;
      default: q8_0_or_q4_0_row_q8<WeightFormat::Q4_0>(wr, active, g.cols, q, ds, 1, acc); break;
    }
  } else {
    const float* xr = x + x_row * g.cols;
    switch (m.format) {
      case WeightFormat::F16: float_row<WeightFormat::F16>(wr, active, g.cols, xr, 1, acc); break;
      case WeightFormat::BF16: float_row<WeightFormat::BF16>(wr, active, g.cols, xr, 1, acc); break;
      default: float_row<WeightFormat::F32>(wr, active, g.cols, xr, 1, acc); break;
    }
  }
  write_row_sums(acc, 1, active, m.y + static_cast<std::size_t>(pair) * g.rows, g.rows, row);
  if (g.gated.arrivals) {  // each pair's gate and up rows are a token's (GatedTail)
    const int group = (static_cast<int>(blockIdx.x) - (second ? row_blocks : 0)) * kGemvWarps / kWarp;
    const std::size_t first = static_cast<std::size_t>(pair) * g.rows;
    const Q8Out q8 = g.gated.q8.q ? Q8Out{g.gated.q8.q + first, g.gated.q8.scale_sum + first / kWarp} : Q8Out{};
    gated_tail(g.gated, g.gated.arrivals + pair * ((g.rows + kWarp - 1) / kWarp) + group, g.part[0].y + first, g.part[1].y + first, g.rows,
               group, 1, q8);
  }
}

// out[t] = sum over token t's pairs, in expert order (the CPU's order), of weight * y[pair].
__global__ void moe_combine_kernel(const float* y, ExpertRoutes routes, int k, int d, float* out) {
  dependent_launch_prologue();
  const int t = blockIdx.x;
  for (int i = threadIdx.x; i < d; i += blockDim.x) {
    float sum = 0.0f;
    for (int j = 0; j < k; ++j) {
      const std::size_t pair = static_cast<std::size_t>(t) * k + j;
      sum += routes.weights[pair] * y[pair * d + i];
    }
    out[static_cast<std::size_t>(t) * d + i] = sum;
  }
}

// Float formats' rows of any length (not whole 32-element chunks), element by element: slower, and
// only small models have them (stories260K's FFN of 172).
__global__ void __launch_bounds__(kGemvWarps * kWarp) gemv_elements_kernel(const std::uint8_t* w, WeightFormat format, int rows, int cols,
                                                                           const float* x, int T, float* y) {
  dependent_launch_prologue();
  const int lane = threadIdx.x % kWarp;
  const int row = blockIdx.x * kGemvWarps + threadIdx.x / kWarp;
  const bool active = row < rows;
  const std::uint8_t* wr = w + format_row_bytes(format, cols) * static_cast<std::size_t>(active ? row : 0);
  float acc[kGemvMaxTokens] = {};
  for (int k = lane; active && k < cols; k += kWarp) {
    const float wk = decode_element(format, wr, k);
#pragma unroll
    for (int t = 0; t < kGemvMaxTokens; ++t) {
      if (t < T) acc[t] += wk * x[static_cast<std::size_t>(t) * cols + k];
    }
  }
  write_row_sums(acc, T, active, y, rows, row);
}

__global__ void dequantize_elements_kernel(const std::uint8_t* w, WeightFormat format, int rows, int cols, __half* out) {
  dependent_launch_prologue();
  const std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= static_cast<std::size_t>(rows) * cols) return;
  const std::size_t row = i / cols;
  out[i] = __float2half(decode_element(format, w + format_row_bytes(format, cols) * row, static_cast<int>(i % cols)));
}

__global__ void dequantize_kernel(const std::uint8_t* w, WeightFormat format, int rows, int cols, __half* out) {
  dependent_launch_prologue();
  const std::size_t chunks_per_row = cols / 32;
  const std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= chunks_per_row * rows) return;
  const std::size_t row = i / chunks_per_row;
  const int c = static_cast<int>(i % chunks_per_row);
  float chunk[32];
  decode_chunk(format, w + format_row_bytes(format, cols) * row, c, chunk);
  __half* o = out + row * cols + c * 32;
  for (int l = 0; l < 32; ++l) o[l] = __float2half(chunk[l]);
}

__global__ void float_to_half_kernel(const float* x, std::size_t n, __half* out) {
  dependent_launch_prologue();
  const std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) out[i] = __float2half(x[i]);
}

// qkv_post's work for one (token, head) by one warp (h: q heads first, then the KV heads, keys and
// values together): biases, the head's norm, RoPE, then q rotated in place or the key and value
// stored at the token's slot. `head`: the warp's kMaxHeadDim floats of shared memory. q, k and v
// are read past L1 (__ldcg): other blocks of the same launch may have written them (gemv_q8_qkv).
// Every warp of the block calls it the same number of times (inactive ones with active false: the
// shuffles and warp barriers line up across the block, as CPU runtimes of this code need).
__device__ void post_head(const QkvPost& p, const StepMeta& meta, const DeviceKv& kv, int t, int h, bool active, float* head) {
  const int lane = threadIdx.x % kWarp, hd = p.head_dim;
  const bool is_q = h < p.n_head;
  const int kh = h - p.n_head;
  const std::size_t q_stride = p.in_stride ? p.in_stride : p.n_head * hd, kv_stride = p.in_stride ? p.in_stride : p.n_head_kv * hd;
  const float* src = !active ? nullptr : is_q ? (p.q_in ? p.q_in : p.q) + t * q_stride + h * hd : p.k + t * kv_stride + kh * hd;
  const float* bias = is_q ? (p.bq ? p.bq + h * hd : nullptr) : (p.bk ? p.bk + kh * hd : nullptr);
  const float* norm = is_q ? p.q_norm : p.k_norm;
  // A lane's elements all loaded before the first is used or stored (a store between two loads
  // would keep the compiler from sending the second before the first returns), and a key head's
  // values and KV slot with them: this runs in the q/k/v launch's last blocks, on decode's critical
  // path, where one wait an element was ~12 waits a head.
  constexpr int kPerLane = kMaxHeadDim / kWarp;
  const float* v = is_q || !active ? nullptr : p.v + t * kv_stride + kh * hd;
  float in[kPerLane];
  __half value_in[kPerLane];  // as stored (fewer registers held across the rope's sincosf)
#pragma unroll
  for (int j = 0; j < kPerLane; ++j) {
    const int i = lane + j * kWarp;
    in[j] = active && i < hd ? __ldcg(src + i) + (bias ? bias[i] : 0.0f) : 0.0f;
    value_in[j] = __float2half(v && i < hd ? __ldcg(v + i) + (p.bv ? p.bv[kh * hd + i] : 0.0f) : 0.0f);
  }
  const int slot = v ? meta.slots[t] : 0;
  const int block = v ? meta.tables[meta.table_start[t] + slot / kv.block_tokens] : 0;
#pragma unroll
  for (int j = 0; j < kPerLane; ++j) {
    if (active && lane + j * kWarp < hd) head[lane + j * kWarp] = in[j];
  }
  __syncwarp();
  if (p.q_norm || p.k_norm) {  // the same on every warp of the block
    float ss = 0.0f;
    for (int i = lane; active && norm && i < hd; i += kWarp) ss += head[i] * head[i];
    const float scale = rsqrtf(warp_sum(ss) / hd + p.eps);
    for (int i = lane; active && norm && i < hd; i += kWarp) head[i] = head[i] * scale * norm[i];
    __syncwarp();
  }
  const int half = p.n_rot / 2;
  const float position = active ? static_cast<float>(meta.positions[t]) : 0.0f;
  for (int i = lane; active && i < half; i += kWarp) {
    const int a = p.neox ? i : 2 * i, b = p.neox ? i + half : 2 * i + 1;
    const float theta = position * p.inv_freq[i];
    // Accurate sine and cosine (not the fast intrinsics): angles reach tens of thousands of radians.
    float s, c;
    sincosf(theta, &s, &c);
    c *= p.attn_factor, s *= p.attn_factor;
    const float x0 = head[a], x1 = head[b];
    head[a] = x0 * c - x1 * s;
    head[b] = x0 * s + x1 * c;
  }
  __syncwarp();
  if (!active) return;
  if (is_q) {
    float* dst = p.q + (static_cast<std::size_t>(t) * p.n_head + h) * hd;
    for (int i = lane; i < hd; i += kWarp) dst[i] = head[i];
    return;
  }
  const std::size_t row = (static_cast<std::size_t>(kh) * kv.block_tokens + slot % kv.block_tokens) * hd;
  __half* key = const_cast<__half*>(kv_part(kv, block, p.layer, 0)) + row;
  __half* value = const_cast<__half*>(kv_part(kv, block, p.layer, 1)) + row;
#pragma unroll
  for (int j = 0; j < kPerLane; ++j) {
    const int i = lane + j * kWarp;
    if (i < hd) key[i] = __float2half(head[i]), value[i] = value_in[j];
  }
}

// A warp per (token, head), kPostWarps a block.
constexpr int kPostWarps = 4;
__global__ void __launch_bounds__(kPostWarps * kWarp) qkv_post_kernel(QkvPost p, StepMeta meta, DeviceKv kv, int T) {
  dependent_launch_prologue();
  __shared__ float heads[kPostWarps][kMaxHeadDim];
  const int warp = threadIdx.x / kWarp, heads_per_token = p.n_head + p.n_head_kv;
  const int pair = blockIdx.x * kPostWarps + warp;
  const bool active = pair < T * heads_per_token;
  post_head(p, meta, kv, active ? pair / heads_per_token : 0, active ? pair % heads_per_token : 0, active, heads[warp]);
}

// The q/k/v launch with qkv_post's work at its end (gemv_q8_qkv): the last of a q head's blocks
// rotates that head for every token; the last of a KV head's key and value blocks (one counter for
// both) stores its keys and values. A warp a token; a block never straddles two heads (head_dim a
// multiple of kGemvWarps). Nine blocks an SM: ptxas -v gives 56 registers and no spills on sm_90 and
// sm_80; unbounded, IQ4_XS's branch made sm_80's 48 registers with 64 bytes of spill loads (sm_90's
// stayed at 56).
__global__ void __launch_bounds__(kGemvWarps * kWarp, 9) gemv_q8_qkv_kernel(GemvParts parts, const std::int8_t* xq, const float2* xds, int T,
                                                                         QkvPost post, StepMeta meta, DeviceKv kv, int* arrivals) {
  dependent_launch_prologue();
  const GemvBlock which = gemv_q8_block(parts, xq, xds, T);
  const bool is_q = which.part == 0;
  const int head = which.block_in_part * kGemvWarps / post.head_dim, blocks_a_head = post.head_dim / kGemvWarps;
  if (!last_to_arrive(arrivals + (is_q ? head : post.n_head + head), is_q ? blocks_a_head : 2 * blocks_a_head)) return;
  __shared__ float heads[kGemvWarps][kMaxHeadDim];
  const int warp = threadIdx.x / kWarp;
  for (int t0 = 0; t0 < T; t0 += kGemvWarps) {  // every warp the same turns
    const int t = t0 + warp;
    post_head(post, meta, kv, t < T ? t : 0, is_q ? head : post.n_head + head, t < T, heads[warp]);
  }
}

// What query token t sees of its sequence: positions [first, context_end) and then, for a tree
// node (its tree's context reckoned from there, the window too, as on the CPU), of the tree's
// slots context_end + j only those of its ancestors' bits j (its own among them); it scans up to
// `end`. A default view sees nothing.
struct QueryView {
  int first = 0, context_end = 0, end = 0;
  std::uint64_t ancestors = 0;
  // Whether a position in [first, end) is seen.
  __device__ bool sees_within(int pos) const { return pos < context_end || (ancestors >> (pos - context_end) & 1); }
  __device__ bool sees(int pos) const { return pos >= first && pos < end && sees_within(pos); }
};
__device__ QueryView query_view(const StepMeta& meta, int t, int window) {
  QueryView v;
  const int tree = meta.tree_context[t];
  v.ancestors = tree < 0 ? 0 : meta.tree_ancestors[2 * t] | static_cast<std::uint64_t>(meta.tree_ancestors[2 * t + 1]) << 32;
  v.context_end = tree < 0 ? meta.positions[t] + 1 : tree;
  v.end = tree < 0 ? v.context_end : tree + 64 - __clzll(static_cast<long long>(v.ancestors));
  v.first = window > 0 && v.context_end > window ? v.context_end - window : 0;
  return v;
}

// A query-key dot product as the softmax takes it: scaled, then Gemma 2's soft cap where set.
__device__ __forceinline__ float attention_score(const AttentionArgs& a, float dot) {
  const float score = dot * a.scale;
  return a.softcap > 0.0f ? a.softcap * tanhf(score / a.softcap) : score;
}

// What a tile scans: the union [x, y) of its rows' spans (every position of it in the sequence's
// table: pack_step's tiles are of one sequence and one tree context); each row keeps its own view.
__device__ int2 tile_span(const StepMeta& meta, int first_token, int n_tokens, int window) {
  int begin = INT_MAX, end = 0;
  for (int r = 0; r < n_tokens; ++r) {
    const QueryView v = query_view(meta, first_token + r, window);
    begin = min(begin, v.first), end = max(end, v.end);
  }
  return make_int2(begin, end);
}

// Decode's attention and prefill's lone tokens: one block (4 warps) per (token, head, split). A
// warp takes 8 positions a turn (the block 32), 4 lanes a position for the key's dot product and
// every lane a piece of each of the 8 values, and sends a turn's key and value loads out before it
// uses the first, so that a turn waits on memory about once. (A position at a time, a warp waited
// three times for each: on the block table, the key, then the value; the KV comes from HBM at
// decode, the weights between two steps having gone through L2, so a 64-position chunk's 16
// positions a warp were ~48 memory latencies, an estimated ~15 µs a layer.)
constexpr int kAttentionWarps = 4;
constexpr int kTurnPositions = 8;
constexpr int kLanesPerPosition = kWarp / kTurnPositions;
// The two halves packed in 32 bits (the lower address in the low bits), as floats.
__device__ __forceinline__ float low_half(unsigned two) { return half_to_float(static_cast<std::uint16_t>(two & 0xffffu)); }
__device__ __forceinline__ float high_half(unsigned two) { return half_to_float(static_cast<std::uint16_t>(two >> 16)); }
// kHalves halves loaded at once, and their floats.
template <int kHalves> struct HalvesWord;
template <> struct HalvesWord<8> { using type = uint4; };
template <> struct HalvesWord<4> { using type = uint2; };
template <> struct HalvesWord<2> { using type = unsigned; };
__device__ __forceinline__ void unpack_halves(unsigned w, float* f) { f[0] = low_half(w), f[1] = high_half(w); }
__device__ __forceinline__ void unpack_halves(uint2 w, float* f) { unpack_halves(w.x, f), unpack_halves(w.y, f + 2); }
__device__ __forceinline__ void unpack_halves(uint4 w, float* f) {
  unpack_halves(w.x, f), unpack_halves(w.y, f + 2), unpack_halves(w.z, f + 4), unpack_halves(w.w, f + 6);
}
// (t, h)'s splits merged (their partial softmax states, partials' layout: attention_kernel's end;
// `query`: t's place in the launch, by which its partials are found) into its output row, with q8
// (head_dim a multiple of 32) as int8 too: each warp's 32 outputs are one int8 block of the o
// projection's input. The partials are read past L1 (__ldcg): other blocks of the same launch may
// have written them (attention with arrivals). A thread a split reads the splits' largest scores
// and sums all at once, and the outputs' sums over the splits have their loads unrolled ahead of
// the adds: a split at a time, reading a split's sum and only then its largest score, had waited
// on L2 ~6 times a split (an estimated 10-20 µs a layer at decode's 16 splits).
__device__ void merge_splits(const AttentionArgs& a, int query, int t, int h, const Q8Out& q8) {
  const int hd = a.head_dim, stride = hd + 2;
  const float* parts = a.partials + (static_cast<std::size_t>(query) * a.n_head + h) * a.n_splits * stride;
  __shared__ float split_top[kMaxAttentionSplits], split_weight[kMaxAttentionSplits];  // weight: of its partials, e^(its top - top)
  float top = -FLT_MAX;
  for (int s = threadIdx.x; s < a.n_splits; s += blockDim.x) {
    const float m = __ldcg(parts + s * stride + hd), l = __ldcg(parts + s * stride + hd + 1);
    split_top[s] = m, split_weight[s] = l;
    if (l > 0.0f) top = fmaxf(top, m);
  }
  top = block_max(top);  // its barriers make every split's top and sum seen
  float total = 0.0f;
  for (int s = threadIdx.x; s < a.n_splits; s += blockDim.x) {
    const float l = split_weight[s], weight = l > 0.0f ? __expf(split_top[s] - top) : 0.0f;
    total += l * weight;
    split_weight[s] = weight;
  }
  total = block_sum(total);  // and every weight
  const std::size_t row = (static_cast<std::size_t>(t) * a.n_head + h) * hd;
  float* out = a.out + row;
  // Every thread takes the same turns (the shuffles line up across the block, as CPU runtimes of
  // this code need; see gemv_kernel); with q8, hd is a multiple of 32, so a warp's lanes are all
  // in or all out.
  for (int base = 0; base < hd; base += blockDim.x) {
    const int d = base + static_cast<int>(threadIdx.x);
    const bool in = d < hd;
    float sum = 0.0f;
    if (in) {
      // A split with nothing seen wrote zeros, and its weight is 0.
#pragma unroll 8
      for (int s = 0; s < a.n_splits; ++s) sum += __ldcg(parts + s * stride + d) * split_weight[s];
    }
    const float v = total > 0.0f ? sum / total : 0.0f;
    if (in) out[d] = v;
    if (q8.q) warp_quantize_q8(v, (row + base + threadIdx.x) / kWarp, in, q8);
  }
}

// kListed: the blocks' x indexes a.tokens (a template parameter, so that decode's kernel keeps its
// registers). kMaxHd: the largest head the instance takes (its registers); kKeyHalves: the halves a
// lane loads of a key at once, 8 where the head is a multiple of 8 (16-byte loads, a value's 8
// bytes), else 2 (a key's and a value's 4 bytes).
template <bool kListed, int kMaxHd, int kKeyHalves>
__global__ void __launch_bounds__(kAttentionWarps * kWarp) attention_kernel(AttentionArgs a, StepMeta meta, DeviceKv kv, Q8Out q8) {
  constexpr int kValueHalves = kKeyHalves == 8 ? 4 : 2;
  constexpr int kKeyPieces = kMaxHd / kKeyHalves / kLanesPerPosition;  // a lane's pieces of a key, at most
  constexpr int kValuePieces = kMaxHd / kValueHalves / kWarp;          // and of each value
  using KeyWord = typename HalvesWord<kKeyHalves>::type;
  using ValueWord = typename HalvesWord<kValueHalves>::type;
  dependent_launch_prologue();
  const int query = blockIdx.x, t = kListed ? a.tokens[query] : query, h = blockIdx.y, split = blockIdx.z;
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp, hd = a.head_dim;
  const int kh = h / (a.n_head / a.n_head_kv), group = lane / kLanesPerPosition, in_group = lane % kLanesPerPosition;
  const QueryView view = query_view(meta, t, a.window);
  const int begin = max(view.first, split * a.chunk), stop = min(view.end, (split + 1) * a.chunk);
  alignas(16) __shared__ float q[kMaxHd];
  const float* qh = a.q + (static_cast<std::size_t>(t) * a.n_head + h) * hd;
  for (int d = threadIdx.x; d < hd; d += blockDim.x) q[d] = qh[d];
  __syncthreads();
  const int key_pieces = hd / kKeyHalves, value_pieces = hd / kValueHalves;
  float acc[kValuePieces][kValueHalves] = {};
  float m = -FLT_MAX, l = 0.0f;
  const std::int32_t* table = meta.tables + meta.table_start[t];
  const std::size_t part = kv.part_elems();
  // Every warp takes the same turns (the last may find no position): the shuffles inside then line
  // up across the block, as CPU runtimes of this code (HIP-CPU) need.
  const int turns = begin < stop ? (stop - begin + kAttentionWarps * kTurnPositions - 1) / (kAttentionWarps * kTurnPositions) : 0;
  for (int turn = 0; turn < turns; ++turn) {
    const int pos = begin + (turn * kAttentionWarps + warp) * kTurnPositions + group;
    const int valid = pos < stop && view.sees_within(pos);  // begin >= first, stop <= end
    // The group's key row (its value row is a part further on).
    const __half* key_row =
        valid ? kv_part(kv, table[pos / kv.block_tokens], a.layer, 0) + (static_cast<std::size_t>(kh) * kv.block_tokens + pos % kv.block_tokens) * hd
              : kv.data;
    KeyWord key[kKeyPieces];
#pragma unroll
    for (int i = 0; i < kKeyPieces; ++i) {
      const int c = in_group + i * kLanesPerPosition;
      key[i] = valid && c < key_pieces ? *reinterpret_cast<const KeyWord*>(key_row + c * kKeyHalves) : KeyWord{};
    }
    ValueWord value[kTurnPositions][kValuePieces];
#pragma unroll
    for (int p = 0; p < kTurnPositions; ++p) {
      const __half* value_row = reinterpret_cast<const __half*>(
                                    __shfl_sync(0xffffffffu, reinterpret_cast<unsigned long long>(key_row), p * kLanesPerPosition)) +
                                part;
      const int seen = __shfl_sync(0xffffffffu, valid, p * kLanesPerPosition);
#pragma unroll
      for (int i = 0; i < kValuePieces; ++i) {
        const int c = lane + i * kWarp;
        value[p][i] = seen && c < value_pieces ? *reinterpret_cast<const ValueWord*>(value_row + c * kValueHalves) : ValueWord{};
      }
    }
    float dot = 0.0f;
#pragma unroll
    for (int i = 0; i < kKeyPieces; ++i) {
      const int c = in_group + i * kLanesPerPosition;
      if (c < key_pieces) {
        float k[kKeyHalves];
        unpack_halves(key[i], k);
#pragma unroll
        for (int j = 0; j < kKeyHalves; ++j) dot += q[c * kKeyHalves + j] * k[j];
      }
    }
    for (int o = 1; o < kLanesPerPosition; o *= 2) dot += __shfl_xor_sync(0xffffffffu, dot, o);  // the group's lanes' sums
    const float score = valid ? attention_score(a, dot) : -FLT_MAX;
    const float m_new = fmaxf(m, warp_max(score));
    const float w = valid ? __expf(score - m_new) : 0.0f, correction = __expf(m - m_new);
    l = l * correction + warp_sum(in_group == 0 ? w : 0.0f);
    m = m_new;
#pragma unroll
    for (int p = 0; p < kTurnPositions; ++p) {
      const float wp = __shfl_sync(0xffffffffu, w, p * kLanesPerPosition);
#pragma unroll
      for (int i = 0; i < kValuePieces; ++i) {
        float v[kValueHalves];
        unpack_halves(value[p][i], v);
#pragma unroll
        for (int j = 0; j < kValueHalves; ++j) acc[i][j] = (p == 0 ? acc[i][j] * correction : acc[i][j]) + wp * v[j];
      }
    }
  }
  __shared__ float warp_m[kAttentionWarps], warp_l[kAttentionWarps];
  __shared__ float warp_acc[kAttentionWarps][kMaxHd];
  if (lane == 0) warp_m[warp] = m, warp_l[warp] = l;
#pragma unroll
  for (int i = 0; i < kValuePieces; ++i) {
    const int c = lane + i * kWarp;
#pragma unroll
    for (int j = 0; j < kValueHalves; ++j) {
      if (c < value_pieces) warp_acc[warp][c * kValueHalves + j] = acc[i][j];
    }
  }
  __syncthreads();
  // The partials and counters by the query's place in the launch: a launch for listed
  // tokens needs room for its own queries' splits only.
  float* out = a.partials + ((static_cast<std::size_t>(query) * a.n_head + h) * a.n_splits + split) * (hd + 2);
  float top = -FLT_MAX;
  for (int w = 0; w < kAttentionWarps; ++w) top = fmaxf(top, warp_m[w]);
  for (int d = threadIdx.x; d < hd; d += blockDim.x) {
    float sum = 0.0f;
    for (int w = 0; w < kAttentionWarps; ++w) sum += warp_l[w] > 0.0f ? warp_acc[w][d] * __expf(warp_m[w] - top) : 0.0f;
    out[d] = sum;
  }
  if (threadIdx.x == 0) {
    float sum = 0.0f;
    for (int w = 0; w < kAttentionWarps; ++w) sum += warp_l[w] > 0.0f ? warp_l[w] * __expf(warp_m[w] - top) : 0.0f;
    out[hd] = top;
    out[hd + 1] = sum;
  }
  if (a.arrivals && last_to_arrive(a.arrivals + static_cast<std::size_t>(query) * a.n_head + h, a.n_splits)) {
    merge_splits(a, query, t, h, q8);
  }
}

__global__ void attention_combine_kernel(AttentionArgs a, Q8Out q8) {
  dependent_launch_prologue();
  merge_splits(a, blockIdx.x, a.tokens ? a.tokens[blockIdx.x] : blockIdx.x, blockIdx.y, q8);
}

// attention_tiles' kernel, for tiles of up to kTileTokens queries of heads up to kTileHeadDim
// (attention_tile_tokens' sizes). The block's warps share the tile's next kTileKeys keys and values
// in shared memory; each warp owns kTileTokens / kTileWarps of the tile's queries, with a running
// softmax for each. Scoring, a lane takes one key; summing values, a lane takes pairs of elements.
constexpr int kTileWarps = 4;
constexpr int kTileKeys = kWarp;

template <int kTileTokens, int kTileHeadDim>
__global__ void __launch_bounds__(kTileWarps * kWarp) attention_tiles_kernel(AttentionArgs a, StepMeta meta, DeviceKv kv, Q8Out q8) {
  static_assert(kTileTokens % kTileWarps == 0 && kTileHeadDim % (2 * kWarp) == 0);
  constexpr int kTileRowsPerWarp = kTileTokens / kTileWarps;
  constexpr int kTilePairsPerLane = kTileHeadDim / (2 * kWarp);
  // Halves from one key's row to the next: 4 past the head, so that the lanes' 8-byte reads of
  // their own keys fall on distinct banks.
  constexpr int kTileKeyStride = kTileHeadDim + 4;
  dependent_launch_prologue();
  const int first_token = meta.tiles[2 * blockIdx.x], n_tokens = meta.tiles[2 * blockIdx.x + 1], h = blockIdx.y;
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp, hd = a.head_dim;
  const int kh = h / (a.n_head / a.n_head_kv);
  alignas(16) __shared__ float queries[kTileTokens * kTileHeadDim];  // later the outputs
  alignas(16) __shared__ __half keys[kTileKeys * kTileKeyStride];
  alignas(16) __shared__ __half values[kTileKeys * kTileKeyStride];
  __shared__ float weights[kTileTokens][kTileKeys];
  for (int i = threadIdx.x; i < kTileTokens * hd; i += blockDim.x) {
    const int r = i / hd;
    queries[i] = r < n_tokens ? a.q[(static_cast<std::size_t>(first_token + r) * a.n_head + h) * hd + i % hd] : 0.0f;
  }
  const int2 span = tile_span(meta, first_token, n_tokens, a.window);
  const int begin = span.x, end = span.y;
  QueryView view[kTileRowsPerWarp];
  float m[kTileRowsPerWarp], l[kTileRowsPerWarp];
  float2 acc[kTileRowsPerWarp][kTilePairsPerLane];
#pragma unroll
  for (int i = 0; i < kTileRowsPerWarp; ++i) {
    const int row = warp * kTileRowsPerWarp + i;
    if (row < n_tokens) view[i] = query_view(meta, first_token + row, a.window);
    m[i] = -FLT_MAX, l[i] = 0.0f;
#pragma unroll
    for (int j = 0; j < kTilePairsPerLane; ++j) acc[i][j] = make_float2(0.0f, 0.0f);
  }
  const std::int32_t* table = meta.tables + meta.table_start[first_token];
  const int pieces = hd / 4;  // 8-byte pieces of a row
  // Every warp takes the same turns (the shuffles line up across the block, as CPU runtimes of this
  // code need).
  for (int k0 = begin; k0 < end; k0 += kTileKeys) {
    __syncthreads();  // the previous keys' readers are done; the first time, the queries are in
    for (int i = threadIdx.x; i < kTileKeys * pieces; i += blockDim.x) {
      const int j = i / pieces, c = i % pieces, pos = k0 + j;
      uint2 key = make_uint2(0u, 0u), value = make_uint2(0u, 0u);
      if (pos < end) {
        const int block = table[pos / kv.block_tokens];
        const std::size_t row = (static_cast<std::size_t>(kh) * kv.block_tokens + pos % kv.block_tokens) * hd + 4 * c;
        key = *reinterpret_cast<const uint2*>(kv_part(kv, block, a.layer, 0) + row);
        value = *reinterpret_cast<const uint2*>(kv_part(kv, block, a.layer, 1) + row);
      }
      *reinterpret_cast<uint2*>(keys + j * kTileKeyStride + 4 * c) = key;
      *reinterpret_cast<uint2*>(values + j * kTileKeyStride + 4 * c) = value;
    }
    __syncthreads();
    float s[kTileRowsPerWarp] = {};
    const __half* my_key = keys + lane * kTileKeyStride;
    const float* my_queries = queries + warp * kTileRowsPerWarp * hd;
    for (int d = 0; d < hd; d += 4) {
      const uint2 two = *reinterpret_cast<const uint2*>(my_key + d);
      const float k0v = low_half(two.x), k1v = high_half(two.x), k2v = low_half(two.y), k3v = high_half(two.y);
#pragma unroll
      for (int i = 0; i < kTileRowsPerWarp; ++i) {
        const float4 qv = *reinterpret_cast<const float4*>(my_queries + i * hd + d);
        s[i] += qv.x * k0v + qv.y * k1v + qv.z * k2v + qv.w * k3v;
      }
    }
    const int pos = k0 + lane;
#pragma unroll
    for (int i = 0; i < kTileRowsPerWarp; ++i) {
      const bool seen = view[i].sees(pos);
      const float score = attention_score(a, s[i]);
      const float m_new = fmaxf(m[i], warp_max(seen ? score : -FLT_MAX));
      const float w = seen ? __expf(score - m_new) : 0.0f, correction = __expf(m[i] - m_new);
      l[i] = l[i] * correction + warp_sum(w);
      m[i] = m_new;
      weights[warp * kTileRowsPerWarp + i][lane] = w;
#pragma unroll
      for (int j = 0; j < kTilePairsPerLane; ++j) acc[i][j].x *= correction, acc[i][j].y *= correction;
    }
    __syncwarp();
    for (int key = 0; key < kTileKeys; ++key) {
      const __half* value_row = values + key * kTileKeyStride;
#pragma unroll
      for (int j = 0; j < kTilePairsPerLane; ++j) {
        const int d = 2 * lane + 2 * kWarp * j;
        const unsigned two = d < hd ? *reinterpret_cast<const unsigned*>(value_row + d) : 0u;
        const float v0 = low_half(two), v1 = high_half(two);
#pragma unroll
        for (int i = 0; i < kTileRowsPerWarp; ++i) {
          const float w = weights[warp * kTileRowsPerWarp + i][key];
          acc[i][j].x += w * v0, acc[i][j].y += w * v1;
        }
      }
    }
  }
  __syncthreads();  // every warp is done with the queries; each now writes its rows' outputs there
#pragma unroll
  for (int i = 0; i < kTileRowsPerWarp; ++i) {
    const float inv = l[i] > 0.0f ? 1.0f / l[i] : 0.0f;
    float* row = queries + (warp * kTileRowsPerWarp + i) * hd;
#pragma unroll
    for (int j = 0; j < kTilePairsPerLane; ++j) {
      const int d = 2 * lane + 2 * kWarp * j;
      if (d < hd) row[d] = acc[i][j].x * inv, row[d + 1] = acc[i][j].y * inv;
    }
  }
  __syncwarp();
  for (int i = 0; i < kTileRowsPerWarp; ++i) {
    const int r = warp * kTileRowsPerWarp + i;
    const bool valid = r < n_tokens;
    const std::size_t out_row = (static_cast<std::size_t>(first_token + (valid ? r : 0)) * a.n_head + h) * hd;
    // With q8, hd is a multiple of 32: a warp's lanes are all in or all out.
    for (int base = 0; base < hd; base += kWarp) {
      const int d = base + lane;
      const float v = d < hd ? queries[r * hd + d] : 0.0f;
      if (valid && d < hd) a.out[out_row + d] = v;
      if (q8.q) warp_quantize_q8(v, (out_row + base) / kWarp, valid, q8);
    }
  }
}

// attention_tiles on the tensor cores, for tiles of up to 16 queries (attention_tile_tokens' size
// for these heads). A warp multiplies the tile's queries (as halves) by 16 keys at a time (wmma
// 16x16x16, sums in float), in two passes over the tile's context, so that no running correction
// has to scale the accumulators (whose elements' places are the hardware's): the first finds each
// query's largest score and its softmax sum; the second adds e^(score - largest) x values, those
// weights as halves (at most 1). The block's four warps take every fourth 16-key chunk, each into
// shared memory of its own; their maxima, sums and outputs merge in shared memory at the end.
constexpr int kMmaRows = 16;
constexpr int kMmaKeys = 16;
constexpr int kMmaMaxFragments = kAttentionTileMmaMaxHeadDim / 16;
// Halves from one row to the next: 8 past the head, so that the 16-byte rows the tensor cores' loads
// take fall on distinct banks.
constexpr int kMmaStride = kAttentionTileMmaMaxHeadDim + 8;
static_assert(attention_tile_tokens(kAttentionTileMmaMaxHeadDim) == kMmaRows);

// A chunk's keys (which 0) or values (1): positions [k0, k0 + kMmaKeys) of the table's sequence,
// zeros from `end` on, into rows of kMmaStride halves. The warp's lanes share the copy.
__device__ void load_mma_chunk(const DeviceKv& kv, const std::int32_t* table, int layer, int kh, int hd, int k0, int end, int which,
                               __half* chunk) {
  const int pieces = hd / 8;  // 16-byte pieces a row
  for (int i = threadIdx.x % kWarp; i < kMmaKeys * pieces; i += kWarp) {
    const int j = i / pieces, c = i % pieces, pos = k0 + j;
    uint4 piece = make_uint4(0u, 0u, 0u, 0u);
    if (pos < end) {
      const int block = table[pos / kv.block_tokens];
      const std::size_t row = (static_cast<std::size_t>(kh) * kv.block_tokens + pos % kv.block_tokens) * hd + 8 * c;
      piece = *reinterpret_cast<const uint4*>(kv_part(kv, block, layer, which) + row);
    }
    *reinterpret_cast<uint4*>(chunk + j * kMmaStride + 8 * c) = piece;
  }
}

using MmaQueries = nvcuda::wmma::fragment<nvcuda::wmma::matrix_a, 16, 16, 16, __half, nvcuda::wmma::row_major>;

// The tile's scores against a chunk's keys (before the scale), row-major into `scores` (16 x 16).
__device__ void mma_chunk_scores(const MmaQueries (&queries)[kMmaMaxFragments], int n_fragments, const __half* keys, float* scores) {
  using namespace nvcuda;
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> s;
  wmma::fill_fragment(s, 0.0f);
#pragma unroll
  for (int f = 0; f < kMmaMaxFragments; ++f) {
    if (f < n_fragments) {
      wmma::fragment<wmma::matrix_b, 16, 16, 16, __half, wmma::col_major> k;  // element (d, key) at keys[key * stride + d]
      wmma::load_matrix_sync(k, keys + 16 * f, kMmaStride);
      wmma::mma_sync(s, queries[f], k, s);
    }
  }
  wmma::store_matrix_sync(scores, s, kMmaKeys, wmma::mem_row_major);
}

__global__ void __launch_bounds__(kTileWarps * kWarp) attention_tiles_mma_kernel(AttentionArgs a, StepMeta meta, DeviceKv kv, Q8Out q8) {
  using namespace nvcuda;
  dependent_launch_prologue();
  const int first_token = meta.tiles[2 * blockIdx.x], n_tokens = meta.tiles[2 * blockIdx.x + 1], h = blockIdx.y;
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp, hd = a.head_dim, n_fragments = hd / 16;
  const int kh = h / (a.n_head / a.n_head_kv);
  alignas(32) __shared__ __half queries[kMmaRows * kMmaStride];
  // Each warp's keys and values; once the second pass is done, the warps' outputs (floats).
  alignas(32) __shared__ __half chunks[kTileWarps][2][kMmaKeys * kMmaStride];
  alignas(32) __shared__ float scores[kTileWarps][kMmaRows * kMmaKeys];
  alignas(32) __shared__ __half weights[kTileWarps][kMmaRows * kMmaKeys];
  __shared__ float warp_max_of[kTileWarps][kMmaRows], warp_sum_of[kTileWarps][kMmaRows];
  static_assert(sizeof(chunks) >= sizeof(float) * kTileWarps * kMmaRows * kAttentionTileMmaMaxHeadDim);
  for (int i = threadIdx.x; i < kMmaRows * hd; i += blockDim.x) {
    const int r = i / hd, d = i % hd;
    queries[r * kMmaStride + d] = __float2half(r < n_tokens ? a.q[(static_cast<std::size_t>(first_token + r) * a.n_head + h) * hd + d] : 0.0f);
  }
  const int2 span = tile_span(meta, first_token, n_tokens, a.window);
  const int begin = span.x, end = span.y;
  // A lane's scores: row lane / 2, keys 8 * (lane % 2) to 8 more of each chunk.
  const int row = lane / 2, key0 = (kMmaKeys / 2) * (lane % 2);
  const QueryView view = row < n_tokens ? query_view(meta, first_token + row, a.window) : QueryView{};
  __syncthreads();
  MmaQueries q[kMmaMaxFragments];
#pragma unroll
  for (int f = 0; f < kMmaMaxFragments; ++f) {
    if (f < n_fragments) wmma::load_matrix_sync(q[f], queries + 16 * f, kMmaStride);
  }
  const std::int32_t* table = meta.tables + meta.table_start[first_token];
  __half* keys = chunks[warp][0];
  __half* values = chunks[warp][1];
  float* my_scores = scores[warp];
  // Every warp takes the same turns (the last ones may find no position past `end`): the shuffles
  // and warp barriers then line up across the block, as CPU runtimes of this code need.
  const int turns = (end - begin + kTileWarps * kMmaKeys - 1) / (kTileWarps * kMmaKeys);
  // First pass: each row's largest score and softmax sum over this warp's chunks.
  float m = -FLT_MAX, l = 0.0f;
  for (int turn = 0; turn < turns; ++turn) {
    const int k0 = begin + (turn * kTileWarps + warp) * kMmaKeys;
    __syncwarp();  // the previous chunk's scores are read
    load_mma_chunk(kv, table, a.layer, kh, hd, k0, end, 0, keys);
    __syncwarp();
    mma_chunk_scores(q, n_fragments, keys, my_scores);
    __syncwarp();
    float s[kMmaKeys / 2], top = -FLT_MAX;
#pragma unroll
    for (int j = 0; j < kMmaKeys / 2; ++j) {
      const bool seen = view.sees(k0 + key0 + j);
      s[j] = seen ? attention_score(a, my_scores[row * kMmaKeys + key0 + j]) : -FLT_MAX;
      top = fmaxf(top, s[j]);
    }
    const float m_new = fmaxf(m, fmaxf(top, __shfl_xor_sync(0xffffffffu, top, 1)));
    float sum = 0.0f;
#pragma unroll
    for (int j = 0; j < kMmaKeys / 2; ++j) sum += s[j] > -FLT_MAX ? __expf(s[j] - m_new) : 0.0f;
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    l = l * __expf(m - m_new) + sum;
    m = m_new;
  }
  if (lane % 2 == 0) warp_max_of[warp][row] = m, warp_sum_of[warp][row] = l;
  __syncthreads();
  float top = -FLT_MAX, total = 0.0f;
  for (int w = 0; w < kTileWarps; ++w) top = fmaxf(top, warp_max_of[w][row]);
  for (int w = 0; w < kTileWarps; ++w) total += warp_sum_of[w][row] > 0.0f ? warp_sum_of[w][row] * __expf(warp_max_of[w][row] - top) : 0.0f;
  // Second pass: the same scores (the same products), weights e^(score - top) into the outputs.
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> o[kMmaMaxFragments];
#pragma unroll
  for (int f = 0; f < kMmaMaxFragments; ++f) wmma::fill_fragment(o[f], 0.0f);
  for (int turn = 0; turn < turns; ++turn) {
    const int k0 = begin + (turn * kTileWarps + warp) * kMmaKeys;
    __syncwarp();  // the previous chunk's values and weights are read
    load_mma_chunk(kv, table, a.layer, kh, hd, k0, end, 0, keys);
    load_mma_chunk(kv, table, a.layer, kh, hd, k0, end, 1, values);
    __syncwarp();
    mma_chunk_scores(q, n_fragments, keys, my_scores);
    __syncwarp();
#pragma unroll
    for (int j = 0; j < kMmaKeys / 2; ++j) {
      const bool seen = view.sees(k0 + key0 + j);
      weights[warp][row * kMmaKeys + key0 + j] = __float2half(seen ? __expf(attention_score(a, my_scores[row * kMmaKeys + key0 + j]) - top) : 0.0f);
    }
    __syncwarp();
    wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major> p;
    wmma::load_matrix_sync(p, weights[warp], kMmaKeys);
#pragma unroll
    for (int f = 0; f < kMmaMaxFragments; ++f) {
      if (f < n_fragments) {
        wmma::fragment<wmma::matrix_b, 16, 16, 16, __half, wmma::row_major> v;  // element (key, d) at values[key * stride + d]
        wmma::load_matrix_sync(v, values + 16 * f, kMmaStride);
        wmma::mma_sync(o[f], p, v, o[f]);
      }
    }
  }
  __syncthreads();  // every warp is done with its chunks: they now hold the warps' outputs
  float* outputs = reinterpret_cast<float*>(&chunks[0][0][0]);
#pragma unroll
  for (int f = 0; f < kMmaMaxFragments; ++f) {
    if (f < n_fragments) wmma::store_matrix_sync(outputs + warp * kMmaRows * hd + 16 * f, o[f], hd, wmma::mem_row_major);
  }
  __syncthreads();
  for (int i = 0; i < kMmaRows / kTileWarps; ++i) {
    const int r = warp * (kMmaRows / kTileWarps) + i;
    const float row_total = __shfl_sync(0xffffffffu, total, 2 * r);
    const bool valid = r < n_tokens;
    const std::size_t out_row = (static_cast<std::size_t>(first_token + (valid ? r : 0)) * a.n_head + h) * hd;
    // With q8, hd is a multiple of 32: a warp's lanes are all in or all out.
    for (int base = 0; base < hd; base += kWarp) {
      const int d = base + lane;
      float v = 0.0f;
      if (d < hd) {
        for (int w = 0; w < kTileWarps; ++w) v += outputs[(w * kMmaRows + r) * hd + d];
        v = row_total > 0.0f ? v / row_total : 0.0f;
      }
      if (valid && d < hd) a.out[out_row + d] = v;
      if (q8.q) warp_quantize_q8(v, (out_row + base) / kWarp, valid, q8);
    }
  }
}

__global__ void gated_activation_kernel(float* gate, const float* up, std::size_t n, bool gelu, Q8Out q8) {
  dependent_launch_prologue();
  const std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const bool in = i < n;  // no early return: warp_quantize_q8's shuffles (n a multiple of 32 then)
  const float v = in ? gated_value(gate[i], up[i], gelu) : 0.0f;
  if (in) gate[i] = v;
  if (q8.q) warp_quantize_q8(v, i / kWarp, in, q8);
}

// gated_activation_kernel's work from one GEMM of gate and up joined (rows of 2F: gate, then up).
__global__ void gated_activation_joined_kernel(const float* joined, std::size_t n, int F, bool gelu, float* out) {
  dependent_launch_prologue();
  const std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const std::size_t t = i / static_cast<std::size_t>(F), c = i - t * F;
  const float* row = joined + t * 2 * F;
  out[i] = gated_value(row[c], row[F + c], gelu);
}

__global__ void add_weighted_rows_kernel(const float* src, const std::int32_t* rows, const float* weights, int d, float* dst) {
  dependent_launch_prologue();
  const float w = weights[blockIdx.x];
  const float* s = src + static_cast<std::size_t>(blockIdx.x) * d;
  float* o = dst + static_cast<std::size_t>(rows[blockIdx.x]) * d;
  for (int i = threadIdx.x; i < d; i += blockDim.x) o[i] += w * s[i];
}

__global__ void gather_rows_kernel(const float* src, const std::int32_t* rows, int d, float* dst) {
  dependent_launch_prologue();
  const float* s = src + static_cast<std::size_t>(rows[blockIdx.x]) * d;
  float* o = dst + static_cast<std::size_t>(blockIdx.x) * d;
  for (int i = threadIdx.x; i < d; i += blockDim.x) o[i] = s[i];
}

__global__ void softcap_kernel(float* x, std::size_t n, float cap) {
  dependent_launch_prologue();
  const std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) x[i] = cap * tanhf(x[i] / cap);
}

// blockIdx.x: (layer, K or V, head); the threads walk the rows' halves.
__global__ void copy_kv_rows_kernel(DeviceKv kv, int from, int from_slot, int to, int to_slot, int n_rows) {
  dependent_launch_prologue();
  const int layer = blockIdx.x / (2 * kv.n_head_kv), which = blockIdx.x / kv.n_head_kv % 2, head = blockIdx.x % kv.n_head_kv;
  const std::size_t head_rows = static_cast<std::size_t>(head) * kv.block_tokens;
  const __half* src = kv_part(kv, from, layer, which) + (head_rows + from_slot) * kv.head_dim;
  __half* dst = const_cast<__half*>(kv_part(kv, to, layer, which)) + (head_rows + to_slot) * kv.head_dim;
  const int n = n_rows * kv.head_dim;
  for (int i = threadIdx.x; i < n; i += blockDim.x) dst[i] = src[i];
}

unsigned blocks_for(std::size_t n, unsigned threads) { return static_cast<unsigned>((n + threads - 1) / threads); }

}  // namespace

void embed(const std::uint8_t* table, WeightFormat format, int d, const StepMeta& meta, int T, float scale, float* x, cudaStream_t stream) {
  launch(embed_kernel, T, 128, 0, stream, table, format, d, meta, scale, x);
}

void add_rmsnorm(float* x, const float* delta, const float* delta_norm, const float* weight, int d, int T, float eps, float* out,
                 cudaStream_t stream, const Q8Out& q8) {
  launch(add_rmsnorm_kernel, T, kGemvWarps * kWarp, 0, stream, x, delta, delta_norm, weight, d, eps, out, d % kWarp == 0 ? q8 : Q8Out{});
}

void gemv(const std::uint8_t* w, WeightFormat format, int rows, int cols, const float* x, int T, float* y, cudaStream_t stream) {
  const dim3 grid(blocks_for(static_cast<std::size_t>(rows), kGemvWarps)), block(kGemvWarps * kWarp);
  if (cols % 32) {
    launch(gemv_elements_kernel, grid, block, 0, stream, w, format, rows, cols, x, T, y);
    return;
  }
  switch (format) {
    case WeightFormat::F32: launch(gemv_kernel<WeightFormat::F32>, grid, block, 0, stream, w, rows, cols, x, T, y); break;
    case WeightFormat::F16: launch(gemv_kernel<WeightFormat::F16>, grid, block, 0, stream, w, rows, cols, x, T, y); break;
    case WeightFormat::BF16: launch(gemv_kernel<WeightFormat::BF16>, grid, block, 0, stream, w, rows, cols, x, T, y); break;
    case WeightFormat::Q8_0: launch(gemv_kernel<WeightFormat::Q8_0>, grid, block, 0, stream, w, rows, cols, x, T, y); break;
    case WeightFormat::Q4_0: launch(gemv_kernel<WeightFormat::Q4_0>, grid, block, 0, stream, w, rows, cols, x, T, y); break;
    case WeightFormat::Q4_K: launch(gemv_kernel<WeightFormat::Q4_K>, grid, block, 0, stream, w, rows, cols, x, T, y); break;
    case WeightFormat::Q5_K: launch(gemv_kernel<WeightFormat::Q5_K>, grid, block, 0, stream, w, rows, cols, x, T, y); break;
    case WeightFormat::Q6_K: launch(gemv_kernel<WeightFormat::Q6_K>, grid, block, 0, stream, w, rows, cols, x, T, y); break;
    case WeightFormat::IQ4_XS: launch(gemv_kernel<WeightFormat::IQ4_XS>, grid, block, 0, stream, w, rows, cols, x, T, y); break;
    case WeightFormat::Q3_K: launch(gemv_kernel<WeightFormat::Q3_K>, grid, block, 0, stream, w, rows, cols, x, T, y); break;
  }
}

void quantize_q8(const float* x, int T, int cols, std::int8_t* q, float2* scale_sum, cudaStream_t stream) {
  const std::size_t n_blocks = static_cast<std::size_t>(T) * (cols / 32);
  launch(quantize_q8_kernel, blocks_for(n_blocks, 8), 8 * kWarp, 0, stream, x, n_blocks, Q8Out{q, scale_sum});
}

bool gemv_q8_takes(WeightFormat format, int cols) {
  switch (format) {
    case WeightFormat::Q4_K:
    case WeightFormat::Q5_K:
    case WeightFormat::Q6_K:
    case WeightFormat::Q3_K:
    case WeightFormat::IQ4_XS: return cols % 256 == 0;
    case WeightFormat::Q8_0:
    case WeightFormat::Q4_0: return cols % 32 == 0;
    default: return false;
  }
}

void gemv_q8(const GemvParts& parts, const std::int8_t* q, const float2* scale_sum, int T, cudaStream_t stream) {
  if (parts.gated.arrivals && (parts.n != 2 || parts.part[0].rows != parts.part[1].rows)) {
    throw Error("internal: gemv_q8's gated activation takes two parts (gate, up) of the same rows");
  }
  if (parts.gated.q8.q && (parts.part[0].rows % kWarp || parts.gated.q8.q == q)) {
    throw Error("internal: gemv_q8's gated activation writes int8 for rows of a multiple of 32, not over its own input");
  }
  if (parts.norm.arrivals && (parts.n != 1 || T != 1 || parts.part[0].rows != parts.norm.d || (parts.norm.q8.q && parts.norm.d % kWarp))) {
    throw Error("internal: gemv_q8's norm tail takes one part of d rows, one token, and int8 for d a multiple of 32");
  }
  unsigned blocks = 0;
  for (int p = 0; p < parts.n; ++p) {
    if (!gemv_q8_takes(parts.part[p].format, parts.cols)) return;
    blocks += blocks_for(static_cast<std::size_t>(parts.part[p].rows), kGemvWarps);
  }
  if (T > kGemvMaxTokens) {
    if (parts.gated.arrivals || parts.norm.arrivals) throw Error("internal: gemv_q8's tails take at most kGemvMaxTokens tokens");
    launch(gemv_q8_rounds_kernel, blocks, kGemvWarps * kWarp, 0, stream, parts, q, scale_sum, T);
  } else if (parts.norm.arrivals) {
    launch(gemv_q8_parts_kernel<true>, blocks, kGemvWarps * kWarp, 0, stream, parts, q, scale_sum, T);
  } else {
    launch(gemv_q8_parts_kernel<false>, blocks, kGemvWarps * kWarp, 0, stream, parts, q, scale_sum, T);
  }
}

void route_experts(const float* logits, int T, int n_expert, int k, bool softmax_over_all, const ExpertRoutes& routes, cudaStream_t stream) {
  if (n_expert < 1 || n_expert > kMaxRoutedExperts || k < 1 || k > std::min(n_expert, kWarp)) {
    throw Error("internal: route_experts takes 1-" + std::to_string(kMaxRoutedExperts) + " experts and k of at most 32 and n_expert, not " +
                std::to_string(n_expert) + " and " + std::to_string(k));
  }
  launch(route_experts_kernel, T, kWarp, 0, stream, logits, n_expert, k, softmax_over_all, routes);
}

bool gemv_experts_takes(WeightFormat format, int cols) { return cols % 32 == 0 && (is_float_format(format) || gemv_q8_takes(format, cols)); }

bool gemv_experts_gated_takes(const ExpertGemv& g) { return g.n == 2 && is_float_format(g.part[0].format) == is_float_format(g.part[1].format); }

void gemv_experts(const ExpertGemv& g, const std::int32_t* experts, int n_pairs, const float* x, const std::int8_t* xq, const float2* xds,
                  cudaStream_t stream) {
  if (n_pairs <= 0) return;
  if (g.gated.arrivals && (!gemv_experts_gated_takes(g) || (g.gated.q8.q && g.rows % kWarp))) {
    throw Error("internal: gemv_experts' gated activation takes gate and up read the same way (gemv_experts_gated_takes)");
  }
  const unsigned row_blocks = blocks_for(static_cast<std::size_t>(g.rows), kGemvWarps);
  // A launch reads x in one form: parts of both kinds (never seen in a file) go one at a time.
  if (g.n > 1 && is_float_format(g.part[0].format) != is_float_format(g.part[1].format)) {
    for (int p = 0; p < g.n; ++p) {
      ExpertGemv one = g;
      one.part[0] = g.part[p];
      one.n = 1;
      gemv_experts(one, experts, n_pairs, x, xq, xds, stream);
    }
    return;
  }
  const dim3 grid(row_blocks * g.n, n_pairs);
  if (is_float_format(g.part[0].format)) {
    launch(gemv_experts_kernel<false>, grid, kGemvWarps * kWarp, 0, stream, g, experts, x, xq, xds);
  } else {
    launch(gemv_experts_kernel<true>, grid, kGemvWarps * kWarp, 0, stream, g, experts, x, xq, xds);
  }
}

void moe_combine(const float* y, const ExpertRoutes& routes, int T, int k, int d, float* out, cudaStream_t stream) {
  launch(moe_combine_kernel, T, 256, 0, stream, y, routes, k, d, out);
}

void dequantize_to_half(const std::uint8_t* w, WeightFormat format, int rows, int cols, __half* out, cudaStream_t stream) {
  if (cols % 32) {
    const std::size_t n = static_cast<std::size_t>(rows) * cols;
    launch(dequantize_elements_kernel, blocks_for(n, 256), 256, 0, stream, w, format, rows, cols, out);
    return;
  }
  const std::size_t n = static_cast<std::size_t>(rows) * (cols / 32);
  launch(dequantize_kernel, blocks_for(n, 256), 256, 0, stream, w, format, rows, cols, out);
}

void float_to_half(const float* x, std::size_t n, __half* out, cudaStream_t stream) {
  launch(float_to_half_kernel, blocks_for(n, 256), 256, 0, stream, x, n, out);
}

void qkv_post(const QkvPost& p, const StepMeta& meta, int T, const DeviceKv& kv, cudaStream_t stream) {
  const std::size_t pairs = static_cast<std::size_t>(T) * (p.n_head + p.n_head_kv);
  launch(qkv_post_kernel, blocks_for(pairs, kPostWarps), kPostWarps * kWarp, 0, stream, p, meta, kv, T);
}

bool gemv_q8_qkv_takes(const GemvParts& parts, const QkvPost& post) {
  if (parts.n != 3 || post.head_dim % kGemvWarps || parts.part[0].rows != post.n_head * post.head_dim || post.q_in || post.in_stride) return false;
  for (int p = 0; p < 3; ++p) {
    if (!gemv_q8_takes(parts.part[p].format, parts.cols)) return false;
  }
  return parts.part[1].rows == post.n_head_kv * post.head_dim && parts.part[2].rows == parts.part[1].rows;
}

void gemv_q8_qkv(const GemvParts& parts, const std::int8_t* q, const float2* scale_sum, int T, const QkvPost& post, const StepMeta& meta,
                 const DeviceKv& kv, int* arrivals, cudaStream_t stream) {
  if (!gemv_q8_qkv_takes(parts, post)) throw Error("internal: gemv_q8_qkv given parts it does not take (gemv_q8_qkv_takes)");
  unsigned blocks = 0;
  for (int p = 0; p < 3; ++p) blocks += blocks_for(static_cast<std::size_t>(parts.part[p].rows), kGemvWarps);
  if (T > 0) launch(gemv_q8_qkv_kernel, blocks, kGemvWarps * kWarp, 0, stream, parts, q, scale_sum, T, post, meta, kv, arrivals);
}

void attention(const AttentionArgs& a, const StepMeta& meta, int T, const DeviceKv& kv, cudaStream_t stream, const Q8Out& q8) {
  if (a.n_splits < 1 || a.n_splits > kMaxAttentionSplits) throw Error("internal: attention split " + std::to_string(a.n_splits) + " ways");
  const Q8Out out_q8 = attention_writes_q8(a.head_dim) ? q8 : Q8Out{};
  // The instance for these heads: 16-byte key loads where they are a multiple of 8 halves (every
  // model's so far), with registers for 128 halves where that is enough.
  static_assert(kMaxHeadDim == 256);
  using Kernel = void (*)(AttentionArgs, StepMeta, DeviceKv, Q8Out);
  const Kernel kernel = a.head_dim % 8 != 0 ? (a.tokens ? attention_kernel<true, 256, 2> : attention_kernel<false, 256, 2>)
                        : a.head_dim <= 128 ? (a.tokens ? attention_kernel<true, 128, 8> : attention_kernel<false, 128, 8>)
                                            : (a.tokens ? attention_kernel<true, 256, 8> : attention_kernel<false, 256, 8>);
  launch(kernel, dim3(T, a.n_head, a.n_splits), kAttentionWarps * kWarp, 0, stream, a, meta, kv, out_q8);
  if (!a.arrivals) launch(attention_combine_kernel, dim3(T, a.n_head), kAttentionWarps * kWarp, 0, stream, a, out_q8);
}

void attention_tiles(const AttentionArgs& a, const StepMeta& meta, int n_tiles, const DeviceKv& kv, cudaStream_t stream, const Q8Out& q8,
                     bool tensor_cores) {
  if (!attention_tiles_take(a.head_dim) || (tensor_cores && !attention_tiles_mma_take(a.head_dim))) {
    throw Error("internal: attention tiles asked for heads of " + std::to_string(a.head_dim) + (tensor_cores ? " on the tensor cores" : ""));
  }
  const Q8Out out_q8 = attention_writes_q8(a.head_dim) ? q8 : Q8Out{};
  if (n_tiles == 0) return;
  if (tensor_cores) {
    launch(attention_tiles_mma_kernel, dim3(n_tiles, a.n_head), kTileWarps * kWarp, 0, stream, a, meta, kv, out_q8);
    return;
  }
  // The instance whose sizes are attention_tile_tokens' for these heads (the tiles pack_step planned).
  static_assert(attention_tile_tokens(128) == 16 && attention_tile_tokens(132) == 8 && attention_tile_tokens(256) == 8);
  const dim3 grid(n_tiles, a.n_head);
  if (a.head_dim <= 128) {
    launch(attention_tiles_kernel<16, 128>, grid, kTileWarps * kWarp, 0, stream, a, meta, kv, out_q8);
  } else {
    launch(attention_tiles_kernel<8, 256>, grid, kTileWarps * kWarp, 0, stream, a, meta, kv, out_q8);
  }
}

void gated_activation(float* gate, const float* up, std::size_t n, bool gelu, cudaStream_t stream, const Q8Out& q8) {
  launch(gated_activation_kernel, blocks_for(n, 256), 256, 0, stream, gate, up, n, gelu, n % kWarp == 0 ? q8 : Q8Out{});
}

void gated_activation_joined(const float* joined, int T, int F, bool gelu, float* out, cudaStream_t stream) {
  const std::size_t n = static_cast<std::size_t>(T) * F;
  launch(gated_activation_joined_kernel, blocks_for(n, 256), 256, 0, stream, joined, n, F, gelu, out);
}

void gather_rows(const float* src, const std::int32_t* rows, int n, int d, float* dst, cudaStream_t stream) {
  launch(gather_rows_kernel, n, 256, 0, stream, src, rows, d, dst);
}

void add_weighted_rows(const float* src, const std::int32_t* rows, const float* weights, int n, int d, float* dst, cudaStream_t stream) {
  launch(add_weighted_rows_kernel, n, 256, 0, stream, src, rows, weights, d, dst);
}

void softcap(float* x, std::size_t n, float cap, cudaStream_t stream) {
  launch(softcap_kernel, blocks_for(n, 256), 256, 0, stream, x, n, cap);
}

void copy_kv_rows(const DeviceKv& kv, int from, int from_slot, int to, int to_slot, int n_rows, cudaStream_t stream) {
  launch(copy_kv_rows_kernel, kv.n_layer * 2 * kv.n_head_kv, 256, 0, stream, kv, from, from_slot, to, to_slot, n_rows);
}

// Two dependent launches of a kernel that adds to a counter, directly and captured in a graph: the
// counter must read 4, with no error on the way.
namespace {
__global__ void count_kernel(int* counter) {
  dependent_launch_prologue();
  if (threadIdx.x == 0) *counter += 1;
}
}  // namespace

bool dependent_launches_work(cudaStream_t stream) {
  // The kernels wait for the grid before them only where they were compiled for sm_90 or later
  // (dependent_launch_prologue): a binary built for older GPUs only (CMAKE_CUDA_ARCHITECTURES=80),
  // its PTX compiled for this GPU when loaded, would start each kernel before the previous one's
  // writes were seen. Its counter test could still pass (count_kernel lets nothing overlap), so the
  // code this GPU runs is asked which architecture it was compiled for.
  cudaFuncAttributes compiled{};
  if (cudaFuncGetAttributes(&compiled, count_kernel) != cudaSuccess || compiled.ptxVersion < 90) return cudaGetLastError(), false;
  int* counter = nullptr;
  if (cudaMalloc(&counter, sizeof(int)) != cudaSuccess) return cudaGetLastError(), false;
  bool ok = cudaMemsetAsync(counter, 0, sizeof(int), stream) == cudaSuccess;
  const auto two = [&] {
    launch_as(true, count_kernel, 1, kWarp, 0, stream, counter);
    launch_as(true, count_kernel, 1, kWarp, 0, stream, counter);
  };
  two();
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  ok = ok && cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal) == cudaSuccess;
  if (ok) {
    two();
    ok = cudaStreamEndCapture(stream, &graph) == cudaSuccess && graph;
  }
  ok = ok && cudaGraphInstantiate(&exec, graph, 0) == cudaSuccess && cudaGraphLaunch(exec, stream) == cudaSuccess;
  int seen = 0;
  ok = ok && cudaMemcpyAsync(&seen, counter, sizeof(int), cudaMemcpyDeviceToHost, stream) == cudaSuccess &&
       cudaStreamSynchronize(stream) == cudaSuccess && seen == 4;
  if (exec) cudaGraphExecDestroy(exec);
  if (graph) cudaGraphDestroy(graph);
  cudaStreamSynchronize(stream);
  cudaFree(counter);
  cudaGetLastError();  // a failed try leaves no error behind for the next check
  return ok;
}

DependentLaunches::DependentLaunches(bool on) : previous_(t_dependent_launches) { t_dependent_launches = on; }
DependentLaunches::~DependentLaunches() { t_dependent_launches = previous_; }

}  // namespace promptly::backend::cuda
