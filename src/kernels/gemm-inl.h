// Register-tiled GEMM kernels shared by the AVX2 and AVX-512 translation units. Each includes this
// file after defining `struct Isa` with the few operations that differ (the int8 dot product above
// all: maddubs+madd on AVX2, one VNNI dpbusd on AVX-512). No include guard on purpose: it is
// compiled once per ISA, inside that ISA's namespace, with that ISA's compiler flags.
//
// Tiles are R rows x C tokens (up to 4 x 4): each weight block is loaded once per tile and reused for
// C tokens, each activation block reused for R rows, so prefill does ~R*C multiply-adds per load.
// Rows are walked in the outer loop so a tile's weights (4 rows) stay in L1 while all tokens stream
// past from L2.

namespace {

inline float hsum(__m256 v) {
  __m128 lo = _mm256_castps256_ps128(v), hi = _mm256_extractf128_ps(v, 1);
  lo = _mm_add_ps(lo, hi);
  lo = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));
  lo = _mm_add_ss(lo, _mm_movehdup_ps(lo));
  return _mm_cvtss_f32(lo);
}

inline __m256i load_q4_0(const BlockQ4_0& b) {
  const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b.qs));
  const __m128i mask = _mm_set1_epi8(0x0f);
  const __m128i lo = _mm_and_si128(q, mask), hi = _mm_and_si128(_mm_srli_epi16(q, 4), mask);
  return _mm256_set_m128i(hi, lo);  // elements 0..15 from low nibbles, 16..31 from high nibbles
}

// F16C conversions: the scalar bit-twiddling versions in util/fp16.h are far too slow per block.
inline float h2f(std::uint16_t h) { return _cvtsh_ss(h); }
inline std::uint16_t f2h(float f) { return static_cast<std::uint16_t>(_cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT)); }
inline __m256 fp16x1(std::uint16_t h) { return _mm256_set1_ps(h2f(h)); }

// Starts fetching block b of the next tile's R rows (this tile's first row is `first_row`) when the
// block begins a cache line the previous block did not, so the next rows are in L1 when the tile
// after this one starts. Why: rows of a few cache lines (125m's 768 weights are 24 lines in F16, 13
// in Q8_0) are too short for the hardware prefetchers, which follow each row as a stream and stop
// at its end; without this, decode read 125m-shaped F16 matrices at two thirds of the bandwidth
// that long rows get (BM_MatmulStreaming cols:768 against cols:5632).
template <int R, std::size_t kBlockBytes>
inline void prefetch_next_rows(const std::uint8_t* first_row, std::size_t w_stride, std::size_t b) {
  if ((b * kBlockBytes) % 64 >= kBlockBytes) return;
  for (int i = R; i < 2 * R; ++i) _mm_prefetch(reinterpret_cast<const char*>(first_row + i * w_stride + b * kBlockBytes), _MM_HINT_T0);
}

template <int R, int C>
void tile_q4_0(const std::uint8_t* w, std::size_t w_stride, std::size_t r, const QuantizedRows& x, std::size_t t, float* y,
               std::size_t ldy, float* row_scales) {
  __m256 acc[R][C];
  for (int i = 0; i < R; ++i)
    for (int j = 0; j < C; ++j) acc[i][j] = _mm256_setzero_ps();
  const BlockQ4_0* wr[R];
  for (int i = 0; i < R; ++i) wr[i] = reinterpret_cast<const BlockQ4_0*>(w + (r + i) * w_stride);
  const BlockQ8_0* xt[C];
  for (int j = 0; j < C; ++j) xt[j] = x.blocks + (t + j) * x.n_blocks;
  const std::size_t nb = x.n_blocks;
  for (std::size_t b = 0; b < nb; ++b) {
    prefetch_next_rows<R, sizeof(BlockQ4_0)>(w + r * w_stride, w_stride, b);
    __m256i q[R];
    __m256 dw[R];
    for (int i = 0; i < R; ++i) {
      q[i] = load_q4_0(wr[i][b]);
      const float d = h2f(wr[i][b].d);
      row_scales[i * nb + b] = d;
      dw[i] = _mm256_set1_ps(d);
    }
    for (int j = 0; j < C; ++j) {
      const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xt[j][b].qs));
      const __m256 dx = fp16x1(xt[j][b].d);
      for (int i = 0; i < R; ++i) {
        const __m256 prod = _mm256_cvtepi32_ps(Isa::dot_u8_s8(q[i], xv));
        acc[i][j] = _mm256_fmadd_ps(_mm256_mul_ps(dw[i], dx), prod, acc[i][j]);
      }
    }
  }
  // The weights were used as 0..15; the -8 offset contributes -8 * sum_b d_w[b] * (d_x[b] * sum(x_b)).
  for (int j = 0; j < C; ++j) {
    const float* xs = x.sums + (t + j) * nb;
    for (int i = 0; i < R; ++i) {
      y[(t + j) * ldy + r + i] = hsum(acc[i][j]) - 8.0f * Isa::dot_f32(row_scales + i * nb, xs, nb);
    }
  }
}

