#include "model/model.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>

#include "../test_util.h"
#include "convert/synthetic_model.h"
#include "engine/generate.h"
#include "gguf/writer.h"
#include "reference_forward.h"
#include "tensor/quant.h"
#include "tokenizer/tokenizer.h"
#include "util/error.h"

namespace promptly {
namespace {

std::string make_synthetic(const test::TempDir& dir, const std::string& preset, DType type = DType::F32) {
  ThreadPool pool(2);
  const std::string path = dir.file(preset + "-" + std::string(dtype_name(type)) + ".gguf");
  write_synthetic_model(synthetic_preset(preset), type, 7, path, pool);
  return path;
}

std::vector<float> logits_of(const Model& m, KvCache& cache, ThreadPool& pool, const std::vector<std::int32_t>& tokens,
                             int seq, std::size_t start_pos) {
  Batch b;
  for (std::size_t i = 0; i < tokens.size(); ++i) b.add(tokens[i], static_cast<std::int32_t>(start_pos + i), seq, true);
  std::vector<float> out;
  m.forward(b, cache, pool, out);
  return out;
}

// Prompted greedy runs against the independent double-precision reference.
TEST(Model, StoriesPromptedGreedyMatchesReference) {
  auto f = gguf::File::open(test::shared_model("stories260K.gguf"));
  Model model(f);
  Tokenizer tok(Vocab::from_gguf(*f));
  test::ReferenceModel ref(*f);
  ThreadPool pool(2);
  for (const std::string prompt : {"Lily and Ben went to the park", "The cat sat", "One day, a big dog"}) {
    const auto ids = tok.encode(prompt);
    GenerateOptions o;
    o.max_tokens = 24;
    o.sampling.temperature = 0;
    const GenerateResult r = generate(model, tok, ids, o, pool);
    const auto expected = ref.greedy({ids.begin(), ids.end()}, 24);
    EXPECT_EQ(std::vector<int>(r.ids.begin(), r.ids.end()), expected) << prompt;
  }
}

class SyntheticArch : public ::testing::TestWithParam<std::string> {};

TEST_P(SyntheticArch, LogitsMatchReference) {
  test::TempDir dir;
  auto f = gguf::File::open(make_synthetic(dir, GetParam()));
  Model model(f);
  test::ReferenceModel ref(*f);
  ThreadPool pool(2);
  const std::vector<std::int32_t> tokens = {1, 300, 301, 500, 17, 999, 42, 5};
  KvCache cache = model.make_cache(64, KvType::F32, 4);
  const auto got = logits_of(model, cache, pool, tokens, 0, 0);
  const auto want = ref.run({tokens.begin(), tokens.end()});
  const std::size_t V = model.config().n_vocab;
  double max_diff = 0, max_abs = 0;
  for (std::size_t t = 0; t < tokens.size(); ++t) {
    for (std::size_t v = 0; v < V; ++v) {
      max_diff = std::max(max_diff, std::fabs(got[t * V + v] - want[t][v]));
      max_abs = std::max(max_abs, std::fabs(want[t][v]));
      ASSERT_TRUE(std::isfinite(got[t * V + v]));
    }
  }
  EXPECT_LT(max_diff, 1e-4 * std::max(1.0, max_abs)) << "max |logit| " << max_abs;
  EXPECT_GT(max_abs, 1.0) << "logits are degenerate";
}

INSTANTIATE_TEST_SUITE_P(Presets, SyntheticArch, ::testing::Values("tiny", "tiny-qwen2"));

// A sequence's logits do not depend on how its tokens are split into calls or what else is batched.
TEST(Model, BatchingAndChunkingDoNotChangeLogits) {
  test::TempDir dir;
  auto f = gguf::File::open(make_synthetic(dir, "tiny", DType::Q8_0));
  Model model(f);
  ThreadPool pool(2);
  const std::vector<std::int32_t> a = {1, 400, 401, 402, 403, 404, 405, 406, 407};
  const std::vector<std::int32_t> b = {1, 600, 601, 602, 603};

  KvCache alone = model.make_cache(64, KvType::F32, 4);
  const auto ref_a = logits_of(model, alone, pool, a, 0, 0);
  const std::size_t V = model.config().n_vocab;

  // a token by token, interleaved with b in the same batches
  KvCache mixed = model.make_cache(64, KvType::F32, 4);
  std::vector<float> got_a;
  for (std::size_t i = 0; i < a.size(); ++i) {
    Batch batch;
    batch.add(a[i], static_cast<std::int32_t>(i), 0, true);
    if (i < b.size()) batch.add(b[i], static_cast<std::int32_t>(i), 1, false);
    std::vector<float> out;
    model.forward(batch, mixed, pool, out);
    ASSERT_EQ(out.size(), V);
    got_a.insert(got_a.end(), out.begin(), out.end());
  }
  ASSERT_EQ(got_a.size(), ref_a.size());
  for (std::size_t i = 0; i < ref_a.size(); ++i) ASSERT_NEAR(got_a[i], ref_a[i], 1e-4) << i;

  // chunks of 4 + 5
  KvCache chunked = model.make_cache(64, KvType::F32, 4);
  auto c1 = logits_of(model, chunked, pool, {a.begin(), a.begin() + 4}, 3, 0);
  auto c2 = logits_of(model, chunked, pool, {a.begin() + 4, a.end()}, 3, 4);
  c1.insert(c1.end(), c2.begin(), c2.end());
  for (std::size_t i = 0; i < ref_a.size(); ++i) ASSERT_NEAR(c1[i], ref_a[i], 1e-4) << i;
  EXPECT_EQ(chunked.length(3), a.size());
}

// Rewrites a GGUF, letting `edit` change metadata or drop / replace tensors.
struct Edit {
  std::function<void(gguf::Writer&)> metadata;
  std::function<bool(const gguf::TensorInfo&, gguf::Writer&)> tensor;  // true: handled (skipped or replaced)
};

std::string rewrite(const std::string& in, const std::string& out, const Edit& edit) {
  auto f = gguf::File::open(in);
  gguf::Writer w;
  for (const auto& [k, v] : f->metadata()) w.set(k, v);
  if (edit.metadata) edit.metadata(w);
  for (const auto& t : f->tensors()) {
    if (edit.tensor && edit.tensor(t, w)) continue;
    const gguf::TensorInfo* src = &t;
    w.add_tensor(t.name, t.dims, t.type, [src](std::uint8_t* o) { std::memcpy(o, src->data, src->n_bytes); });
  }
  w.write(out);
  return out;
}

void expect_load_error(const std::string& path, const std::string& needle) {
  try {
    Model m(gguf::File::open(path));
    FAIL() << "loaded; expected an error mentioning " << needle;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(Model, ClearErrorsForModelsItCannotRun) {
  test::TempDir dir;
  const std::string base = make_synthetic(dir, "tiny");
  expect_load_error(rewrite(base, dir.file("arch.gguf"), {[](gguf::Writer& w) { w.set_string("general.architecture", "gpt9"); }, {}}),
                    "unsupported architecture 'gpt9'; supported: gemma2, gemma3, llama, phi3, qwen2, qwen3, qwen3moe");
  expect_load_error(rewrite(base, dir.file("missing.gguf"),
                            {{}, [](const gguf::TensorInfo& t, gguf::Writer&) { return t.name == "blk.1.ffn_up.weight"; }}),
                    "lacks tensor 'blk.1.ffn_up.weight'");
  expect_load_error(rewrite(base, dir.file("type.gguf"),
                            {{}, [](const gguf::TensorInfo& t, gguf::Writer& w) {
                               if (t.name != "blk.0.attn_q.weight") return false;
                               w.add_tensor(t.name, t.dims, DType::Q4_1, [](std::uint8_t*) {});
                               return true;
                             }}),
                    "unsupported tensor type Q4_1 in tensor 'blk.0.attn_q.weight'; supported: F32, F16, BF16, Q8_0, Q4_0, Q5_0, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS");
  expect_load_error(rewrite(base, dir.file("shape.gguf"),
                            {{}, [](const gguf::TensorInfo& t, gguf::Writer& w) {
                               if (t.name != "blk.0.attn_k.weight") return false;
                               w.add_tensor(t.name, {t.dims[0], t.dims[1] + 1}, t.type, [](std::uint8_t*) {});
                               return true;
                             }}),
                    "has shape [256, 129], expected [256, 128]");
  expect_load_error(rewrite(base, dir.file("meta.gguf"), {[](gguf::Writer& w) { w.set_string("llama.block_count", "two"); }, {}}),
                    "'llama.block_count' has type string, expected an integer");
  // A corrupt block count must be refused before it sizes anything (the fuzzer found 2^30 blocks
  // asking for 50 GB).
  expect_load_error(rewrite(base, dir.file("blocks.gguf"), {[](gguf::Writer& w) { w.set_u32("llama.block_count", 1u << 30); }, {}}),
                    "block_count is 1073741824 but the file holds only");
}

// Llama 3.1-style frequency factors (rope_freqs.weight) and linear position scaling, against the
// reference's independent rope.
TEST(Model, RopeScalingMatchesReference) {
  test::TempDir dir;
  const std::string base = make_synthetic(dir, "tiny");
  const std::string path = rewrite(base, dir.file("rope.gguf"), {[](gguf::Writer& w) {
                                                                  w.set_string("llama.rope.scaling.type", "linear");
                                                                  w.set_f32("llama.rope.scaling.factor", 4.0f);
                                                                },
                                                                {}});
  // Add the factors tensor (head_dim 64 -> 32 factors between 1 and 8).
  const std::string with_freqs = rewrite(path, dir.file("rope2.gguf"), {{}, [](const gguf::TensorInfo& t, gguf::Writer& w) {
                                                                          if (t.name != "output_norm.weight") return false;
                                                                          const gguf::TensorInfo* src = &t;
                                                                          w.add_tensor(t.name, t.dims, t.type, [src](std::uint8_t* o) {
                                                                            std::memcpy(o, src->data, src->n_bytes);
                                                                          });
                                                                          w.add_tensor("rope_freqs.weight", {32}, DType::F32, [](std::uint8_t* o) {
                                                                            for (int i = 0; i < 32; ++i) {
                                                                              const float f = 1.0f + 7.0f * static_cast<float>(i) / 31.0f;
                                                                              std::memcpy(o + 4 * i, &f, 4);
                                                                            }
                                                                          });
                                                                          return true;
                                                                        }});
  for (const std::string& p : {path, with_freqs}) {
    auto f = gguf::File::open(p);
    Model model(f);
    test::ReferenceModel ref(*f);
    ThreadPool pool(2);
    const std::vector<std::int32_t> tokens = {1, 300, 301, 302, 303, 304, 305, 306, 307, 308, 309, 310};
    KvCache cache = model.make_cache(32, KvType::F32);
    const auto got = logits_of(model, cache, pool, tokens, 0, 0);
    const auto want = ref.run({tokens.begin(), tokens.end()});
    const std::size_t V = model.config().n_vocab;
    for (std::size_t t = 0; t < tokens.size(); ++t)
      for (std::size_t v = 0; v < V; ++v) ASSERT_NEAR(got[t * V + v], want[t][v], 2e-3) << p << " t " << t;
  }
  // and the scaling really changes the result
  auto plain = gguf::File::open(base);
  auto scaled = gguf::File::open(with_freqs);
  const auto a = test::ReferenceModel(*plain).run({1, 300, 301, 302}), b = test::ReferenceModel(*scaled).run({1, 300, 301, 302});
  EXPECT_GT(std::fabs(a[3][5] - b[3][5]) + std::fabs(a[3][9] - b[3][9]), 1e-4);
}

TEST(Model, TiedEmbeddingsWhenOutputIsAbsent) {
  test::TempDir dir;
  const std::string path = rewrite(make_synthetic(dir, "tiny"), dir.file("tied.gguf"),
                                   {{}, [](const gguf::TensorInfo& t, gguf::Writer&) { return t.name == "output.weight"; }});
  auto f = gguf::File::open(path);
  Model model(f);
  test::ReferenceModel ref(*f);  // uses token_embd for the output when output.weight is absent
  ThreadPool pool(1);
  KvCache cache = model.make_cache(8, KvType::F32);
  const auto got = logits_of(model, cache, pool, {1, 2, 3}, 0, 0);
  const auto want = ref.run({1, 2, 3});
  for (std::size_t v = 0; v < model.config().n_vocab; ++v) ASSERT_NEAR(got[2 * model.config().n_vocab + v], want[2][v], 1e-3);
}

// ModelLoadOptions::float_matrices_as: the same logits as a file whose matrices were stored in that
// type (the token embedding table stays as stored).
TEST(Model, FloatMatricesConvertAtLoadExactlyAsStoredInTheType) {
  test::TempDir dir;
  const std::string base = make_synthetic(dir, "tiny");
  ASSERT_NE(gguf::File::open(base)->find_tensor("output.weight"), nullptr);
  const std::string stored = rewrite(base, dir.file("q8.gguf"), {{}, [](const gguf::TensorInfo& t, gguf::Writer& w) {
                                       if (t.dims.size() != 2 || t.name == "token_embd.weight") return false;
                                       const gguf::TensorInfo* src = &t;
                                       w.add_tensor(t.name, t.dims, DType::Q8_0, [src](std::uint8_t* o) {
                                         const std::size_t cols = src->dims[0], stride = row_bytes(DType::Q8_0, cols);
                                         const float* rows = reinterpret_cast<const float*>(src->data);
                                         for (std::size_t r = 0; r < src->dims[1]; ++r) quantize_row(DType::Q8_0, rows + r * cols, o + r * stride, cols);
                                       });
                                       return true;
                                     }});
  ThreadPool pool(2);
  Model f32(gguf::File::open(base)), want(gguf::File::open(stored));
  ModelLoadOptions as_q8;
  as_q8.float_matrices_as = DType::Q8_0;
  Model converted(gguf::File::open(base), nullptr, as_q8);
  const std::vector<std::int32_t> tokens = {1, 7, 300, 42, 5};
  auto logits = [&](const Model& m) {
    KvCache cache = m.make_cache(8, KvType::F32);
    return logits_of(m, cache, pool, tokens, 0, 0);
  };
  const auto got = logits(converted);
  EXPECT_EQ(got, logits(want));
  EXPECT_NE(got, logits(f32));  // it did convert
  ModelLoadOptions as_f16;
  as_f16.float_matrices_as = DType::F16;
  EXPECT_THROW(Model(gguf::File::open(base), nullptr, as_f16), Error);
  // Types the kernels do not read as stored (they load as Q8_0 and Q6_K from files) are refused too.
  for (const DType other : {DType::Q5_0, DType::Q3_K, DType::IQ4_NL}) {
    ModelLoadOptions as_other;
    as_other.float_matrices_as = other;
    EXPECT_THROW(Model(gguf::File::open(base), nullptr, as_other), Error) << dtype_name(other);
  }
}

TEST(Model, ContextOverflowIsAnError) {
  test::TempDir dir;
  Model model(gguf::File::open(make_synthetic(dir, "tiny")));
  ThreadPool pool(1);
  KvCache cache = model.make_cache(4, KvType::F32);
  EXPECT_THROW(logits_of(model, cache, pool, {1, 2, 3, 4, 5}, 0, 0), Error);
  KvCache ok = model.make_cache(4, KvType::F32);
  EXPECT_THROW(logits_of(model, ok, pool, {1, 5000}, 0, 0), Error);  // token outside the vocabulary
}

}  // namespace
}  // namespace promptly
