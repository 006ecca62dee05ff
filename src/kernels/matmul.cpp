#include "kernels/matmul.h"

#include <algorithm>
#include <cstring>
#include <span>
#include <type_traits>

#include "kernels/dispatch.h"
#include "tensor/quant-inl.h"
#include "tensor/quant.h"
#include "util/error.h"

namespace promptly::kernels {

float dot_f32(const float* a, const float* b, std::size_t n) { return kernel_table(active_isa()).dot_f32(a, b, n); }

namespace {

// Whether a matmul with w reads its input quantized rather than as floats.
bool reads_quantized_input(const WeightMatrix& w) {
  return (w.layout != Layout::Plain && w.layout != Layout::F16x4 && w.layout != Layout::BF16x4) || w.type == DType::Q8_0 ||
         w.type == DType::Q4_0;
}

// The block formats' 16-row interleaved layouts (see repack_x16): the type each is made from, its
// bytes per 16 rows and kElems columns, how it is made, the kernel that reads it, and whether that
// kernel reads nothing of its input but the ActivationBlocks (on tables where
// x16_reads_activation_blocks_only; the 16-element sub-block formats also read the half-block sums).
using GemmX16 = decltype(KernelTable::gemm_q4_k_x16);
struct InterleavedLayout {
  DType type;
  Layout layout;
  std::size_t elems, group_bytes;
  void (*repack)(const WeightMatrix& w, std::uint8_t* out);
  GemmX16 KernelTable::*gemm;
  bool activation_blocks_only;
};
extern const InterleavedLayout kInterleavedLayouts[7];

const InterleavedLayout* interleaved_layout_of(Layout layout) {
  for (const InterleavedLayout& l : kInterleavedLayouts) {
    if (l.layout == layout) return &l;
  }
  return nullptr;
}

const InterleavedLayout* interleaved_layout_for(DType type) {
  for (const InterleavedLayout& l : kInterleavedLayouts) {
    if (l.type == type) return &l;
  }
  return nullptr;
}

// Whether the ActivationBlocks alone serve every one of `readers` (on the active kernel path).
bool activation_blocks_suffice(std::span<const WeightMatrix* const> readers) {
  const bool x16_only = kernel_table(active_isa()).x16_reads_activation_blocks_only;
  return std::all_of(readers.begin(), readers.end(), [&](const WeightMatrix* w) {
    const InterleavedLayout* l = interleaved_layout_of(w->layout);
    return x16_only && l && l->activation_blocks_only;
  });
}

}  // namespace

bool Activations::begin_quantize_for(std::span<const WeightMatrix* const> readers) {
  if (std::none_of(readers.begin(), readers.end(), [](const WeightMatrix* w) { return reads_quantized_input(*w); })) return false;
  begin_quantize(activation_blocks_suffice(readers));
  return true;
}

void Activations::quantize(ThreadPool& pool, bool activation_blocks_only) {
  if (quantized_ && (activation_blocks_only || !activation_blocks_only_)) return;
  quantized_ = false;
  begin_quantize(activation_blocks_only);
  pool.parallel_for(n_tokens_, std::max<std::size_t>(1, 8192 / std::max<std::size_t>(1, k_)), [&](std::size_t b, std::size_t e, int) {
    for (std::size_t t = b; t < e; ++t) quantize_token(t);
  });
  end_quantize(pool);
}

void Activations::begin_quantize(bool activation_blocks_only) {
  const std::size_t nb = k_ / kQK8_0;
  ActivationBuffers& buf = *buffers_;
  activation_blocks_only_ = activation_blocks_only;
  if (!activation_blocks_only) {
    buf.q8.resize(n_tokens_ * nb);
    buf.sums.resize(n_tokens_ * nb);
    buf.half_sums.resize(2 * n_tokens_ * nb);
  }
  buf.act.resize(act_stride() * nb);
  kernels_ = &kernel_table(active_isa());
}

void Activations::quantize_token(std::size_t t) {
  const std::size_t nb = k_ / kQK8_0;
  ActivationBuffers& buf = *buffers_;
  if (activation_blocks_only_) {
    kernels_->quantize_activations(x_ + t * k_, k_, {nullptr, nullptr, nullptr, &buf.act[t], act_stride()});
  } else {
    kernels_->quantize_activations(x_ + t * k_, k_,
                                   {&buf.q8[t * nb], &buf.sums[t * nb], &buf.half_sums[2 * t * nb], &buf.act[t], act_stride()});
  }
}

void Activations::end_quantize(ThreadPool& pool) {
  const std::size_t nb = k_ / kQK8_0;
  ActivationBuffers& buf = *buffers_;
  const std::size_t stride = act_stride();
  const ActivationBlock* act = buf.act.data();
  const KernelTable& kt = *kernels_;
  // The tile-ordered copy for kernels that take 16 tokens per step (see QuantizedRows): made here,
  // once per input and split across the pool, rather than by every matmul that reads the input.
  const std::size_t tiles = kt.token_tile && n_tokens_ >= kMinTiledTokens ? n_tokens_ / kTokenTile : 0;
  buf.tiled_qs.resize(tiles * nb * kTokenTile * 32);
  buf.tiled_dx.resize(tiles * nb * kTokenTile);
  std::int8_t* tiled_qs = buf.tiled_qs.data();
  float* tiled_dx = buf.tiled_dx.data();
  pool.parallel_for(tiles, 1, [&](std::size_t b, std::size_t e, int) {
    for (std::size_t tile = b; tile < e; ++tile) {
      for (std::size_t n = 0; n < kTokenTile; ++n) {
        const ActivationBlock* token = act + tile * kTokenTile + n;
        for (std::size_t k = 0; k < nb; ++k) {
          std::memcpy(tiled_qs + ((tile * nb + k) * kTokenTile + n) * 32, token[k * stride].qs, 32);
          tiled_dx[(tile * nb + k) * kTokenTile + n] = token[k * stride].d;
        }
      }
    }
  });
  quantized_ = true;
}

namespace {

// y's rows [b, e) of one matrix (y holds all w.rows of every token). The input is already quantized
// if the matrix reads it so; for the x16 layouts b and e are multiples of 16.
void matmul_rows(const KernelTable& kt, const WeightMatrix& w, const Activations& x, float* y, std::size_t b, std::size_t e) {
  const std::size_t n_tokens = x.n_tokens(), stride = w.row_stride(), ldy = w.rows;
  if (w.layout == Layout::F16x4 || w.layout == Layout::BF16x4) {
    (w.layout == Layout::F16x4 ? kt.gemm_f16_x4 : kt.gemm_bf16_x4)(w.data, w.cols, b, e, x.data(), n_tokens, y, ldy);
    return;
  }
  if (const InterleavedLayout* l = interleaved_layout_of(w.layout)) {
    (kt.*(l->gemm))(w.data, w.cols, b, e, x.rows(w.cols / kQK8_0), n_tokens, y, ldy);
    return;
  }
  switch (w.type) {
    case DType::Q8_0:
    case DType::Q4_0:
      (w.type == DType::Q8_0 ? kt.gemm_q8_0 : kt.gemm_q4_0)(w.data, stride, b, e, x.rows(w.cols / kQK8_0), n_tokens, y, ldy);
      return;
    case DType::F16:
    case DType::BF16:
    case DType::F32:
      (w.type == DType::F16 ? kt.gemm_f16 : w.type == DType::BF16 ? kt.gemm_bf16 : kt.gemm_f32)(w.data, stride, b, e, x.data(), w.cols,
                                                                                                n_tokens, y, ldy);
      return;
    default:
      kt.gemm_dequant(w.type, w.data, stride, w.cols, b, e, x.data(), n_tokens, y, ldy);
      return;
  }
}

}  // namespace

void matmul(const WeightMatrix& w, Activations& x, float* y, ThreadPool& pool) {
  const WeightMatrix* ws[] = {&w};
  float* ys[] = {y};
  matmul_fused(ws, x, ys, pool);
}

void matmul_fused(std::span<const WeightMatrix* const> ws, Activations& x, std::span<float* const> ys, ThreadPool& pool) {
  const KernelTable& kt = kernel_table(active_isa());
  const std::size_t n_tokens = x.n_tokens();
  // Shares are whole tiles: 16 rows (or 32, below) for the x16 layouts, and for fused matrices, so
  // that every matrix boundary (a multiple of 16) falls between tiles; 4 rows otherwise.
  bool tiles_of_16 = ws.size() > 1;
  std::size_t total_rows = 0;
  if (std::any_of(ws.begin(), ws.end(), [](const WeightMatrix* w) { return reads_quantized_input(*w); })) {
    x.quantize(pool, activation_blocks_suffice(ws));
  }
  for (const WeightMatrix* w : ws) {
    tiles_of_16 = tiles_of_16 || w->layout != Layout::Plain;
    total_rows += w->rows;
  }
  if (ws.size() > 1 && std::any_of(ws.begin(), ws.end(), [](const WeightMatrix* w) { return w->rows % 16 != 0; })) {
    for (std::size_t i = 0; i < ws.size(); ++i) matmul(*ws[i], x, ys[i], pool);  // tiny models: no shared tiling
    return;
  }
  // Waking a thread costs microseconds, so each share gets at least ~64K multiply-adds; small
  // matrices (tiny models, single tokens) run on the calling thread alone.
  constexpr std::size_t kMinMacsPerShare = 1 << 16;
  // Pairs of 16-row groups where every matrix has them, so that the two-group tiles of the AVX-512
  // path (tile_groups with G = 2) find whole pairs in every share.
  const bool pairs_of_16 = std::all_of(ws.begin(), ws.end(), [](const WeightMatrix* w) { return w->layout != Layout::Plain && w->rows % 32 == 0; });
  const std::size_t unit = pairs_of_16 ? 32 : tiles_of_16 ? 16 : 4;
  std::size_t grain = std::max<std::size_t>(16, kMinMacsPerShare / std::max<std::size_t>(1, ws[0]->cols * n_tokens));
  grain = (grain + unit - 1) / unit * unit;
  pool.parallel_for(total_rows, grain, [&](std::size_t b, std::size_t e, int) {
    std::size_t first_row = 0;  // of matrix i within the fused rows
    for (std::size_t i = 0; i < ws.size() && first_row < e; first_row += ws[i]->rows, ++i) {
      const std::size_t lo = std::max(b, first_row), hi = std::min(e, first_row + ws[i]->rows);
      if (lo < hi) matmul_rows(kt, *ws[i], x, ys[i], lo - first_row, hi - first_row);
    }
  });
}

bool can_repack_x16(const WeightMatrix& w) {
  if (w.layout != Layout::Plain || w.rows == 0) return false;
  if (w.type == DType::F16 || w.type == DType::BF16) return w.rows % 4 == 0 && w.cols % 16 == 0 && w.cols > 0;
  return interleaved_layout_for(w.type) && w.rows % 16 == 0;
}

std::size_t repacked_bytes(const WeightMatrix& w) {
  if (const InterleavedLayout* l = interleaved_layout_for(w.type)) return w.rows / 16 * (w.cols / l->elems) * l->group_bytes;
  return w.rows * w.row_stride();  // F16x4, BF16x4: the same bytes moved
}

namespace {

// Q4_K, or Q5_K (the same fields, and its quants' fifth bits after them: for sub-block s and weight
// vector k, a 64-bit mask whose bit 4 * lane + e is element 32s + 4k + e's of row `lane`).
template <typename Block>
void repack_k_x16(const WeightMatrix& w, std::uint8_t* out) {
  constexpr bool kQ5 = std::is_same_v<Block, BlockQ5_K>;
  constexpr std::size_t kGroupBytes = kQ5 ? kQ5KGroupBytes : kQ4KGroupBytes;
  const std::size_t nsb = w.cols / kQK_K;
  for (std::size_t grp = 0; grp < w.rows / 16; ++grp) {
    for (std::size_t sb = 0; sb < nsb; ++sb) {
      std::uint8_t* g = out + (grp * nsb + sb) * kGroupBytes;
      if constexpr (kQ5) std::memset(g + kQ4KGroupBytes, 0, kQ5KGroupBytes - kQ4KGroupBytes);
      for (std::size_t lane = 0; lane < 16; ++lane) {
        const Block& src = reinterpret_cast<const Block*>(w.row(grp * 16 + lane))[sb];
        std::memcpy(g + 2 * lane, &src.d, 2);
        std::memcpy(g + 32 + 2 * lane, &src.dmin, 2);
        for (int s = 0; s < 8; ++s) {
          std::uint8_t sc, m;
          q4k_scale_min(s, src.scales, sc, m);
          g[64 + 32 * s + lane] = sc;
          g[64 + 32 * s + 16 + lane] = m;
        }
        for (int p = 0; p < 4; ++p)
          for (int k = 0; k < 8; ++k) std::memcpy(g + 320 + 512 * p + 64 * k + 4 * lane, src.qs + 32 * p + 4 * k, 4);
        if constexpr (kQ5) {
          for (int s = 0; s < 8; ++s) {
            for (int i = 0; i < 32; ++i) {
              std::uint8_t* mask = g + kQ4KGroupBytes + 64 * s + 8 * (i / 4);
              const std::size_t bit = 4 * lane + i % 4;
              mask[bit / 8] |= static_cast<std::uint8_t>(((src.qh[i] >> s) & 1) << (bit % 8));
            }
          }
        }
      }
    }
  }
}

void repack_q6_k_x16(const WeightMatrix& w, std::uint8_t* out) {
  const std::size_t nsb = w.cols / kQK_K;
  std::vector<std::uint8_t> q(kQK_K);
  for (std::size_t grp = 0; grp < w.rows / 16; ++grp) {
    for (std::size_t sb = 0; sb < nsb; ++sb) {
      std::uint8_t* g = out + (grp * nsb + sb) * kQ6KGroupBytes;
      for (std::size_t lane = 0; lane < 16; ++lane) {
        const BlockQ6_K& src = reinterpret_cast<const BlockQ6_K*>(w.row(grp * 16 + lane))[sb];
        std::memcpy(g + 2 * lane, &src.d, 2);
        for (int s = 0; s < 16; ++s) g[32 + 16 * s + lane] = static_cast<std::uint8_t>(src.scales[s]);
        // The 6-bit values in element order (the inverse of ggml's ql/qh packing).
        for (int n = 0; n < 2; ++n) {
          const std::uint8_t* ql = src.ql + 64 * n;
          const std::uint8_t* qh = src.qh + 32 * n;
          for (int l = 0; l < 32; ++l) {
            q[128 * n + l] = static_cast<std::uint8_t>((ql[l] & 0xf) | (((qh[l] >> 0) & 3) << 4));
            q[128 * n + l + 32] = static_cast<std::uint8_t>((ql[l + 32] & 0xf) | (((qh[l] >> 2) & 3) << 4));
            q[128 * n + l + 64] = static_cast<std::uint8_t>((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4));
            q[128 * n + l + 96] = static_cast<std::uint8_t>((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4));
          }
        }
        for (int k = 0; k < 64; ++k) std::memcpy(g + 288 + 64 * k + 4 * lane, &q[4 * static_cast<std::size_t>(k)], 4);
      }
    }
  }
}

void repack_q3_k_x16(const WeightMatrix& w, std::uint8_t* out) {
  const std::size_t nsb = w.cols / kQK_K;
  std::int8_t levels[kQK_K];
  for (std::size_t grp = 0; grp < w.rows / 16; ++grp) {
    for (std::size_t sb = 0; sb < nsb; ++sb) {
      std::uint8_t* g = out + (grp * nsb + sb) * kQ3KGroupBytes;
      std::memset(g + 1312, 0, kQ3KGroupBytes - 1312);
      for (std::size_t lane = 0; lane < 16; ++lane) {
        const BlockQ3_K& src = reinterpret_cast<const BlockQ3_K*>(w.row(grp * 16 + lane))[sb];
        std::memcpy(g + 2 * lane, &src.d, 2);
        for (int s = 0; s < 16; ++s) g[32 + 16 * s + lane] = static_cast<std::uint8_t>(static_cast<std::int8_t>(q3k_scale(s, src.scales)));
        q3_k_levels(src, levels);  // stored + 4: 0..7
        for (int s = 0; s < 16; ++s) {
          const std::int8_t* sub = levels + 16 * s;
          for (int e = 0; e < 4; ++e) {  // byte 4 * lane + e: the low 2 bits of the four vectors' element e
            int low = 0;
            for (int k = 0; k < 4; ++k) low |= ((sub[4 * k + e] + 4) & 3) << (2 * k);
            g[288 + 64 * s + 4 * lane + e] = static_cast<std::uint8_t>(low);
          }
          for (int k = 0; k < 4; ++k) {  // mask k: this row's four third bits are nibble lane % 2 of byte lane / 2
            int third = 0;
            for (int e = 0; e < 4; ++e) third |= (((sub[4 * k + e] + 4) >> 2) & 1) << e;
            g[1312 + 32 * s + 8 * k + lane / 2] |= static_cast<std::uint8_t>(third << (4 * (lane % 2)));
          }
        }
      }
    }
  }
}

void repack_iq4_xs_x16(const WeightMatrix& w, std::uint8_t* out) {
  const std::size_t nsb = w.cols / kQK_K;
  for (std::size_t grp = 0; grp < w.rows / 16; ++grp) {
    for (std::size_t sb = 0; sb < nsb; ++sb) {
      std::uint8_t* g = out + (grp * nsb + sb) * kIQ4XSGroupBytes;
      std::memset(g + 160, 0, kIQ4XSGroupBytes - 160);
      for (std::size_t lane = 0; lane < 16; ++lane) {
        const BlockIQ4_XS& src = reinterpret_cast<const BlockIQ4_XS*>(w.row(grp * 16 + lane))[sb];
        std::memcpy(g + 2 * lane, &src.d, 2);
        for (int s = 0; s < 8; ++s) {
          g[32 + 16 * s + lane] = static_cast<std::uint8_t>(static_cast<std::int8_t>(iq4_xs_scale(src, s)));
          for (int e = 0; e < 32; ++e) {
            const std::uint8_t byte = src.qs[16 * s + e % 16];
            const int index = e < 16 ? byte & 0xf : byte >> 4;
            g[160 + 512 * (s / 2) + 64 * (e / 4) + 4 * lane + e % 4] |= static_cast<std::uint8_t>(index << (4 * (s % 2)));
          }
        }
      }
    }
  }
}

// Q4_0 or Q8_0: per 32-element block, the 16 rows' scales, then their quants 4 bytes at a time.
void repack_q4_0_or_q8_0_x16(const WeightMatrix& w, std::uint8_t* out) {
  const std::size_t nb = w.cols / 32;
  const bool q8 = w.type == DType::Q8_0;
  const std::size_t block_bytes = q8 ? sizeof(BlockQ8_0) : sizeof(BlockQ4_0);
  const int groups = q8 ? 8 : 4;
  for (std::size_t g = 0; g < w.rows / 16; ++g) {
    for (std::size_t b = 0; b < nb; ++b) {
      std::uint8_t* gb = out + (g * nb + b) * 16 * block_bytes;
      for (std::size_t lane = 0; lane < 16; ++lane) {
        const std::uint8_t* src = w.row(g * 16 + lane) + b * block_bytes;  // fp16 d, then the quants
        std::memcpy(gb + 2 * lane, src, 2);
        for (int k = 0; k < groups; ++k) {
          std::uint8_t* dst = gb + 32 + 64 * k + 4 * lane;
          std::memcpy(dst, src + 2 + 4 * k, 4);
          if (q8)
            for (int e = 0; e < 4; ++e) dst[e] ^= 0x80;  // s8 -> u8 (+128)
        }
      }
    }
  }
}

void repack_q4_k_x16(const WeightMatrix& w, std::uint8_t* out) { repack_k_x16<BlockQ4_K>(w, out); }
void repack_q5_k_x16(const WeightMatrix& w, std::uint8_t* out) { repack_k_x16<BlockQ5_K>(w, out); }

const InterleavedLayout kInterleavedLayouts[7] = {
    {DType::Q4_0, Layout::Q4_0x16, 32, kQ4_0GroupBytes, repack_q4_0_or_q8_0_x16, &KernelTable::gemm_q4_0_x16, true},
    {DType::Q8_0, Layout::Q8_0x16, 32, kQ8_0GroupBytes, repack_q4_0_or_q8_0_x16, &KernelTable::gemm_q8_0_x16, true},
    {DType::Q4_K, Layout::Q4_Kx16, kQK_K, kQ4KGroupBytes, repack_q4_k_x16, &KernelTable::gemm_q4_k_x16, true},
    {DType::Q5_K, Layout::Q5_Kx16, kQK_K, kQ5KGroupBytes, repack_q5_k_x16, &KernelTable::gemm_q5_k_x16, true},
    {DType::Q6_K, Layout::Q6_Kx16, kQK_K, kQ6KGroupBytes, repack_q6_k_x16, &KernelTable::gemm_q6_k_x16, false},
    {DType::Q3_K, Layout::Q3_Kx16, kQK_K, kQ3KGroupBytes, repack_q3_k_x16, &KernelTable::gemm_q3_k_x16, false},
    {DType::IQ4_XS, Layout::IQ4_XSx16, kQK_K, kIQ4XSGroupBytes, repack_iq4_xs_x16, &KernelTable::gemm_iq4_xs_x16, true},
};

}  // namespace

Layout repack_x16(const WeightMatrix& w, std::uint8_t* out) {
  if (w.type == DType::F16 || w.type == DType::BF16) {  // the same 2-byte elements moved the same way
    constexpr std::size_t kStepBytes = 16 * 2;
    for (std::size_t g = 0; g < w.rows / 4; ++g) {
      for (std::size_t step = 0; step < w.cols / 16; ++step) {
        for (std::size_t lane = 0; lane < 4; ++lane) {
          std::memcpy(out + ((g * (w.cols / 16) + step) * 4 + lane) * kStepBytes, w.row(g * 4 + lane) + step * kStepBytes, kStepBytes);
        }
      }
    }
    return w.type == DType::F16 ? Layout::F16x4 : Layout::BF16x4;
  }
  const InterleavedLayout* l = interleaved_layout_for(w.type);
  if (!l) throw Error("internal: no interleaved layout for " + std::string(dtype_name(w.type)));
  l->repack(w, out);
  return l->layout;
}

void matmul(const WeightMatrix& w, const float* x, std::size_t n_tokens, float* y, ThreadPool& pool) {
  thread_local ActivationBuffers buffers;  // live only during this call, which never nests
  Activations a(x, n_tokens, w.cols, buffers);
  matmul(w, a, y, pool);
}

}  // namespace promptly::kernels