template <int R, int C>
void tile_q8_0(const std::uint8_t* w, std::size_t w_stride, std::size_t r, const QuantizedRows& x, std::size_t t, float* y,
               std::size_t ldy, float*) {
  __m256 acc[R][C];
  for (int i = 0; i < R; ++i)
    for (int j = 0; j < C; ++j) acc[i][j] = _mm256_setzero_ps();
  const BlockQ8_0* wr[R];
  for (int i = 0; i < R; ++i) wr[i] = reinterpret_cast<const BlockQ8_0*>(w + (r + i) * w_stride);
  const BlockQ8_0* xt[C];
  for (int j = 0; j < C; ++j) xt[j] = x.blocks + (t + j) * x.n_blocks;
  for (std::size_t b = 0; b < x.n_blocks; ++b) {
    prefetch_next_rows<R, sizeof(BlockQ8_0)>(w + r * w_stride, w_stride, b);
    typename Isa::Q8Weights wv[R];
    __m256 dw[R];
    for (int i = 0; i < R; ++i) {
      wv[i] = Isa::prepare_q8_weights(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(wr[i][b].qs)));
      dw[i] = fp16x1(wr[i][b].d);
    }
    for (int j = 0; j < C; ++j) {
      const auto xv = Isa::prepare_q8_activations(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(xt[j][b].qs)));
      const __m256 dx = fp16x1(xt[j][b].d);
      for (int i = 0; i < R; ++i) {
        const __m256 prod = _mm256_cvtepi32_ps(Isa::dot_q8(wv[i], xv));
        acc[i][j] = _mm256_fmadd_ps(_mm256_mul_ps(dw[i], dx), prod, acc[i][j]);
      }
    }
  }
  for (int j = 0; j < C; ++j)
    for (int i = 0; i < R; ++i) y[(t + j) * ldy + r + i] = hsum(acc[i][j]);
}

// Weights read in place as floats: W is F32, F16 or BF16 (a BF16 is a float's high half, so
// widening it is a shift and exact).
template <DType W>
inline __m256 load_w8(const std::uint8_t* row, std::size_t i) {
  if constexpr (W == DType::F16) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(reinterpret_cast<const std::uint16_t*>(row) + i)));
  } else if constexpr (W == DType::BF16) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(reinterpret_cast<const std::uint16_t*>(row) + i));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  } else {
    return _mm256_loadu_ps(reinterpret_cast<const float*>(row) + i);
  }
}

template <DType W>
inline float load_w1(const std::uint8_t* row, std::size_t i) {
  if constexpr (W == DType::F16) {
    return h2f(reinterpret_cast<const std::uint16_t*>(row)[i]);
  } else if constexpr (W == DType::BF16) {
    return bf16_to_fp32(reinterpret_cast<const std::uint16_t*>(row)[i]);
  } else {
    return reinterpret_cast<const float*>(row)[i];
  }
}

template <DType W, int R, int C>
void tile_float(const std::uint8_t* w, std::size_t w_stride, std::size_t r, const float* x, std::size_t k, std::size_t t, float* y,
                std::size_t ldy) {
  __m256 acc[R][C];
  for (int i = 0; i < R; ++i)
    for (int j = 0; j < C; ++j) acc[i][j] = _mm256_setzero_ps();
  const std::uint8_t* wr[R];
  for (int i = 0; i < R; ++i) wr[i] = w + (r + i) * w_stride;
  std::size_t e = 0;
  for (; e + 8 <= k; e += 8) {
    prefetch_next_rows<R, 8 * (W == DType::F32 ? 4 : 2)>(wr[0], w_stride, e / 8);
    __m256 wv[R];
    for (int i = 0; i < R; ++i) wv[i] = load_w8<W>(wr[i], e);
    for (int j = 0; j < C; ++j) {
      const __m256 xv = _mm256_loadu_ps(x + (t + j) * k + e);
      for (int i = 0; i < R; ++i) acc[i][j] = _mm256_fmadd_ps(wv[i], xv, acc[i][j]);
    }
  }
  for (int j = 0; j < C; ++j) {
    for (int i = 0; i < R; ++i) {
      float s = hsum(acc[i][j]);
      for (std::size_t q = e; q < k; ++q) s += load_w1<W>(wr[i], q) * x[(t + j) * k + q];
      y[(t + j) * ldy + r + i] = s;
    }
  }
}

