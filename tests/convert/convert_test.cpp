#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "../test_util.h"
#include "convert/file_type.h"
#include "convert/quantize.h"
#include "convert/synthetic_model.h"
#include "kernels/cpu.h"
#include "engine/generate.h"
#include "gguf/gguf.h"
#include "model/model.h"
#include "tokenizer/tokenizer.h"
#include "util/error.h"

namespace promptly {
namespace {

TEST(SyntheticVocab, ExactSizeAndTokenizable) {
  const SyntheticVocab v = synthetic_vocab(1024);
  EXPECT_EQ(v.tokens.size(), 1024u);
  EXPECT_EQ(v.tokens[1], "<s>");
  EXPECT_EQ(v.tokens[3], "<0x00>");
  EXPECT_EQ(synthetic_vocab(32000).tokens.size(), 32000u);
}

// Each family's preset writes the tokenizer its real GGUF files carry.
TEST(SyntheticVocab, FamiliesWriteTheirTokenizers) {
  test::TempDir dir;
  ThreadPool pool(2);
  auto load = [&](const std::string& preset) {
    const std::string path = dir.file(preset + ".gguf");
    write_synthetic_model(synthetic_preset(preset), DType::F32, 1, path, pool);
    return Tokenizer(Vocab::from_gguf(*gguf::File::open(path)));
  };
  using Ids = std::vector<std::int32_t>;
  for (const std::string preset : {"tiny-qwen2", "tiny-qwen3", "tiny-qwen3moe"}) {  // byte-level BPE, pre-tokenized as qwen2
    const Tokenizer tok = load(preset);
    const Vocab& v = tok.vocab();
    EXPECT_EQ(v.kind, VocabKind::Bpe) << preset;
    EXPECT_EQ(v.pre, "qwen2") << preset;
    EXPECT_TRUE(v.warnings.empty()) << preset;
    EXPECT_FALSE(v.add_bos) << preset;
    EXPECT_EQ(v.bos, v.find("<|endoftext|>")) << preset;
    EXPECT_EQ(v.eos, v.find("<|im_end|>")) << preset;
    EXPECT_EQ(tok.encode(" the", true), (Ids{v.find("\xc4\xa0the")})) << preset;  // "Ġthe", no BOS
    const std::string text = "hello there, the model says caf\xc3\xa9 \xe6\x97\xa5\n\t42";
    EXPECT_EQ(tok.decode(tok.encode(text)), text) << preset;
    const Ids chat = tok.encode("<|im_start|>user\nhi<|im_end|>", false, true);
    EXPECT_EQ(chat.front(), v.find("<|im_start|>")) << preset;
    EXPECT_EQ(chat.back(), v.find("<|im_end|>")) << preset;
  }
  for (const std::string preset : {"tiny-gemma2", "tiny-gemma3"}) {  // SentencePiece without the dummy-prefix space
    const Tokenizer tok = load(preset);
    const Vocab& v = tok.vocab();
    EXPECT_EQ(v.kind, VocabKind::Spm) << preset;
    EXPECT_FALSE(v.add_space_prefix) << preset;
    const std::int32_t the = v.find("\xe2\x96\x81the");
    EXPECT_EQ(tok.encode(" the", false), (Ids{the})) << preset;
    const Ids bare = tok.encode("the", false);
    EXPECT_EQ(std::count(bare.begin(), bare.end(), the), 0) << preset;
    EXPECT_EQ(tok.decode({the}), " the") << preset;  // and no leading space is dropped on the way back
    EXPECT_EQ(tok.decode(bare), "the") << preset;
  }
  const Tokenizer phi3 = load("tiny-phi3");  // named ...phi3: its markers take the newline after them
  const Vocab& v = phi3.vocab();
  EXPECT_EQ(phi3.encode("<|user|>\nthe<|end|>\n<|assistant|>\n", false, true),
            (Ids{v.find("<|user|>"), v.find("\xe2\x96\x81the"), v.find("<|end|>"), v.find("<|assistant|>")}));
  const Tokenizer llama = load("tiny");
  EXPECT_TRUE(llama.vocab().add_space_prefix);
  EXPECT_EQ(llama.encode("the", false), (Ids{llama.vocab().find("\xe2\x96\x81the")}));
  EXPECT_TRUE(llama.vocab().special_strip.empty());
}

class GenModel : public ::testing::TestWithParam<std::tuple<std::string, DType>> {};

TEST_P(GenModel, WritesALoadableModelThatGenerates) {
  const auto [preset, type] = GetParam();
  test::TempDir dir;
  ThreadPool pool(2);
  const std::string path = dir.file("m.gguf");
  write_synthetic_model(synthetic_preset(preset), type, 1, path, pool);
  auto f = gguf::File::open(path);
  EXPECT_EQ(f->find_tensor("blk.0.ffn_down.weight")->type, type);
  EXPECT_EQ(f->find_tensor("blk.0.attn_norm.weight")->type, DType::F32);
  Model model(f);
  Tokenizer tok(Vocab::from_gguf(*f));
  const auto prompt = tok.encode("hello there, the model says");
  EXPECT_EQ(tok.decode(prompt), "hello there, the model says");
  GenerateOptions o;
  o.max_tokens = 8;
  o.sampling.temperature = 0;
  o.ignore_eos = true;
  const GenerateResult r = generate(model, tok, prompt, o, pool, {}, true);
  ASSERT_EQ(r.ids.size(), 8u);
  // Not degenerate: logits finite with a real spread, and greedy does not collapse onto one token.
  for (const auto& l : r.logits) {
    float lo = l[0], hi = l[0];
    for (float v : l) {
      ASSERT_TRUE(std::isfinite(v));
      lo = std::min(lo, v);
      hi = std::max(hi, v);
    }
    EXPECT_GT(hi - lo, 2.0f);
  }
}

INSTANTIATE_TEST_SUITE_P(PresetsAndTypes, GenModel,
                         ::testing::Combine(::testing::Values("tiny", "tiny-qwen2"),
                                            ::testing::Values(DType::F32, DType::F16, DType::Q8_0, DType::Q4_0, DType::Q4_K,
                                                              DType::Q6_K)));

// End to end, the AMX tiles change nothing: a whole forward pass over a prompt long enough for
// 16-token tiles (plus a VNNI tail) and the greedy continuation give bit-identical logits on the
// amx and avx512 paths, for each type the tiles handle.
TEST(GenModel, AmxAndAvx512PathsGiveIdenticalLogits) {
  if (kernels::best_isa() != kernels::Isa::Amx) GTEST_SKIP() << "this CPU (or OS) offers no AMX int8 tiles";
  for (DType type : {DType::Q4_0, DType::Q8_0, DType::Q4_K}) {
    test::TempDir dir;
    ThreadPool pool(2);
    write_synthetic_model(synthetic_preset("tiny"), type, 3, dir.file("m.gguf"), pool);
    Model model(gguf::File::open(dir.file("m.gguf")));  // repacked for the x16 kernels both paths share
    Tokenizer tok(Vocab::from_gguf(*gguf::File::open(dir.file("m.gguf"))));
    std::vector<std::int32_t> prompt;
    for (int i = 0; i < 141; ++i) prompt.push_back(static_cast<std::int32_t>(1 + (i * 37) % 200));
    GenerateOptions o;
    o.max_tokens = 6;
    o.sampling.temperature = 0;
    o.ignore_eos = true;
    GenerateResult results[2];
    const kernels::Isa paths[2] = {kernels::Isa::Avx512, kernels::Isa::Amx};
    for (int p = 0; p < 2; ++p) {
      kernels::set_isa(paths[p]);
      results[p] = generate(model, tok, prompt, o, pool, {}, true);
    }
    kernels::set_isa(kernels::best_isa());
    EXPECT_EQ(results[0].ids, results[1].ids) << dtype_name(type);
    ASSERT_EQ(results[0].logits.size(), results[1].logits.size());
    for (std::size_t t = 0; t < results[0].logits.size(); ++t) {
      ASSERT_EQ(results[0].logits[t], results[1].logits[t]) << dtype_name(type) << " token " << t;
    }
  }
}

TEST(GenModel, SameSeedSameFileAnyThreadCount) {
  test::TempDir dir;
  ThreadPool one(1), two(2);
  write_synthetic_model(synthetic_preset("tiny"), DType::Q4_0, 5, dir.file("a.gguf"), one);
  write_synthetic_model(synthetic_preset("tiny"), DType::Q4_0, 5, dir.file("b.gguf"), two);
  EXPECT_EQ(test::read_file(dir.file("a.gguf")), test::read_file(dir.file("b.gguf")));
  EXPECT_THROW(synthetic_preset("huge"), Error);
}

TEST(Quantize, MixesAndFallbacks) {
  test::TempDir dir;
  ThreadPool pool(2);
  write_synthetic_model(synthetic_preset("tiny"), DType::F32, 1, dir.file("f32.gguf"), pool);
  quantize_model(dir.file("f32.gguf"), dir.file("km.gguf"), "Q4_K_M", pool);
  auto f = gguf::File::open(dir.file("km.gguf"));
  EXPECT_EQ(f->find_tensor("output.weight")->type, DType::Q6_K);
  EXPECT_EQ(f->find_tensor("blk.1.attn_v.weight")->type, DType::Q6_K);  // the last eighth gets more bits
  EXPECT_EQ(f->find_tensor("blk.0.attn_v.weight")->type, DType::Q4_K);
  EXPECT_EQ(f->find_tensor("blk.0.attn_q.weight")->type, DType::Q4_K);
  EXPECT_EQ(f->find_tensor("blk.0.attn_norm.weight")->type, DType::F32);
  EXPECT_EQ(f->get_int("general.file_type"), 15);
  EXPECT_EQ(f->get_array("tokenizer.ggml.tokens")->items.size(), 1024u);  // metadata carried over

  // stories260K rows are 64 wide: K-quants fall back to Q8_0
  quantize_model(test::shared_model("stories260K.gguf"), dir.file("s.gguf"), "Q4_K", pool);
  EXPECT_EQ(gguf::File::open(dir.file("s.gguf"))->find_tensor("blk.0.attn_q.weight")->type, DType::Q8_0);

  EXPECT_THROW(quantize_model(dir.file("f32.gguf"), dir.file("x.gguf"), "Q2_K", pool), Error);
  EXPECT_THROW(quantize_model(dir.file("f32.gguf"), dir.file("x.gguf"), "Q6_K_M", pool), Error);  // no such mix
  EXPECT_THROW(quantize_model(dir.file("f32.gguf"), dir.file("f32.gguf"), "Q8_0", pool), Error);
}

// Q3_K_M, tensor for tensor as llama.cpp's quantizer writes it from the code model's F16 file (6
// layers; checked with its llama_model_quantize, file type 12): attn_v Q5_K in layers 0 and 1 and
// Q4_K after, attn_output and ffn_down Q4_K (6 / 16 rounds to no layer of Q5_K), the tied output
// Q6_K, every other matrix Q3_K.
TEST(Quantize, Q3KMMixIsLlamaCpps) {
  test::TempDir dir;
  ThreadPool pool(2);
  quantize_model(test::shared_model("code/code-target-f16.gguf"), dir.file("q3km.gguf"), "Q3_K_M", pool);
  auto f = gguf::File::open(dir.file("q3km.gguf"));
  EXPECT_EQ(f->get_int("general.file_type"), 12);
  for (const gguf::TensorInfo& t : f->tensors()) {
    if (t.dims.size() != 2) continue;
    const int layer = layer_of(t.name);
    DType want = DType::Q3_K;
    if (t.name == "token_embd.weight") want = DType::Q6_K;
    if (t.name.ends_with("attn_v.weight")) want = layer < 2 ? DType::Q5_K : DType::Q4_K;
    if (t.name.ends_with("attn_output.weight") || t.name.ends_with("ffn_down.weight")) want = DType::Q4_K;
    EXPECT_EQ(t.type, want) << t.name;
  }
}

// IQ4_XS as llama.cpp's quantizer writes it from the code model's F16 file (checked with its
// llama_model_quantize, file type 30): every matrix IQ4_XS but the tied output, Q6_K. Rows that do
// not divide into 256-element blocks fall back to IQ4_NL, as there.
TEST(Quantize, IQ4_XSIsLlamaCpps) {
  test::TempDir dir;
  ThreadPool pool(2);
  quantize_model(test::shared_model("code/code-target-f16.gguf"), dir.file("iq4xs.gguf"), "IQ4_XS", pool);
  auto f = gguf::File::open(dir.file("iq4xs.gguf"));
  EXPECT_EQ(f->get_int("general.file_type"), 30);
  for (const gguf::TensorInfo& t : f->tensors()) {
    if (t.dims.size() != 2) continue;
    EXPECT_EQ(t.type, t.name == "token_embd.weight" ? DType::Q6_K : DType::IQ4_XS) << t.name;
  }
  EXPECT_EQ(quantized_matrix_type(DType::IQ4_XS, false, "blk.0.attn_q.weight", 96, 4, true), DType::IQ4_NL);
  EXPECT_EQ(quantized_matrix_type(DType::IQ4_XS, false, "blk.0.attn_q.weight", 100, 4, true), DType::F16);
  EXPECT_EQ(quantized_matrix_type(DType::Q4_K, false, "blk.0.attn_q.weight", 96, 4, true), DType::Q8_0);
  EXPECT_EQ(file_type_for(DType::IQ4_NL), 25u);
  EXPECT_FALSE(parse_quant_target("IQ4_XS_K_M"));
}

// gen-model's Q3_K_M, Q4_K_M and Q5_K_M write the mixes quantize writes, tensor for tensor, with llama.cpp's
// file types.
TEST(GenModel, KMMixesAreTheMixesQuantizeWrites) {
  test::TempDir dir;
  ThreadPool pool(2);
  write_synthetic_model(synthetic_preset("tiny"), DType::F32, 1, dir.file("f32.gguf"), pool);
  struct Mix {
    const char* name;
    DType base;
    std::int64_t file_type;
    int least_q6_k;  // the output, and for Q4_K_M and Q5_K_M a layer's attn_v
  };
  for (const Mix& mix : {Mix{"Q3_K_M", DType::Q3_K, 12, 1}, Mix{"Q4_K_M", DType::Q4_K, 15, 2}, Mix{"Q5_K_M", DType::Q5_K, 17, 2}}) {
    quantize_model(dir.file("f32.gguf"), dir.file("quantized.gguf"), mix.name, pool);
    write_synthetic_model(synthetic_preset("tiny"), mix.base, 1, dir.file("generated.gguf"), pool, "", /*m_mix=*/true);
    auto quantized = gguf::File::open(dir.file("quantized.gguf")), generated = gguf::File::open(dir.file("generated.gguf"));
    ASSERT_EQ(quantized->tensors().size(), generated->tensors().size());
    int q6_k = 0, base = 0;
    for (const gguf::TensorInfo& t : quantized->tensors()) {
      ASSERT_NE(generated->find_tensor(t.name), nullptr) << t.name;
      EXPECT_EQ(generated->find_tensor(t.name)->type, t.type) << mix.name << " " << t.name;
      q6_k += t.type == DType::Q6_K;
      base += t.type == mix.base;
    }
    EXPECT_GE(q6_k, mix.least_q6_k) << mix.name;
    EXPECT_GE(base, 2) << mix.name;
    EXPECT_EQ(quantized->get_int("general.file_type"), mix.file_type);
    EXPECT_EQ(generated->get_int("general.file_type"), mix.file_type);
  }
  EXPECT_THROW(write_synthetic_model(synthetic_preset("tiny"), DType::Q8_0, 1, dir.file("x.gguf"), pool, "", true), Error);
}

TEST(Quantize, QuantizedModelStaysCloseToF32) {
  test::TempDir dir;
  ThreadPool pool(2);
  write_synthetic_model(synthetic_preset("tiny"), DType::F32, 3, dir.file("f32.gguf"), pool);
  auto logits_for = [&](const std::string& path) {
    Model m(gguf::File::open(path));
    KvCache cache = m.make_cache(16);
    Batch b;
    for (int i = 0; i < 6; ++i) b.add(300 + i, i, 0, i == 5);
    std::vector<float> out;
    m.forward(b, cache, pool, out);
    return out;
  };
  const auto ref = logits_for(dir.file("f32.gguf"));
  for (const std::string type : {"Q8_0", "Q6_K", "Q4_K", "Q4_0"}) {
    quantize_model(dir.file("f32.gguf"), dir.file(type + ".gguf"), type, pool);
    const auto got = logits_for(dir.file(type + ".gguf"));
    double err = 0, norm = 0;
    for (std::size_t i = 0; i < ref.size(); ++i) {
      err += (got[i] - ref[i]) * (got[i] - ref[i]);
      norm += ref[i] * ref[i];
    }
    const double rel = std::sqrt(err / norm);
    EXPECT_LT(rel, type == "Q8_0" ? 0.02 : type == "Q6_K" ? 0.05 : 0.25) << type;
  }
}

// llama.cpp's mixes give the output matrix Q6_K; where the output is tied to token_embd (no
// output.weight, as in the code models), token_embd is that matrix.
TEST(Quantize, TiedEmbeddingGetsTheOutputsType) {
  test::TempDir dir;
  ThreadPool pool(2);
  const std::string target = test::shared_model("code/code-target-f16.gguf");
  ASSERT_EQ(gguf::File::open(target)->find_tensor("output.weight"), nullptr);
  quantize_model(target, dir.file("q4.gguf"), "Q4_0", pool);
  auto q4 = gguf::File::open(dir.file("q4.gguf"));
  EXPECT_EQ(q4->find_tensor("token_embd.weight")->type, DType::Q6_K);
  EXPECT_EQ(q4->find_tensor("blk.0.attn_q.weight")->type, DType::Q4_0);
  quantize_model(target, dir.file("q8.gguf"), "Q8_0", pool);
  EXPECT_EQ(gguf::File::open(dir.file("q8.gguf"))->find_tensor("token_embd.weight")->type, DType::Q8_0);
}

}  // namespace
}  // namespace promptly
