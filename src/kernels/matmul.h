#pragma once
// Matrix multiplication against weights in their stored type. A weight matrix is ggml-shaped:
// `rows` output features, each a contiguous row of `cols` input features.
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "kernels/dispatch.h"
#include "tensor/dtype.h"
#include "util/thread_pool.h"

namespace promptly::kernels {

// How a matrix's blocks are laid out in memory.
enum class Layout {
  Plain,    // ggml's: one row after another
  Q4_0x16,  // Q4_0 repacked for the AVX-512 kernels: see repack_x16
  Q8_0x16,  // Q8_0 likewise
  Q4_Kx16,  // Q4_K likewise, scales unpacked (see repack_x16)
  Q5_Kx16,  // Q5_K likewise: Q4_Kx16's, with each quant's fifth bit as 64-bit masks
  Q6_Kx16,  // Q6_K likewise, quants unpacked to bytes
  Q3_Kx16,  // Q3_K likewise: Q6_Kx16's scales, each level's low 2 bits packed four vectors to a byte, third bits as masks
  IQ4_XSx16,  // IQ4_XS likewise: Q4_Kx16's arrangement, int8 scales and no mins
  F16x4,    // F16, 4 rows interleaved 16 columns at a time (see repack_x16)
  BF16x4,   // BF16 likewise
};

struct WeightMatrix {
  DType type = DType::F32;
  const std::uint8_t* data = nullptr;
  std::size_t rows = 0;
  std::size_t cols = 0;
  Layout layout = Layout::Plain;

  std::size_t row_stride() const { return row_bytes(type, cols); }
  const std::uint8_t* row(std::size_t r) const { return data + r * row_stride(); }
};

// Where an input's quantized form lives. Reused across calls (a model keeps one per input it
// quantizes), so that a prompt's megabytes of activation blocks are not fresh pages, faulted in and
// zeroed, in every layer.
struct ActivationBuffers {
  std::vector<BlockQ8_0> q8;
  std::vector<float> sums;
  std::vector<float> half_sums;
  std::vector<ActivationBlock> act;
  std::vector<std::int8_t> tiled_qs;
  std::vector<float> tiled_dx;
};

// The input of one or more matmuls: n_tokens rows of k floats. Integer kernels need it quantized to
// Q8_0; that happens once, on first use, and is shared by every matmul that reads the same input
// (q/k/v, gate/up).
class Activations {
 public:
  Activations(const float* x, std::size_t n_tokens, std::size_t k)
      : x_(x), n_tokens_(n_tokens), k_(k), act_stride_(padded_act_stride(n_tokens)), buffers_(&owned_) {}
  // Quantizes into `buffers` (which must outlive this object and not be shared with a live one).
  Activations(const float* x, std::size_t n_tokens, std::size_t k, ActivationBuffers& buffers)
      : x_(x), n_tokens_(n_tokens), k_(k), act_stride_(padded_act_stride(n_tokens)), buffers_(&buffers) {}
  Activations(const Activations&) = delete;
  Activations& operator=(const Activations&) = delete;

  const float* data() const { return x_; }
  std::size_t n_tokens() const { return n_tokens_; }
  std::size_t k() const { return k_; }

  // Every token quantized to Q8_0, in every form the kernels read (see QuantizedRows), or with
  // `activation_blocks_only` in the ActivationBlocks alone (all a matrix whose kernels read nothing
  // else needs: the other forms are 46 of the 94 bytes written per block, and those writes were a
  // third of the quantizer's time in an 8-token decode step). Done once; again only if more forms
  // are wanted than were made.
  void quantize(ThreadPool& pool, bool activation_blocks_only = false);
  // The same, for a caller that produces the input token by token in a parallel job of its own (a
  // norm, SwiGLU) and quantizes each token there, while it is in cache, rather than in one more
  // job with its own wake-up and barrier: begin_quantize_for(the matrices that will read it), which
  // picks the forms they read, or returns false when none reads its input quantized; if true,
  // quantize_token(t) for every token exactly once (from any threads), then end_quantize(pool).
  bool begin_quantize_for(std::span<const WeightMatrix* const> readers);
  void quantize_token(std::size_t t);
  void end_quantize(ThreadPool& pool);
  // What the kernels read; without the other forms (activation_blocks_only) their pointers are null.
  QuantizedRows rows(std::size_t n_blocks) const {
    const bool tiled = !buffers_->tiled_qs.empty();  // quantize() leaves it empty without a whole tile
    const bool all = !activation_blocks_only_;
    return {all ? buffers_->q8.data() : nullptr,
            all ? buffers_->sums.data() : nullptr,
            n_blocks,
            all ? buffers_->half_sums.data() : nullptr,
            buffers_->act.data(),
            act_stride(),
            tiled ? buffers_->tiled_qs.data() : nullptr,
            tiled ? buffers_->tiled_dx.data() : nullptr};
  }
  bool quantized() const { return quantized_; }
  // Tokens between consecutive blocks of the block-major ActivationBlocks (see QuantizedRows::act):
  // the token count, padded for prompts so that consecutive blocks do not start at the same offset
  // within 4 KiB. Why: a tile reads one block's tokens, then the next block's a stride further; at
  // 512 tokens (24 KiB, six pages) every block would fall on the same L1 sets and evict the others.
  std::size_t act_stride() const { return act_stride_; }

