// Every fast path against the scalar reference on random data of awkward sizes (row counts and token
// counts that are not multiples of the 4 x 4 tile, lengths that are not multiples of 8 or 16).
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <random>
#include <sstream>
#include <vector>

#include "../test_util.h"
#include "engine/generate.h"
#include "kernels/cpu.h"
#include "kernels/dispatch.h"
#include "kernels/matmul.h"
#include "tensor/quant.h"
#include "util/error.h"
#include "util/fp16.h"

namespace promptly::kernels {
namespace {

std::vector<Isa> fast_paths() {
  std::vector<Isa> out;
  if (static_cast<int>(best_isa()) >= static_cast<int>(Isa::Avx2)) out.push_back(Isa::Avx2);
  if (static_cast<int>(best_isa()) >= static_cast<int>(Isa::Avx512)) out.push_back(Isa::Avx512);
  if (best_isa() == Isa::Amx) out.push_back(Isa::Amx);
  return out;
}

// Restores the default path however a test ends.
struct IsaGuard {
  ~IsaGuard() { set_isa(best_isa()); }
};

TEST(Dispatch, ParsesAndRejectsNames) {
  EXPECT_EQ(parse_isa("avx2"), Isa::Avx2);
  EXPECT_THROW(parse_isa("neon"), Error);
  EXPECT_STREQ(kernel_table(Isa::Scalar).name, "scalar");
}

TEST(Dispatch, QuantizeActivationsBitIdenticalToScalar) {
  std::mt19937 rng(11);
  std::normal_distribution<float> dist(0.0f, 3.0f);
  for (Isa isa : fast_paths()) {
    for (std::size_t n : {32u, 96u, 2048u}) {
      std::vector<float> x(n);
      for (float& v : x) v = dist(rng);
      x[0] = 0.5f * 127.0f / 127.0f;  // values landing exactly on .5 after scaling exercise the rounding mode
      // Every form of the token, the ActivationBlocks a stride of 3 apart (as for a 3-token input).
      struct Forms {
        explicit Forms(std::size_t nb) : blocks(nb), sums(nb), half_sums(2 * nb), act(3 * nb) {}
        QuantizedToken out() { return {blocks.data(), sums.data(), half_sums.data(), act.data(), 3}; }
        std::vector<BlockQ8_0> blocks;
        std::vector<float> sums, half_sums;
        std::vector<ActivationBlock> act;
      } a(n / 32), b(n / 32);
      scalar_kernels().quantize_activations(x.data(), n, a.out());
      kernel_table(isa).quantize_activations(x.data(), n, b.out());
      // The ActivationBlocks alone (the other forms null) are the same blocks.
      std::vector<ActivationBlock> only(3 * (n / 32));
      kernel_table(isa).quantize_activations(x.data(), n, {nullptr, nullptr, nullptr, only.data(), 3});
      for (std::size_t k = 0; k < n / 32; ++k) ASSERT_EQ(0, std::memcmp(&only[3 * k], &b.act[3 * k], sizeof(ActivationBlock))) << isa_name(isa);
      for (std::size_t k = 0; k < n / 32; ++k) {
        ASSERT_EQ(a.blocks[k].d, b.blocks[k].d) << isa_name(isa);
        for (int j = 0; j < 32; ++j) ASSERT_EQ(a.blocks[k].qs[j], b.blocks[k].qs[j]) << isa_name(isa) << " block " << k << " j " << j;
        ASSERT_EQ(a.sums[k], b.sums[k]);
        ASSERT_EQ(a.half_sums[2 * k], b.half_sums[2 * k]);
        ASSERT_EQ(a.half_sums[2 * k + 1], b.half_sums[2 * k + 1]);
        const ActivationBlock &p = a.act[3 * k], &q = b.act[3 * k];
        ASSERT_EQ(0, std::memcmp(p.qs, q.qs, sizeof p.qs));
        ASSERT_EQ(0, std::memcmp(p.qs, a.blocks[k].qs, sizeof p.qs));
        ASSERT_EQ(p.d, q.d);
        ASSERT_EQ(p.offset_q4, q.offset_q4);
        ASSERT_EQ(p.offset_q8, q.offset_q8);
        ASSERT_EQ(p.sum, q.sum);
        // The scalar path against the definitions: offsets and sums from the quants themselves.
        int lo = 0, hi = 0;
        for (int j = 0; j < 16; ++j) lo += a.blocks[k].qs[j];
        for (int j = 16; j < 32; ++j) hi += a.blocks[k].qs[j];
        ASSERT_EQ(p.offset_q4, -8 * (lo + hi));
        ASSERT_EQ(p.offset_q8, -128 * (lo + hi));
        ASSERT_FLOAT_EQ(a.half_sums[2 * k], p.d * static_cast<float>(lo));
        ASSERT_FLOAT_EQ(a.half_sums[2 * k + 1], p.d * static_cast<float>(hi));
        ASSERT_FLOAT_EQ(p.sum, p.d * static_cast<float>(lo + hi));
      }
    }
  }
}

// Integer kernels produce the same int32 block sums on every path, so results agree to float
// rounding; F16/F32 sum in a different order, so they agree to a relative 1e-5.
TEST(Dispatch, MatmulEveryTypeMatchesScalar) {
  IsaGuard guard;
  std::mt19937 rng(5);
  std::normal_distribution<float> dist;
  for (DType type : {DType::Q4_0, DType::Q8_0, DType::F16, DType::F32, DType::Q4_K, DType::Q6_K, DType::BF16, DType::Q5_0, DType::Q5_K,
                     DType::IQ4_XS, DType::Q3_K}) {
    const bool k_quant = dtype_info(type).block_size == 256;
    const bool per_element = dtype_info(type).block_size == 1;  // F16, F32, BF16: any row length (vector tails)
    for (std::size_t cols : k_quant       ? std::vector<std::size_t>{256, 768}
                            : per_element ? std::vector<std::size_t>{7, 37, 200}
                                          : std::vector<std::size_t>{32, 96, 200 - 200 % 32 + 32}) {
      for (std::size_t rows : {1u, 5u, 19u}) {
        for (std::size_t tokens : {1u, 3u, 6u}) {
          std::vector<float> wf(rows * cols), x(tokens * cols);
          for (float& v : wf) v = dist(rng);
          for (float& v : x) v = dist(rng);
          std::vector<std::uint8_t> w(rows * row_bytes(type, cols));
          for (std::size_t r = 0; r < rows; ++r) quantize_row(type, &wf[r * cols], &w[r * row_bytes(type, cols)], cols);
          ThreadPool pool(2);
          set_isa(Isa::Scalar);
          std::vector<float> ref(tokens * rows), got(tokens * rows);
          matmul({type, w.data(), rows, cols}, x.data(), tokens, ref.data(), pool);
          for (Isa isa : fast_paths()) {
            set_isa(isa);
            matmul({type, w.data(), rows, cols}, x.data(), tokens, got.data(), pool);
            for (std::size_t i = 0; i < ref.size(); ++i) {
              ASSERT_NEAR(got[i], ref[i], 1e-5f * (std::fabs(ref[i]) + std::sqrt(static_cast<float>(cols))))
                  << dtype_name(type) << " " << isa_name(isa) << " rows " << rows << " cols " << cols << " tokens " << tokens;
            }
          }
        }
      }
    }
  }
}

TEST(Dispatch, DotF32OddLengths) {
  std::mt19937 rng(2);
  std::normal_distribution<float> dist;
  for (Isa isa : fast_paths()) {
    for (std::size_t n : {0u, 1u, 7u, 9u, 17u, 33u, 100u, 1001u}) {
      std::vector<float> a(n), b(n);
      for (float& v : a) v = dist(rng);
      for (float& v : b) v = dist(rng);
      double ref = 0;
      for (std::size_t i = 0; i < n; ++i) ref += static_cast<double>(a[i]) * b[i];
      EXPECT_NEAR(kernel_table(isa).dot_f32(a.data(), b.data(), n), ref, 1e-4 * (1 + std::sqrt(static_cast<double>(n))))
          << isa_name(isa) << " n " << n;
    }
  }
}

TEST(Dispatch, SiluMulMatchesReference) {
  std::mt19937 rng(4);
  std::normal_distribution<float> dist(0.0f, 4.0f);
  for (Isa isa : fast_paths()) {
    for (std::size_t n : {1u, 15u, 16u, 17u, 33u, 5635u}) {
      std::vector<float> gate(n), up(n);
      for (float& v : gate) v = dist(rng);
      for (float& v : up) v = dist(rng);
      const float extremes[] = {0.0f, -0.0f, 1e-30f, -1e-30f, 20.0f, -20.0f, 88.0f, -88.0f, 100.0f, -100.0f, 1e30f, -1e30f};
      for (std::size_t i = 0; i < std::size(extremes) && i < n; ++i) gate[i] = extremes[i];
      std::vector<float> got = gate, want = gate;
      kernel_table(isa).silu_mul(got.data(), up.data(), n);
      silu_mul_reference(want.data(), up.data(), n);
      for (std::size_t i = 0; i < n; ++i) {
        // Absolute slack for gates below -87, where silu is under 1e-35 and the fast exp stops.
        ASSERT_NEAR(got[i], want[i], 1e-6f * std::fabs(want[i]) + 1e-30f) << isa_name(isa) << " n " << n << " gate " << gate[i];
      }
    }
  }
}

TEST(Dispatch, GeluTanhMulMatchesReference) {
  std::mt19937 rng(5);
  std::normal_distribution<float> dist(0.0f, 3.0f);
  for (Isa isa : fast_paths()) {
    for (std::size_t n : {1u, 15u, 16u, 17u, 33u, 6912u}) {
      std::vector<float> gate(n), up(n);
      for (float& v : gate) v = dist(rng);
      for (float& v : up) v = dist(rng);
      const float extremes[] = {0.0f, -0.0f, 1e-30f, -1e-30f, 5.0f, -5.0f, 12.0f, -12.0f, 100.0f, -100.0f, 1e10f, -1e10f};
      for (std::size_t i = 0; i < std::size(extremes) && i < n; ++i) gate[i] = extremes[i];
      std::vector<float> got = gate, want = gate;
      kernel_table(isa).gelu_tanh_mul(got.data(), up.data(), n);
      gelu_tanh_mul_reference(want.data(), up.data(), n);
      for (std::size_t i = 0; i < n; ++i) {
        // z = 2a is rounded a few times (the kernel fuses a multiply-add), each rounding moving
        // sigmoid(z) by up to |z| ulp where z is negative.
        const double g = gate[i], a = 0.7978845608028654 * (g + 0.044715 * g * g * g);
        const double slack = 4e-7 * (1.0 + std::min(std::fabs(2.0 * a), 1e3));
        ASSERT_NEAR(got[i], want[i], slack * std::fabs(want[i]) + 1e-30) << isa_name(isa) << " n " << n << " gate " << gate[i];
        // And both are GELU-tanh's definition, in double (as g sigmoid(2a): 1 + tanh(a) cancels
        // even in double for gates below about -7).
        const double exact = g / (1.0 + std::exp(-2.0 * a)) * up[i];
        ASSERT_NEAR(got[i], exact, 2 * slack * std::fabs(exact) + 1e-30) << isa_name(isa) << " gate " << gate[i];
      }
    }
  }
}

// No accuracy regression: the trained model's greedy reference holds on every path.
TEST(Dispatch, StoriesGreedyReferenceOnEveryPath) {
  IsaGuard guard;
  auto file = gguf::File::open(test::shared_model("stories260K.gguf"));
  Model model(file);
  Tokenizer tok(Vocab::from_gguf(*file));
  std::istringstream in(test::read_file(test::shared_model("testvectors/stories260K.greedy200.ids")));
  std::vector<std::int32_t> ref;
  for (std::int32_t id; in >> id;) ref.push_back(id);
  std::vector<Isa> paths = {Isa::Scalar};
  for (Isa isa : fast_paths()) paths.push_back(isa);
  for (Isa isa : paths) {
    set_isa(isa);
    ThreadPool pool(2);
    GenerateOptions o;
    o.max_tokens = 200;
    o.sampling.temperature = 0;
    EXPECT_EQ(generate(model, tok, {1}, o, pool).ids, ref) << isa_name(isa);
  }
}

}  // namespace
}  // namespace promptly::kernels