// Runs tiles over rows [r0, r1) x all tokens, picking the tile shape for the edges.
template <template <int, int> class Kernel, typename... Args>
void tiled(std::size_t r0, std::size_t r1, std::size_t n_tokens, Args&&... args) {
  std::size_t r = r0;
  auto run_rows = [&](auto rows_tag) {
    constexpr int R = decltype(rows_tag)::value;
    std::size_t t = 0;
    for (; t + 4 <= n_tokens; t += 4) Kernel<R, 4>::run(r, t, args...);
    switch (n_tokens - t) {
      case 3: Kernel<R, 3>::run(r, t, args...); break;
      case 2: Kernel<R, 2>::run(r, t, args...); break;
      case 1: Kernel<R, 1>::run(r, t, args...); break;
      default: break;
    }
  };
  for (; r + 4 <= r1; r += 4) run_rows(std::integral_constant<int, 4>{});
  switch (r1 - r) {
    case 3: run_rows(std::integral_constant<int, 3>{}); break;
    case 2: run_rows(std::integral_constant<int, 2>{}); break;
    case 1: run_rows(std::integral_constant<int, 1>{}); break;
    default: break;
  }
}

template <int R, int C>
struct Q4Tile {
  static void run(std::size_t r, std::size_t t, const std::uint8_t* w, std::size_t w_stride, const QuantizedRows& x, float* y,
                  std::size_t ldy, float* scratch) {
    tile_q4_0<R, C>(w, w_stride, r, x, t, y, ldy, scratch);
  }
};
template <int R, int C>
struct Q8Tile {
  static void run(std::size_t r, std::size_t t, const std::uint8_t* w, std::size_t w_stride, const QuantizedRows& x, float* y,
                  std::size_t ldy, float* scratch) {
    tile_q8_0<R, C>(w, w_stride, r, x, t, y, ldy, scratch);
  }
};
template <DType W>
struct FloatTile {
  template <int R, int C>
  struct Of {
    static void run(std::size_t r, std::size_t t, const std::uint8_t* w, std::size_t w_stride, const float* x, std::size_t k, float* y,
                    std::size_t ldy) {
      tile_float<W, R, C>(w, w_stride, r, x, k, t, y, ldy);
    }
  };
};

void gemm_q4_0(const std::uint8_t* w, std::size_t w_stride, std::size_t r0, std::size_t r1, const QuantizedRows& x,
               std::size_t n_tokens, float* y, std::size_t ldy) {
  thread_local std::vector<float> scratch;
  scratch.resize(4 * x.n_blocks);
  tiled<Q4Tile>(r0, r1, n_tokens, w, w_stride, x, y, ldy, scratch.data());
}

void gemm_q8_0(const std::uint8_t* w, std::size_t w_stride, std::size_t r0, std::size_t r1, const QuantizedRows& x,
               std::size_t n_tokens, float* y, std::size_t ldy) {
  tiled<Q8Tile>(r0, r1, n_tokens, w, w_stride, x, y, ldy, static_cast<float*>(nullptr));
}

// (The AVX-512 table has its own F16 and BF16 ones, on 512-bit vectors.)
template <DType W>
void gemm_float(const std::uint8_t* w, std::size_t w_stride, std::size_t r0, std::size_t r1, const float* x, std::size_t k,
                std::size_t n_tokens, float* y, std::size_t ldy) {
  tiled<FloatTile<W>::template Of>(r0, r1, n_tokens, w, w_stride, x, k, y, ldy);
}