 private:
  void begin_quantize(bool activation_blocks_only);
  static std::size_t padded_act_stride(std::size_t n_tokens) {
    std::size_t stride = n_tokens;
    if (n_tokens >= 16) {
      while ((stride * sizeof(ActivationBlock)) % 4096 < 1024) ++stride;
    }
    return stride;
  }

  const float* x_;
  std::size_t n_tokens_, k_, act_stride_;
  bool quantized_ = false;
  bool activation_blocks_only_ = false;
  const KernelTable* kernels_ = nullptr;  // set by begin_quantize
  ActivationBuffers owned_;
  ActivationBuffers* buffers_;
};


// y[t * w.rows + r] = dot(w.row(r), token t) for every token. Each weight row is read once per call
// whatever the number of tokens: a batch of sequences or a prefill chunk costs one pass over the
// weights. Uses the kernel path of kernels::active_isa().
void matmul(const WeightMatrix& w, Activations& x, float* y, ThreadPool& pool);

// The same for several matrices that read the same input (q/k/v, gate/up), as one parallel job over
// all of their rows: one wake-up and one barrier instead of one per matrix, which at a single token
// is a sizable part of a small model's step. Every matrix has x.k() columns; ys[i] gets ws[i]'s rows.
void matmul_fused(std::span<const WeightMatrix* const> ws, Activations& x, std::span<float* const> ys, ThreadPool& pool);

// Convenience for a one-off input.
void matmul(const WeightMatrix& w, const float* x, std::size_t n_tokens, float* y, ThreadPool& pool);

float dot_f32(const float* a, const float* b, std::size_t n);

// Q4_0 / Q8_0 interleaved by 16 rows. Why: the plain layout makes every 32-element block of every
// row a separate dot product, each paying an int->float conversion and two float operations; with
// 16 rows side by side, one VNNI instruction advances 16 rows at once (one row per 32-bit lane), 8
// of them finish a block for all 16 rows, and the float work is shared 16 ways. Per group of 16 rows
// and per block: the 16 fp16 scales (32 bytes), then for each 4-byte group g of the block's quants
// (4 for Q4_0, 8 for Q8_0) those 4 bytes of rows 0..15 (64 bytes). Q8_0 quants are stored + 128
// (unsigned, as VNNI wants one operand; the activation sums undo the offset). The size is unchanged
// (16 x 18 or 16 x 34 bytes per block). rows must be a multiple of 16.
// Q4_K: per group of 16 rows and per 256-element super-block: the 16 fp16 d, the 16 fp16 dmin, then
// per 32-element sub-block s the 16 unpacked 6-bit scales and 16 mins (one byte each), then per pair
// of sub-blocks (2p, 2p+1) eight 4-byte groups of 16 rows (low nibbles: sub-block 2p, high: 2p+1).
// 2368 bytes for 16 rows x 144: 3% larger, so the scales need no unpacking in the kernel.
// Q6_K: per group and super-block: the 16 fp16 d, the 16 sub-block scales of each row (int8,
// sub-block-major: 16 x 16 bytes), then the 6-bit quants as bytes (0..63) in 64 four-element groups
// of 16 rows. 4384 bytes for 16 x 210 (30% larger: unpacking 6-bit fields per token would cost more
// than reading the bytes; Q6_K is a minority of a Q4_K_M file).
// Q3_K: per group and super-block: the 16 fp16 d, the 16 sub-block scales of each row (int8,
// -32..31, placed as Q6_Kx16's), then for each 16-element sub-block s 64 bytes whose bits 2k, 2k + 1
// at byte 4 * row + e are the low 2 bits of element 16s + 4k + e's level (stored + 4: 0..7), then
// per sub-block four 64-bit masks, bit 4 * row + e of mask k its third bit. 1824 bytes for 16 x 110
// (3.6% larger): one load and a shift per weight vector, where Q6_Kx16's bytes would be 2.4x the file.
// IQ4_XS: per group and super-block: the 16 fp16 d, per 32-element sub-block s the 16 rows' signed
// scales (int8, -32..31), then the 4-bit level indices arranged as Q4_Kx16's quants (per pair of
// sub-blocks, low nibbles sub-block 2p, high 2p + 1). 2208 bytes for 16 x 136 (1.5% larger).
// F16 by 4 rows: per group of 4 rows and per 16 columns, those 16 halves of rows 0..3 (128 bytes);
// rows a multiple of 4, cols of 16. Why: the float kernel takes 4 rows at a time (4 sums in flight
// hide the FMA latency), and from the plain layout that is 4 streams a row apart, each started cold
// at every tile (one token over 512 columns: 9.4 GB/s on one Zen 4 core where one row at a time gave
// 20); interleaved they are one stream, on the huge pages of the repacked buffer. The arithmetic is
// the plain tile's, so the sums are the same bit for bit.
bool can_repack_x16(const WeightMatrix& w);
std::size_t repacked_bytes(const WeightMatrix& w);
// Returns the layout the repacked data has.
Layout repack_x16(const WeightMatrix& w, std::uint8_t* out);

}  // namespace promptly::kernels