namespace promptly::kernels {
namespace {

TEST(Dispatch, InterleavedLayoutsMatchPlainOnEveryPath) {
  IsaGuard guard;
  std::mt19937 rng(9);
  std::normal_distribution<float> dist;
  for (DType type : {DType::Q4_0, DType::Q8_0, DType::Q4_K, DType::Q5_K, DType::Q6_K, DType::IQ4_XS, DType::Q3_K})
  for (std::size_t cols : {256u, 512u, 768u}) {
    for (std::size_t rows : {16u, 48u}) {
      for (std::size_t tokens : {1u, 2u, 5u, 9u, 23u, 700u}) {
        if (tokens == 700 && cols != 768) continue;  // more tokens than one panel of the x16 driver (682 at 24 blocks)
        std::vector<float> wf(rows * cols), x(tokens * cols);
        for (float& v : wf) v = dist(rng);
        for (float& v : x) v = dist(rng);
        std::vector<std::uint8_t> w(rows * row_bytes(type, cols));
        for (std::size_t r = 0; r < rows; ++r) quantize_row(type, &wf[r * cols], &w[r * row_bytes(type, cols)], cols);
        const WeightMatrix plain{type, w.data(), rows, cols};
        ASSERT_TRUE(can_repack_x16(plain));
        std::vector<std::uint8_t> packed(repacked_bytes(plain));
        const Layout layout = repack_x16(plain, packed.data());
        EXPECT_EQ(layout == Layout::Q8_0x16, type == DType::Q8_0);
        EXPECT_EQ(layout == Layout::Q4_Kx16, type == DType::Q4_K);
        EXPECT_EQ(layout == Layout::Q5_Kx16, type == DType::Q5_K);
        EXPECT_EQ(layout == Layout::Q6_Kx16, type == DType::Q6_K);
        EXPECT_EQ(layout == Layout::IQ4_XSx16, type == DType::IQ4_XS);
        EXPECT_EQ(layout == Layout::Q3_Kx16, type == DType::Q3_K);
        const WeightMatrix inter{type, packed.data(), rows, cols, layout};
        ThreadPool pool(2);
        set_isa(Isa::Scalar);
        std::vector<float> plain_ref(tokens * rows), ref(tokens * rows), got(tokens * rows);
        matmul(plain, x.data(), tokens, plain_ref.data(), pool);
        matmul(inter, x.data(), tokens, ref.data(), pool);  // the layout's scalar reference
        // Against the plain layout: equal for Q4_0/Q8_0 (both use int8 activations); the K-quants' plain path
        // uses float activations, so there the int8 rounding bound applies (half a step per value).
        std::vector<float> deq(cols);
        for (std::size_t r = 0; r < rows; ++r) {
          dequantize_row(type, &w[r * row_bytes(type, cols)], deq.data(), cols);
          for (std::size_t t = 0; t < tokens; ++t) {
            double bound = 1e-4 * std::sqrt(static_cast<double>(cols)) + 1e-5 * std::fabs(plain_ref[t * rows + r]);
            if (dtype_info(type).block_size == kQK_K) {  // the K-quants and IQ4_XS
              for (std::size_t b = 0; b < cols / 32; ++b) {
                double amax = 0, wsum = 0;
                for (std::size_t c = 32 * b; c < 32 * b + 32; ++c) {
                  amax = std::max(amax, std::fabs(static_cast<double>(x[t * cols + c])));
                  wsum += std::fabs(static_cast<double>(deq[c]));
                }
                bound += 0.5 * amax / 127.0 * wsum * 1.01;
              }
            }
            ASSERT_NEAR(ref[t * rows + r], plain_ref[t * rows + r], bound) << dtype_name(type) << " r " << r << " t " << t;
          }
        }
        std::vector<Isa> paths;
        for (Isa isa : fast_paths()) paths.push_back(isa);
        for (Isa isa : paths) {
          set_isa(isa);
          std::fill(got.begin(), got.end(), std::nanf(""));  // nothing left over from the last path
          matmul(inter, x.data(), tokens, got.data(), pool);
          for (std::size_t i = 0; i < ref.size(); ++i) {
            ASSERT_NEAR(got[i], ref[i], 1e-5f * (std::fabs(ref[i]) + std::sqrt(static_cast<float>(cols))))
                << dtype_name(type) << " " << dtype_name(type) << " " << isa_name(isa) << " rows " << rows << " cols " << cols << " tokens " << tokens << " i " << i;
          }
        }
      }
    }
  }
  EXPECT_FALSE(can_repack_x16({DType::Q4_0, nullptr, 17, 32}));
  EXPECT_FALSE(can_repack_x16({DType::F16, nullptr, 18, 32}));   // rows not a multiple of 4
  EXPECT_FALSE(can_repack_x16({DType::F16, nullptr, 16, 200}));  // columns not a multiple of 16
  EXPECT_FALSE(can_repack_x16({DType::F32, nullptr, 16, 32}));
  EXPECT_TRUE(can_repack_x16({DType::F16, nullptr, 4, 16}));
}

// A random (normal) matrix stored as `type`.
struct RandomMatrix {
  std::vector<std::uint8_t> stored;
  WeightMatrix plain;
  RandomMatrix(DType type, std::size_t rows, std::size_t cols, std::mt19937& rng) : stored(rows * row_bytes(type, cols)) {
    std::normal_distribution<float> dist;
    std::vector<float> row(cols);
    for (std::size_t r = 0; r < rows; ++r) {
      for (float& v : row) v = dist(rng);
      quantize_row(type, row.data(), &stored[r * row_bytes(type, cols)], cols);
    }
    plain = {type, stored.data(), rows, cols};
  }
};
// ... and its 16-row interleaved repacking.
struct RandomInterleaved : RandomMatrix {
  std::vector<std::uint8_t> packed;
  WeightMatrix inter;
  RandomInterleaved(DType type, std::size_t rows, std::size_t cols, std::mt19937& rng) : RandomMatrix(type, rows, cols, rng) {
    packed.resize(repacked_bytes(plain));
    inter = {type, packed.data(), rows, cols, repack_x16(plain, packed.data())};
  }
};

// Batch equivalence at the kernel: on every path, each of m's outputs for a token multiplied alone
// equals the same output in batches of the given sizes (random activations), bit for bit.
void expect_batch_independent(const WeightMatrix& m, std::initializer_list<std::size_t> batches, std::mt19937& rng) {
  const std::size_t tokens = std::max(batches), rows = m.rows, cols = m.cols;
  std::normal_distribution<float> dist;
  std::vector<float> x(tokens * cols);
  for (float& v : x) v = dist(rng);
  ThreadPool pool(2);
  for (Isa isa : fast_paths()) {
    set_isa(isa);
    std::vector<float> alone(tokens * rows);
    for (std::size_t t = 0; t < tokens; ++t) matmul(m, &x[t * cols], 1, &alone[t * rows], pool);
    for (std::size_t batch : batches) {
      std::vector<float> together(batch * rows);
      matmul(m, x.data(), batch, together.data(), pool);
      for (std::size_t i = 0; i < together.size(); ++i) {
        ASSERT_EQ(together[i], alone[i]) << dtype_name(m.type) << " " << isa_name(isa) << " rows " << rows << " batch " << batch
                                         << " token " << i / rows << " row " << i % rows;
      }
    }
  }
}

// Interleaved matrices: on AVX-512 a lone token goes through the 16-row tiles and a batch through the
// two-group tiles (tile_groups, G = 2) wherever rows pair up, in tiles of 2-8 tokens; 48 rows leave a lone
// group after the pair, 96 rows are shared out in pairs.
TEST(Dispatch, InterleavedResultsDoNotDependOnTheBatch) {
  IsaGuard guard;
  std::mt19937 rng(12);
  for (DType type : {DType::Q4_0, DType::Q8_0}) {
    for (std::size_t rows : {16u, 48u, 96u}) {
      const RandomInterleaved m(type, rows, 288, rng);  // 9 blocks per row
      expect_batch_independent(m.inter, {2, 3, 5, 8, 11, 16, 37}, rng);
    }
  }
}

// Weights read in place in F16, BF16 or F32: tiles of 4 rows x 4 tokens, and on AVX-512 a tail of
// k % 16 (200 and 2056 columns).
TEST(Dispatch, FloatWeightResultsDoNotDependOnTheBatch) {
  IsaGuard guard;
  std::mt19937 rng(13);
  for (DType type : {DType::F16, DType::BF16, DType::F32}) {
    for (std::size_t cols : {200u, 2056u}) {
      const RandomMatrix m(type, 19, cols, rng);
      expect_batch_independent(m.plain, {2, 5, 9}, rng);
    }
  }
}

// F16 and BF16 interleaved by 4 rows (what the model repacks them into on AVX-512) give the plain
// layout's sums: on AVX-512 bit for bit (the same tile arithmetic), on the other paths through the
// scalar reference of the layout, to rounding. Awkward sizes: one group, odd group counts, one
// 16-column step, rows of 2048 (the prefetch runs past a group's end), token counts that take one
// pass of up to 6 tokens and several (7: 4 + 3; 23: 6 + 6 + 6 + 5); the rows split over two threads.
class HalfInterleaved : public ::testing::TestWithParam<DType> {};
INSTANTIATE_TEST_SUITE_P(Dispatch, HalfInterleaved, ::testing::Values(DType::F16, DType::BF16),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });
TEST_P(HalfInterleaved, GivesThePlainLayoutsSums) {
  const DType type = GetParam();
  IsaGuard guard;
  std::mt19937 rng(31);
  std::normal_distribution<float> dist;
  ThreadPool pool(2);
  for (std::size_t rows : {4u, 12u, 20u, 64u}) {
    for (std::size_t cols : {16u, 48u, 512u, 2048u}) {
      const RandomInterleaved m(type, rows, cols, rng);
      ASSERT_EQ(m.inter.layout, type == DType::F16 ? Layout::F16x4 : Layout::BF16x4);
      for (std::size_t tokens : {1u, 2u, 3u, 4u, 5u, 7u, 9u, 23u}) {
        std::vector<float> x(tokens * cols);
        for (float& v : x) v = dist(rng);
        std::vector<float> plain(tokens * rows), inter(tokens * rows);
        set_isa(Isa::Scalar);
        matmul(m.plain, x.data(), tokens, plain.data(), pool);
        matmul(m.inter, x.data(), tokens, inter.data(), pool);
        for (std::size_t i = 0; i < plain.size(); ++i) ASSERT_EQ(inter[i], plain[i]) << dtype_name(type) << " scalar rows " << rows << " cols " << cols << " i " << i;
        for (Isa isa : fast_paths()) {
          set_isa(isa);
          std::fill(inter.begin(), inter.end(), std::nanf(""));
          matmul(m.plain, x.data(), tokens, plain.data(), pool);
          matmul(m.inter, x.data(), tokens, inter.data(), pool);
          for (std::size_t i = 0; i < plain.size(); ++i) {
            if (isa == Isa::Avx2) {
              ASSERT_NEAR(inter[i], plain[i], 1e-5f * (std::fabs(plain[i]) + std::sqrt(static_cast<float>(cols))));
            } else {
              ASSERT_EQ(inter[i], plain[i]) << dtype_name(type) << " " << isa_name(isa) << " rows " << rows << " cols " << cols << " tokens " << tokens << " i " << i;
            }
          }
        }
      }
      if (rows == 20 && cols == 512) expect_batch_independent(m.inter, {2, 3, 5, 8, 11}, rng);
    }
  }
}

// The AMX tiles (Q4_0, Q8_0, Q4_K) take prompt-sized batches (from kMinTiledTokens on, 16 tokens at a
// time, the rest through the VNNI kernel group by group) and must give bit-identical results to the
// AVX-512 path: the integer dot products are exact and the float work per block is the same
// operations in the same order. Awkward sizes: odd block counts (a lone last block), token counts
// below the tile threshold, at it and with a VNNI tail, more tokens than one panel.
TEST(Dispatch, AmxTilesBitIdenticalToAvx512) {
  if (best_isa() != Isa::Amx) GTEST_SKIP() << "this CPU (or OS) offers no AMX int8 tiles";
  IsaGuard guard;
  std::mt19937 rng(21);
  std::normal_distribution<float> dist;
  for (DType type : {DType::Q4_0, DType::Q8_0, DType::Q4_K}) {
    for (std::size_t cols : {32u, 96u, 160u, 256u, 768u, 2048u}) {
      for (std::size_t tokens : {15u, 16u, 127u, 128u, 141u, 700u}) {
        if (cols * tokens > 1500000) continue;  // 2048 x 700 stays: more tokens than one panel (336 at 64 blocks)
        if (type == DType::Q4_K && cols % 256 != 0) continue;
        const std::size_t rows = 48;
        const RandomInterleaved m(type, rows, cols, rng);
        const WeightMatrix& inter = m.inter;
        std::vector<float> x(tokens * cols);
        for (float& v : x) v = dist(rng);
        ThreadPool pool(2);
        std::vector<float> want(tokens * rows), got(tokens * rows);
        set_isa(Isa::Avx512);
        matmul(inter, x.data(), tokens, want.data(), pool);
        set_isa(Isa::Amx);
        matmul(inter, x.data(), tokens, got.data(), pool);
        for (std::size_t i = 0; i < want.size(); ++i) {
          ASSERT_EQ(got[i], want[i]) << dtype_name(type) << " cols " << cols << " tokens " << tokens << " token " << i / rows << " row " << i % rows;
        }
      }
    }
  }
}

}  // namespace
}  // namespace promptly::kernels