// exp(x) for x <= 0 (softmax arguments), 8 at a time: 2^(x log2 e) split into an integer power of
// two and a degree-6 polynomial on [-0.5, 0.5]; relative error ~2e-7, below float rounding of the
// sums it feeds. Arguments below -87 flush to 0.
inline __m256 exp256(__m256 x) {
  x = _mm256_max_ps(x, _mm256_set1_ps(-87.0f));
  const __m256 t = _mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f));
  const __m256 n = _mm256_round_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m256 f = _mm256_sub_ps(t, n);  // in [-0.5, 0.5]
  // 2^f = e^(f ln 2): Taylor terms of e^y with y = f ln 2, enough for float precision.
  const __m256 y = _mm256_mul_ps(f, _mm256_set1_ps(0.693147180559945309f));
  __m256 p = _mm256_set1_ps(1.0f / 720.0f);
  p = _mm256_fmadd_ps(p, y, _mm256_set1_ps(1.0f / 120.0f));
  p = _mm256_fmadd_ps(p, y, _mm256_set1_ps(1.0f / 24.0f));
  p = _mm256_fmadd_ps(p, y, _mm256_set1_ps(1.0f / 6.0f));
  p = _mm256_fmadd_ps(p, y, _mm256_set1_ps(0.5f));
  p = _mm256_fmadd_ps(p, y, _mm256_set1_ps(1.0f));
  p = _mm256_fmadd_ps(p, y, _mm256_set1_ps(1.0f));
  const __m256i pow2n = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(p, _mm256_castsi256_ps(pow2n));
}