namespace promptly::kernels {
namespace {

// The fused online-softmax attention against a plain two-pass softmax in double precision.
TEST(Dispatch, AttentionMatchesTwoPassSoftmax) {
  std::mt19937 rng(4);
  std::normal_distribution<float> dist(0.0f, 2.0f);
  std::vector<Isa> paths = {Isa::Scalar};
  for (Isa isa : fast_paths()) paths.push_back(isa);
  for (std::size_t head_dim : {8u, 12u, 64u, 128u}) {
    for (std::size_t n_ctx : {1u, 2u, 7u, 100u}) {
      const std::size_t stride = head_dim * 3;  // other heads interleaved, as in the cache
      std::vector<float> q(head_dim), k(n_ctx * stride), v(n_ctx * stride);
      for (float& x : q) x = dist(rng);
      for (float& x : k) x = dist(rng);
      for (float& x : v) x = dist(rng);
      const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
      std::vector<double> s(n_ctx), want(head_dim, 0.0);
      double mx = -1e300, sum = 0;
      for (std::size_t j = 0; j < n_ctx; ++j) {
        for (std::size_t i = 0; i < head_dim; ++i) s[j] += static_cast<double>(q[i]) * k[j * stride + i];
        s[j] *= scale;
        mx = std::max(mx, s[j]);
      }
      for (double& x : s) sum += x = std::exp(x - mx);
      for (std::size_t j = 0; j < n_ctx; ++j)
        for (std::size_t i = 0; i < head_dim; ++i) want[i] += s[j] / sum * v[j * stride + i];
      // Paged as the cache pages it: blocks of 7 positions (an awkward size), the head at offset
      // head_dim; in F32 (compared with the reference directly) and F16 (compared with the reference
      // of the F16-rounded values, which is what the cache holds).
      constexpr std::size_t kBlock = 7;
      const std::size_t n_alloc = (n_ctx / kBlock + 1) * kBlock * stride + head_dim;
      std::vector<float> kp(n_alloc), vp(n_alloc);
      std::vector<std::uint16_t> kh(n_alloc), vh(n_alloc);
      std::vector<const void*> kb, vb, khb, vhb;
      for (std::size_t j = 0; j < n_ctx; ++j) {
        if (j % kBlock == 0) {
          kb.push_back(kp.data() + j * stride);
          vb.push_back(vp.data() + j * stride);
          khb.push_back(kh.data() + j * stride);
          vhb.push_back(vh.data() + j * stride);
        }
        for (std::size_t i = 0; i < head_dim; ++i) {
          kp[j * stride + head_dim + i] = k[j * stride + i];
          vp[j * stride + head_dim + i] = v[j * stride + i];
          kh[j * stride + head_dim + i] = fp32_to_fp16(k[j * stride + i]);
          vh[j * stride + head_dim + i] = fp32_to_fp16(v[j * stride + i]);
        }
      }
      std::vector<double> sh(n_ctx), want_h(head_dim, 0.0);
      double mxh = -1e300, sumh = 0;
      for (std::size_t j = 0; j < n_ctx; ++j) {
        for (std::size_t i = 0; i < head_dim; ++i) sh[j] += static_cast<double>(q[i]) * fp16_to_fp32(kh[j * stride + head_dim + i]);
        sh[j] *= scale;
        mxh = std::max(mxh, sh[j]);
      }
      for (double& x : sh) sumh += x = std::exp(x - mxh);
      for (std::size_t j = 0; j < n_ctx; ++j)
        for (std::size_t i = 0; i < head_dim; ++i) want_h[i] += sh[j] / sumh * fp16_to_fp32(vh[j * stride + head_dim + i]);
      for (Isa isa : paths) {
        std::vector<float> got(head_dim), got_h(head_dim);
        float lse = 0.0f;
        kernel_table(isa).attention(q.data(), kb.data(), vb.data(), DType::F32, kBlock, stride, head_dim, n_ctx, head_dim, scale, got.data(),
                                    &lse);
        kernel_table(isa).attention(q.data(), khb.data(), vhb.data(), DType::F16, kBlock, stride, head_dim, n_ctx, head_dim, scale, got_h.data(),
                                    nullptr);
        ASSERT_NEAR(lse, mx + std::log(sum), 1e-4 * (1.0 + std::fabs(mx))) << isa_name(isa) << " head_dim " << head_dim << " n_ctx " << n_ctx;
        for (std::size_t i = 0; i < head_dim; ++i) {
          ASSERT_NEAR(got[i], want[i], 1e-4) << isa_name(isa) << " head_dim " << head_dim << " n_ctx " << n_ctx;
          ASSERT_NEAR(got_h[i], want_h[i], 1e-4) << isa_name(isa) << " f16 head_dim " << head_dim << " n_ctx " << n_ctx;
        }
      }
    }
  }
}

// Q8_0-cached keys and values (rows of whole 32-element blocks) against the double-precision
// two-pass softmax over the dequantized values, on every path.
TEST(Dispatch, AttentionOverQ8_0Cache) {
  std::mt19937 rng(5);
  std::normal_distribution<float> dist(0.0f, 2.0f);
  std::vector<Isa> paths = {Isa::Scalar};
  for (Isa isa : fast_paths()) paths.push_back(isa);
  for (std::size_t head_dim : {8u, 24u, 64u, 128u}) {
    for (std::size_t n_ctx : {1u, 9u, 50u}) {
      const std::size_t stride = ((3 * head_dim + 31) / 32) * 32, offset = head_dim, row_bytes = stride / 32 * sizeof(BlockQ8_0);
      constexpr std::size_t kBlock = 5;
      std::vector<float> q(head_dim), row(stride);
      for (float& x : q) x = dist(rng);
      std::vector<std::uint8_t> kq(n_ctx * row_bytes + row_bytes * kBlock), vq(kq.size());
      std::vector<float> kd(n_ctx * stride), vd(n_ctx * stride);  // what the cache holds, dequantized
      std::vector<const void*> kb, vb;
      for (std::size_t j = 0; j < n_ctx; ++j) {
        if (j % kBlock == 0) {
          kb.push_back(kq.data() + j * row_bytes);
          vb.push_back(vq.data() + j * row_bytes);
        }
        for (auto [dst, deq] : {std::pair{&kq, &kd}, {&vq, &vd}}) {
          for (float& x : row) x = dist(rng);
          quantize_row(DType::Q8_0, row.data(), dst->data() + j * row_bytes, stride);
          dequantize_row(DType::Q8_0, dst->data() + j * row_bytes, deq->data() + j * stride, stride);
        }
      }
      const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
      std::vector<double> s(n_ctx), want(head_dim, 0.0);
      double mx = -1e300, sum = 0;
      for (std::size_t j = 0; j < n_ctx; ++j) {
        for (std::size_t i = 0; i < head_dim; ++i) s[j] += static_cast<double>(q[i]) * kd[j * stride + offset + i];
        s[j] *= scale;
        mx = std::max(mx, s[j]);
      }
      for (double& x : s) sum += x = std::exp(x - mx);
      for (std::size_t j = 0; j < n_ctx; ++j)
        for (std::size_t i = 0; i < head_dim; ++i) want[i] += s[j] / sum * vd[j * stride + offset + i];
      for (Isa isa : paths) {
        std::vector<float> got(head_dim);
        kernel_table(isa).attention(q.data(), kb.data(), vb.data(), DType::Q8_0, kBlock, stride, offset, n_ctx, head_dim, scale, got.data(),
                                    nullptr);
        for (std::size_t i = 0; i < head_dim; ++i) {
          ASSERT_NEAR(got[i], want[i], 1e-4) << isa_name(isa) << " head_dim " << head_dim << " n_ctx " << n_ctx;
        }
      }
    }
  }
}

// Keys and values of `positions` random rows of `stride` elements stored as `kv`, in blocks of
// `block_tokens` rows, and the block pointers the attention kernels read.
struct PagedKv {
  std::vector<std::uint8_t> keys, values;
  std::vector<const void*> key_blocks, value_blocks;
  PagedKv(DType kv, std::size_t stride, std::size_t block_tokens, std::size_t positions, std::normal_distribution<float>& dist,
          std::mt19937& rng) {
    const std::size_t row_bytes = kv == DType::F32 ? stride * 4 : kv == DType::F16 ? stride * 2 : stride / 32 * sizeof(BlockQ8_0);
    keys.resize((positions + block_tokens) * row_bytes);
    values.resize(keys.size());
    std::vector<float> row(stride);
    for (std::size_t j = 0; j < positions; ++j) {
      for (auto* dst : {&keys, &values}) {
        for (float& x : row) x = dist(rng);
        quantize_row(kv, row.data(), dst->data() + j * row_bytes, stride);
      }
    }
    for (std::size_t j = 0; j < positions; j += block_tokens) {
      key_blocks.push_back(keys.data() + j * row_bytes);
      value_blocks.push_back(values.data() + j * row_bytes);
    }
  }
};

// The tiled attention (queries of one KV head in vector lanes) against the scalar single-query
// kernel: tiles of 1..16 queries with different causal lengths (including lengths that end inside
// a 16-key chunk and a query that sees a single position), every KV type, head sizes with and
// without a tiled path, on every kernel path.
TEST(Dispatch, AttentionTileMatchesSingleQueries) {
  std::mt19937 rng(6);
  std::normal_distribution<float> dist(0.0f, 1.5f);
  std::vector<Isa> paths = {Isa::Scalar};
  for (Isa isa : fast_paths()) paths.push_back(isa);
  for (DType kv : {DType::F32, DType::F16, DType::Q8_0}) {
    for (std::size_t head_dim : {16u, 24u, 64u, 128u}) {
      if (kv == DType::Q8_0 && head_dim % 32 != 0) continue;
      const std::size_t stride = ((2 * head_dim + 31) / 32) * 32, offset = kv == DType::Q8_0 ? 0 : head_dim;
      constexpr std::size_t kBlock = 6, kPositions = 75;
      const PagedKv paged(kv, stride, kBlock, kPositions, dist, rng);
      const auto& kb = paged.key_blocks;
      const auto& vb = paged.value_blocks;
      for (std::size_t n_q : {1u, 2u, 3u, 5u, 8u, 16u, 17u, 29u, 32u, 33u, 50u, 64u}) {
        std::vector<std::vector<float>> qs(n_q, std::vector<float>(head_dim));
        std::vector<std::size_t> n_ctx(n_q);
        for (std::size_t i = 0; i < n_q; ++i) {
          for (float& x : qs[i]) x = dist(rng);
          n_ctx[i] = i == 0 ? 1 : kPositions - (i * 7) % 40;
        }
        std::vector<const float*> qp;
        for (auto& qv : qs) qp.push_back(qv.data());
        const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
        for (Isa isa : paths) {
          std::vector<std::vector<float>> got(n_q, std::vector<float>(head_dim)), want = got;
          std::vector<float*> op;
          for (auto& o : got) op.push_back(o.data());
          std::vector<float> lse(n_q);
          kernel_table(isa).attention_tile(qp.data(), nullptr, n_ctx.data(), n_q, kb.data(), vb.data(), kv, kBlock, stride, offset, head_dim,
                                           scale, 0.0f, op.data(), lse.data());
          for (std::size_t i = 0; i < n_q; ++i) {
            // Alone in a tile, a query gets bit-for-bit what it gets among others: tiles never change a
            // result (batch equivalence rests on it).
            std::vector<float> alone(head_dim);
            float* alone_out = alone.data();
            kernel_table(isa).attention_tile(&qp[i], nullptr, &n_ctx[i], 1, kb.data(), vb.data(), kv, kBlock, stride, offset, head_dim,
                                             scale, 0.0f, &alone_out, nullptr);
            ASSERT_EQ(alone, got[i]) << isa_name(isa) << " " << dtype_name(kv) << " head_dim " << head_dim << " n_q " << n_q << " query " << i;
            float want_lse = 0.0f;
            kernel_table(Isa::Scalar).attention(qp[i], kb.data(), vb.data(), kv, kBlock, stride, offset, n_ctx[i], head_dim, scale,
                                                want[i].data(), &want_lse);
            // The log-sum-exp that lets a token tree's queries merge this softmax with their ancestors'.
            ASSERT_NEAR(lse[i], want_lse, 1e-4f * (1.0f + std::fabs(want_lse)))
                << isa_name(isa) << " " << dtype_name(kv) << " head_dim " << head_dim << " n_q " << n_q << " query " << i;
            for (std::size_t d = 0; d < head_dim; ++d) {
              ASSERT_NEAR(got[i][d], want[i][d], 2e-5f + 2e-5f * std::fabs(want[i][d]))
                  << isa_name(isa) << " " << dtype_name(kv) << " head_dim " << head_dim << " n_q " << n_q << " query " << i;
            }
          }
        }
      }
    }
  }
}

// Sliding windows and soft caps in the tiled attention, against attention_range (plain loops): each
// query its own window start (0, inside a 16-key chunk, on a block edge, its last position only),
// with and without a cap, every KV type, tiles of 1 to 40 queries; and a query alone in a tile gets
// bit-for-bit what it gets among others.
TEST(Dispatch, AttentionTileWindowsAndSoftCapMatchRange) {
  std::mt19937 rng(11);
  std::normal_distribution<float> dist(0.0f, 2.0f);
  std::vector<Isa> paths = {Isa::Scalar};
  for (Isa isa : fast_paths()) paths.push_back(isa);
  IsaGuard restore;
  for (DType kv : {DType::F32, DType::F16, DType::Q8_0}) {
    for (std::size_t head_dim : {32u, 64u, 256u}) {
      const std::size_t stride = head_dim, offset = 0;
      constexpr std::size_t kBlock = 16, kPositions = 90;
      const PagedKv paged(kv, stride, kBlock, kPositions, dist, rng);
      const auto& kb = paged.key_blocks;
      const auto& vb = paged.value_blocks;
      for (std::size_t n_q : {1u, 2u, 3u, 8u, 16u, 40u}) {
        std::vector<std::vector<float>> qs(n_q, std::vector<float>(head_dim));
        std::vector<std::size_t> n_ctx(n_q), first(n_q);
        for (std::size_t i = 0; i < n_q; ++i) {
          for (float& x : qs[i]) x = dist(rng);
          n_ctx[i] = kPositions - (i * 5) % 37;
          const std::size_t starts[] = {0, 21, 32, n_ctx[i] - 1, n_ctx[i] - 7};
          first[i] = starts[(i + n_q) % 5];
        }
        std::vector<const float*> qp;
        for (auto& qv : qs) qp.push_back(qv.data());
        const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
        for (float softcap : {0.0f, 5.0f}) {
          for (Isa isa : paths) {
            set_isa(isa);  // attention_range's dots run on the path under test
            std::vector<std::vector<float>> got(n_q, std::vector<float>(head_dim)), want = got;
            std::vector<float*> op;
            for (auto& o : got) op.push_back(o.data());
            std::vector<float> lse(n_q);
            kernel_table(isa).attention_tile(qp.data(), first.data(), n_ctx.data(), n_q, kb.data(), vb.data(), kv, kBlock, stride, offset,
                                             head_dim, scale, softcap, op.data(), lse.data());
            for (std::size_t i = 0; i < n_q; ++i) {
              const std::string where = std::string(isa_name(isa)) + " " + std::string(dtype_name(kv)) + " head_dim " + std::to_string(head_dim) +
                                        " n_q " + std::to_string(n_q) + " query " + std::to_string(i) + " cap " + std::to_string(softcap);
              std::vector<float> alone(head_dim);
              float* alone_out = alone.data();
              float alone_lse = 0.0f, want_lse = 0.0f;
              kernel_table(isa).attention_tile(&qp[i], &first[i], &n_ctx[i], 1, kb.data(), vb.data(), kv, kBlock, stride, offset, head_dim,
                                               scale, softcap, &alone_out, &alone_lse);
              ASSERT_EQ(alone, got[i]) << where;
              // The log-sum-exp (of the capped scores in the window) is as bit-identical across tiles.
              ASSERT_EQ(std::bit_cast<std::uint32_t>(alone_lse), std::bit_cast<std::uint32_t>(lse[i])) << where;
              attention_range(qp[i], kb.data(), vb.data(), kv, kBlock, stride, offset, first[i], n_ctx[i], head_dim, scale, softcap,
                              want[i].data(), &want_lse);
              ASSERT_NEAR(lse[i], want_lse, 1e-4f * (1.0f + std::fabs(want_lse))) << where;
              for (std::size_t d = 0; d < head_dim; ++d) {
                ASSERT_NEAR(got[i][d], want[i][d], 5e-5f + 5e-5f * std::fabs(want[i][d])) << where << " dim " << d;
              }
            }
            // Blocks wholly before every query's window are never read: they may be released (null).
            const std::size_t min_first = *std::min_element(first.begin(), first.end());
            std::vector<const void*> kb_released = kb, vb_released = vb;
            for (std::size_t b = 0; (b + 1) * kBlock <= min_first; ++b) kb_released[b] = vb_released[b] = nullptr;
            std::vector<std::vector<float>> again(n_q, std::vector<float>(head_dim));
            std::vector<float*> again_out;
            for (auto& o : again) again_out.push_back(o.data());
            kernel_table(isa).attention_tile(qp.data(), first.data(), n_ctx.data(), n_q, kb_released.data(), vb_released.data(), kv, kBlock,
                                             stride, offset, head_dim, scale, softcap, again_out.data(), nullptr);
            EXPECT_EQ(again, got) << isa_name(isa) << " n_q " << n_q;
            // The window matters: the same queries seeing their whole context get other results.
            std::vector<float> whole(head_dim);
            float* whole_out = whole.data();
            kernel_table(isa).attention_tile(&qp[1 % n_q], nullptr, &n_ctx[1 % n_q], 1, kb.data(), vb.data(), kv, kBlock, stride, offset,
                                             head_dim, scale, softcap, &whole_out, nullptr);
            if (first[1 % n_q] > 0) {
              EXPECT_NE(whole, got[1 % n_q]);
            }
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace promptly::kernels