// Online-softmax attention for one head (see KernelTable::attention); head_dim a multiple of 8 takes
// the vector path, anything else the scalar tail.
// Eight cached elements starting at element e of a block (e a multiple of 8, so a Q8_0 load never
// crosses one of its 32-element blocks).
template <DType T>
inline __m256 kv_load8(const void* block, std::size_t e) {
  if constexpr (T == DType::F32) {
    return _mm256_loadu_ps(static_cast<const float*>(block) + e);
  } else if constexpr (T == DType::F16) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const std::uint16_t*>(block) + e)));
  } else {
    const BlockQ8_0& b = static_cast<const BlockQ8_0*>(block)[e / kQK8_0];
    const __m128i q8 = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(b.qs + e % kQK8_0));
    return _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q8)), _mm256_set1_ps(h2f(b.d)));
  }
}
template <DType T>
void attention_impl(const float* q, const void* const* k_blocks, const void* const* v_blocks, std::size_t block_tokens,
                    std::size_t stride, std::size_t offset, std::size_t n_ctx, std::size_t head_dim, float scale, float* out,
                    float* lse) {
  struct Row {
    const void* block;
    std::size_t e;  // element index of the row's first element of this head
  };
  auto key = [&](std::size_t j) { return Row{k_blocks[j / block_tokens], (j % block_tokens) * stride + offset}; };
  auto value = [&](std::size_t j) { return Row{v_blocks[j / block_tokens], (j % block_tokens) * stride + offset}; };
  constexpr std::size_t kMaxVec = 32;  // up to 256-wide heads in registers
  const std::size_t nv = head_dim / 8;
  if (head_dim % 8 != 0 || offset % 8 != 0 || stride % 8 != 0 || nv > kMaxVec) {  // unusual head sizes: the reference path
    scalar_kernels().attention(q, k_blocks, v_blocks, T, block_tokens, stride, offset, n_ctx, head_dim, scale, out, lse);
    return;
  }
  __m256 qv[kMaxVec], acc[kMaxVec];
  for (std::size_t i = 0; i < nv; ++i) {
    qv[i] = _mm256_mul_ps(_mm256_loadu_ps(q + 8 * i), _mm256_set1_ps(scale));
    acc[i] = _mm256_setzero_ps();
  }
  // Positions go in chunks of 8: eight scores, one max, one rescale and one vector exp per chunk.
  float m = -INFINITY, l = 0.0f;
  alignas(32) float s8[8], p8[8];
  for (std::size_t j0 = 0; j0 < n_ctx; j0 += 8) {
    const std::size_t n = std::min<std::size_t>(8, n_ctx - j0);
    float chunk_max = -INFINITY;
    for (std::size_t u = 0; u < 8; ++u) {
      if (u < n) {
        const Row kj = key(j0 + u);
        __m256 d = _mm256_mul_ps(qv[0], kv_load8<T>(kj.block, kj.e));
        for (std::size_t i = 1; i < nv; ++i) d = _mm256_fmadd_ps(qv[i], kv_load8<T>(kj.block, kj.e + 8 * i), d);
        s8[u] = hsum(d);
        chunk_max = std::max(chunk_max, s8[u]);
      } else {
        s8[u] = -INFINITY;
      }
    }
    if (chunk_max > m) {
      const float c = std::exp(m - chunk_max);  // 0 on the first chunk
      const __m256 cv = _mm256_set1_ps(c);
      for (std::size_t i = 0; i < nv; ++i) acc[i] = _mm256_mul_ps(acc[i], cv);
      l *= c;
      m = chunk_max;
    }
    const __m256 pv = exp256(_mm256_sub_ps(_mm256_load_ps(s8), _mm256_set1_ps(m)));
    _mm256_store_ps(p8, pv);
    for (std::size_t u = 0; u < n; ++u) {
      l += p8[u];
      const __m256 pu = _mm256_set1_ps(p8[u]);
      const Row vj = value(j0 + u);
      for (std::size_t i = 0; i < nv; ++i) acc[i] = _mm256_fmadd_ps(pu, kv_load8<T>(vj.block, vj.e + 8 * i), acc[i]);
    }
  }
  const __m256 inv = _mm256_set1_ps(l > 0.0f ? 1.0f / l : 0.0f);
  for (std::size_t i = 0; i < nv; ++i) _mm256_storeu_ps(out + 8 * i, _mm256_mul_ps(acc[i], inv));
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

// Types without a kernel of their own for this layout (K-quants whose rows are not a multiple of
// 16): a row is dequantized, then dotted with every token. The K-quant reference code is compiled
// here with this TU's flags, which vectorizes it.
void gemm_dequant(DType type, const std::uint8_t* w, std::size_t w_stride, std::size_t cols, std::size_t r0, std::size_t r1,
                  const float* x, std::size_t n_tokens, float* y, std::size_t ldy) {
  thread_local std::vector<float> row;
  row.resize(cols);
  for (std::size_t r = r0; r < r1; ++r) {
    const std::uint8_t* src = w + r * w_stride;
    if (type == DType::Q4_K) {
      dequantize_q4_k(reinterpret_cast<const BlockQ4_K*>(src), row.data(), cols / kQK_K);
    } else if (type == DType::Q5_K) {
      dequantize_q5_k(reinterpret_cast<const BlockQ5_K*>(src), row.data(), cols / kQK_K);
    } else if (type == DType::Q6_K) {
      dequantize_q6_k(reinterpret_cast<const BlockQ6_K*>(src), row.data(), cols / kQK_K);
    } else if (type == DType::IQ4_XS) {
      dequantize_iq4_xs(reinterpret_cast<const BlockIQ4_XS*>(src), row.data(), cols / kQK_K);
    } else {
      dequantize_row(type, src, row.data(), cols);
    }
    for (std::size_t t = 0; t < n_tokens; ++t) y[t * ldy + r] = Isa::dot_f32(row.data(), x + t * cols, cols);
  }
}

// Activations to Q8_0 in every form (see KernelTable::quantize_activations), bit-identical to the
// scalar reference (the same rounding of x / d).
void quantize_activations(const float* x, std::size_t n, const QuantizedToken& out) {
  const __m256 sign_mask = _mm256_set1_ps(-0.0f);
  for (std::size_t b = 0; b < n / kQK8_0; ++b, x += kQK8_0) {
    __m256 v[4];
    __m256 amax = _mm256_setzero_ps();
    for (int k = 0; k < 4; ++k) {
      v[k] = _mm256_loadu_ps(x + 8 * k);
      amax = _mm256_max_ps(amax, _mm256_andnot_ps(sign_mask, v[k]));
    }
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(amax), _mm256_extractf128_ps(amax, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_movehdup_ps(m));
    const float d = _mm_cvtss_f32(m) / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    BlockQ8_0 scratch;
    BlockQ8_0& y = out.blocks ? out.blocks[b] : scratch;
    y.d = f2h(d);
    const __m256 idv = _mm256_set1_ps(id);
    __m256i q32[4];
    for (int k = 0; k < 4; ++k) q32[k] = _mm256_cvtps_epi32(_mm256_mul_ps(v[k], idv));  // round-to-nearest-even, as lrintf
    const __m256i p01 = _mm256_packs_epi32(q32[0], q32[1]), p23 = _mm256_packs_epi32(q32[2], q32[3]);
    __m256i p = _mm256_packs_epi16(p01, p23);
    p = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));  // undo the lane interleave of the packs
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(y.qs), p);
    // Both halves' sums in one reduction: [lo, hi, lo, hi].
    const __m256i s01 = _mm256_add_epi32(q32[0], q32[1]), s23 = _mm256_add_epi32(q32[2], q32[3]);
    __m128i s = _mm_hadd_epi32(_mm_add_epi32(_mm256_castsi256_si128(s01), _mm256_extracti128_si256(s01, 1)),
                               _mm_add_epi32(_mm256_castsi256_si128(s23), _mm256_extracti128_si256(s23, 1)));
    s = _mm_hadd_epi32(s, s);
    store_activation_block(b, y, h2f(y.d), _mm_cvtsi128_si32(s), _mm_extract_epi32(s, 1), out);
  }
}

}  // namespace
