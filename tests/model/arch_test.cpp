// Every architecture in model/arch/ on its tiny gen-model preset (F32 weights) against the
// test's own double-precision forward pass (arch_reference.h); MoE routing; sliding windows;
// load errors.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <map>

#include "../test_util.h"
#include "arch_reference.h"
#include "chat/chat_template.h"
#include "chat/reasoning.h"
#include "convert/synthetic_model.h"
#include "engine/generate.h"
#include "spec/ngram.h"
#include "gguf/writer.h"
#include "kernels/cpu.h"
#include "kernels/ops.h"
#include "model/model.h"
#include "model/moe.h"
#include "tokenizer/tokenizer.h"
#include "util/error.h"
#include "util/fp16.h"

namespace promptly {
namespace {

std::string make_model(const test::TempDir& dir, const std::string& preset, DType type = DType::F32) {
  ThreadPool pool(2);
  const std::string path = dir.file(preset + "-" + std::string(dtype_name(type)) + ".gguf");
  write_synthetic_model(synthetic_preset(preset), type, 11, path, pool);
  return path;
}

// Logits of every token of `tokens` for one sequence, run as `chunk`-token forward passes.
std::vector<float> run_chunks(const Model& m, const std::vector<int>& tokens, std::size_t chunk, KvType kv = KvType::F32, std::size_t ctx = 64) {
  ThreadPool pool(2);
  KvCache cache = m.make_cache(ctx, kv);
  std::vector<float> all, out;
  for (std::size_t start = 0; start < tokens.size(); start += chunk) {
    Batch b;
    for (std::size_t i = start; i < std::min(tokens.size(), start + chunk); ++i) b.add(tokens[i], static_cast<std::int32_t>(i), 0, true);
    m.forward(b, cache, pool, out);
    all.insert(all.end(), out.begin(), out.end());
  }
  return all;
}

double max_diff(const std::vector<float>& got, const std::vector<std::vector<double>>& want, std::size_t V) {
  double d = 0;
  for (std::size_t t = 0; t < want.size(); ++t)
    for (std::size_t v = 0; v < V; ++v) d = std::max(d, std::fabs(got[t * V + v] - want[t][v]));
  return d;
}

const std::vector<int> kTokens = {1, 300, 301, 500, 17, 411, 42, 5, 260, 261, 262, 263, 264, 300};

class ArchPreset : public ::testing::TestWithParam<std::string> {};

// Prefill in one pass, in chunks of 3 and token by token (decode): every kernel path a layer takes
// (tiled attention, the windowed / soft-capped one, grouped experts) against the reference.
TEST_P(ArchPreset, LogitsMatchFloat64Reference) {
  test::TempDir dir;
  auto f = gguf::File::open(make_model(dir, GetParam()));
  Model model(f);
  test::ArchReference ref(*f);
  const auto want = ref.run(kTokens);
  const std::size_t V = model.config().n_vocab;
  double spread = 0;
  for (const auto& row : want)
    for (double z : row) spread = std::max(spread, std::fabs(z));
  EXPECT_GT(spread, 0.5) << "logits are degenerate";
  for (std::size_t chunk : {kTokens.size(), std::size_t{3}, std::size_t{1}}) {
    const auto got = run_chunks(model, kTokens, chunk);
    ASSERT_EQ(got.size(), kTokens.size() * V);
    EXPECT_LT(max_diff(got, want, V), 1e-3) << GetParam() << " chunk " << chunk << ", max |logit| " << spread;
  }
}

INSTANTIATE_TEST_SUITE_P(Tiny, ArchPreset,
                         ::testing::Values("tiny", "tiny-qwen2", "tiny-qwen3", "tiny-qwen3moe", "tiny-gemma2", "tiny-gemma3",
                                           "tiny-phi3", "tiny-mixtral"),
                         [](const auto& info) {
                           std::string n = info.param;
                           for (char& c : n) if (c == '-') c = '_';
                           return n;
                         });

// Every kernel path this CPU has (scalar, AVX2, AVX-512, AMX), each chosen before the model loads
// (repacking depends on it): F32 models against the reference, Q8_0 models (the integer kernels on
// repacked weights, an F16 cache) against the scalar path's result.
TEST(Arch, EveryKernelPathAgrees) {
  test::TempDir dir;
  const kernels::Isa original = kernels::active_isa();
  const std::vector<std::string> presets = {"tiny-qwen3", "tiny-qwen3moe", "tiny-gemma2", "tiny-gemma3", "tiny-phi3", "tiny-mixtral"};
  std::map<std::string, std::vector<float>> scalar_q8;
  for (int i = 0; i <= static_cast<int>(kernels::best_isa()); ++i) {
    const auto isa = static_cast<kernels::Isa>(i);
    kernels::set_isa(isa);
    for (const std::string& preset : presets) {
      auto f = gguf::File::open(make_model(dir, preset));
      Model model(f);
      const auto want = test::ArchReference(*f).run(kTokens);
      for (std::size_t chunk : {kTokens.size(), std::size_t{1}}) {
        EXPECT_LT(max_diff(run_chunks(model, kTokens, chunk), want, model.config().n_vocab), 1e-3)
            << kernels::isa_name(isa) << " " << preset << " chunk " << chunk;
      }
      const auto q8 = run_chunks(Model(gguf::File::open(make_model(dir, preset, DType::Q8_0))), kTokens, 1, KvType::F16);
      auto [it, first] = scalar_q8.try_emplace(preset, q8);
      double d = 0, scale = 0;
      for (std::size_t j = 0; j < q8.size(); ++j) {
        d = std::max(d, static_cast<double>(std::fabs(q8[j] - it->second[j])));
        scale = std::max(scale, static_cast<double>(std::fabs(it->second[j])));
      }
      EXPECT_LT(d, 1e-2 * std::max(1.0, scale)) << kernels::isa_name(isa) << " " << preset << " Q8_0";
    }
  }
  kernels::set_isa(original);
}

// Two sequences in one batch (tokens of both grouped by expert, windows per sequence) give what
// each gives alone.
TEST(Arch, BatchedSequencesMatchSeparateRuns) {
  test::TempDir dir;
  const std::vector<int> other = {1, 7, 8, 9, 300, 301, 302, 303, 42};
  for (const std::string preset : {"tiny-qwen3moe", "tiny-mixtral", "tiny-gemma2", "tiny-phi3"}) {
    Model model(gguf::File::open(make_model(dir, preset)));
    const std::size_t V = model.config().n_vocab;
    const auto alone_a = run_chunks(model, kTokens, kTokens.size());
    const auto alone_b = run_chunks(model, other, other.size());
    ThreadPool pool(2);
    KvCache cache = model.make_cache(64, KvType::F32, 2);
    Batch b;
    for (std::size_t i = 0; i < std::max(kTokens.size(), other.size()); ++i) {
      if (i < kTokens.size()) b.add(kTokens[i], static_cast<std::int32_t>(i), 0, true);
      if (i < other.size()) b.add(other[i], static_cast<std::int32_t>(i), 1, true);
    }
    std::vector<float> out;
    model.forward(b, cache, pool, out);
    std::size_t row = 0;
    double d = 0;
    for (std::size_t i = 0; i < std::max(kTokens.size(), other.size()); ++i) {
      for (int seq = 0; seq < 2; ++seq) {
        const auto& alone = seq == 0 ? alone_a : alone_b;
        if (i >= (seq == 0 ? kTokens.size() : other.size())) continue;
        for (std::size_t v = 0; v < V; ++v) d = std::max(d, static_cast<double>(std::fabs(out[row * V + v] - alone[i * V + v])));
        ++row;
      }
    }
    EXPECT_LT(d, 1e-4) << preset;
  }
}

TEST(Arch, DescriptionsMatchTheFiles) {
  test::TempDir dir;
  const auto config = [&](const std::string& preset) { return Model(gguf::File::open(make_model(dir, preset))).config(); };
  const ModelConfig g2 = config("tiny-gemma2");
  EXPECT_EQ(g2.sliding_window, 4u);
  EXPECT_TRUE(g2.layer_is_local(0));
  EXPECT_FALSE(g2.layer_is_local(1));
  EXPECT_FLOAT_EQ(g2.attn_softcap, 50.0f);
  EXPECT_FLOAT_EQ(g2.final_softcap, 30.0f);
  // Within the window every layer reads every position; past it the local layers (0, 2, ...) read 4.
  const std::size_t f16_row = g2.kv_dim() * 2;
  const double row = 2.0 * g2.kv_dim() * 2.0;  // a position's key and value in F16
  EXPECT_DOUBLE_EQ(g2.kv_bytes_read(3, f16_row), g2.n_layer * 3 * row);
  const std::uint32_t local = (g2.n_layer + 1) / 2;
  EXPECT_DOUBLE_EQ(g2.kv_bytes_read(100, f16_row), (local * 4.0 + (g2.n_layer - local) * 100.0) * row);
  const ModelConfig g3 = config("tiny-gemma3");
  for (std::size_t il = 0; il < 6; ++il) EXPECT_EQ(g3.layer_is_local(il), il != 5) << il;
  EXPECT_FLOAT_EQ(g3.swa_rope_base, 10000.0f);
  EXPECT_FLOAT_EQ(g3.rope_freq_base, 1000000.0f);
  EXPECT_EQ(g3.attn_softcap, 0.0f);
  const ModelConfig moe = config("tiny-qwen3moe");
  EXPECT_EQ(moe.n_expert, 8u);
  EXPECT_EQ(moe.n_expert_used, 2u);
  EXPECT_EQ(moe.n_ff_expert, 64u);
  EXPECT_TRUE(moe.expert_weights_norm);
  EXPECT_EQ(moe.head_dim, 32u);
  EXPECT_LT(moe.active_parameters(), 2u * 64u * 64u * 8u * 3u + 512u * 64u * 2u + 4u * 64u * 32u * 4u);
  const ModelConfig mixtral = config("tiny-mixtral");
  EXPECT_EQ(mixtral.arch, "llama");
  EXPECT_EQ(mixtral.n_expert, 4u);
  EXPECT_FALSE(mixtral.rope_neox);
  EXPECT_TRUE(config("tiny-phi3").layer_is_local(1));
  for (const auto& name : synthetic_preset_names()) EXPECT_NO_THROW(synthetic_preset(name)) << name;
}

// Quantized weights and an F16 cache take the integer and F16 kernel paths; their logits stay close
// to the F32 model's (not the reference: quantization moves them).
TEST(Arch, QuantizedModelsStayCloseToF32) {
  test::TempDir dir;
  for (const std::string preset : {"tiny-qwen3moe", "tiny-gemma2", "tiny-gemma3", "tiny-phi3"}) {
    const auto f32 = run_chunks(Model(gguf::File::open(make_model(dir, preset))), kTokens, kTokens.size());
    for (const auto& [type, kv] : {std::pair{DType::Q8_0, KvType::F16}, {DType::F16, KvType::F16}, {DType::Q8_0, KvType::Q8_0}}) {
      const auto q = run_chunks(Model(gguf::File::open(make_model(dir, preset, type))), kTokens, 1, kv);
      double d = 0, scale = 0;
      for (std::size_t i = 0; i < q.size(); ++i) {
        d = std::max(d, static_cast<double>(std::fabs(q[i] - f32[i])));
        scale = std::max(scale, static_cast<double>(std::fabs(f32[i])));
      }
      EXPECT_LT(d, 0.1 * scale) << preset << " " << dtype_name(type) << " kv " << static_cast<int>(kv);
    }
  }
}

// Routing against a direct computation, ties included (equal logits: the lower expert index).
TEST(Arch, MoeRoutingMatchesDirectReference) {
  const std::vector<float> logits = {0.5f, 2.0f, -1.0f, 2.0f, 0.5f, 3.0f, 2.0f, -4.0f};
  ExpertChoice out[3];
  route_experts(logits.data(), 8, 3, arch::Router::TopKThenSoftmax, false, out);
  EXPECT_EQ(out[0].expert, 5u);
  EXPECT_EQ(out[1].expert, 1u);  // 1, 3 and 6 tie at 2.0: the lowest indices win
  EXPECT_EQ(out[2].expert, 3u);
  const double z = std::exp(3.0) + 2 * std::exp(2.0);
  EXPECT_NEAR(out[0].weight, std::exp(3.0) / z, 1e-6);
  EXPECT_NEAR(out[1].weight, std::exp(2.0) / z, 1e-6);
  EXPECT_NEAR(out[2].weight, std::exp(2.0) / z, 1e-6);

  // Softmax over all experts, then the top 2, with and without renormalisation.
  double all = 0;
  for (float l : logits) all += std::exp(static_cast<double>(l));
  route_experts(logits.data(), 8, 2, arch::Router::SoftmaxThenTopK, false, out);
  EXPECT_EQ(out[0].expert, 5u);
  EXPECT_EQ(out[1].expert, 1u);
  EXPECT_NEAR(out[0].weight, std::exp(3.0) / all, 1e-6);
  EXPECT_NEAR(out[1].weight, std::exp(2.0) / all, 1e-6);
  route_experts(logits.data(), 8, 2, arch::Router::SoftmaxThenTopK, true, out);
  EXPECT_NEAR(out[0].weight + out[1].weight, 1.0, 1e-6);
  EXPECT_NEAR(out[0].weight / out[1].weight, std::exp(1.0), 1e-5);

  // All equal: the first k, equal weights.
  const std::vector<float> flat(6, 1.25f);
  route_experts(flat.data(), 6, 2, arch::Router::TopKThenSoftmax, false, out);
  EXPECT_EQ(out[0].expert, 0u);
  EXPECT_EQ(out[1].expert, 1u);
  EXPECT_FLOAT_EQ(out[0].weight, 0.5f);

  // Against the test's reference router on random logits.
  test::TempDir dir;
  auto f = gguf::File::open(make_model(dir, "tiny-qwen3moe"));
  test::ArchReference ref(*f);
  std::uint64_t state = 1;
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<float> l(8);
    std::vector<double> ld(8);
    for (int e = 0; e < 8; ++e) {
      state = state * 6364136223846793005ull + 1442695040888963407ull;
      l[e] = static_cast<float>(static_cast<int>(state >> 61)) * 0.5f;  // few distinct values: many ties
      ld[e] = l[e];
    }
    route_experts(l.data(), 8, 2, arch::Router::SoftmaxThenTopK, true, out);
    const auto want = ref.route(ld);
    for (int i = 0; i < 2; ++i) {
      EXPECT_EQ(static_cast<int>(out[i].expert), want[i].first) << trial;
      EXPECT_NEAR(out[i].weight, want[i].second, 1e-6) << trial;
    }
  }
}

// The window really masks: the engine agrees with the reference at window 4 and not with the
// reference without a window once the sequence is longer than it.
TEST(Arch, SlidingWindowMasksOldPositions) {
  test::TempDir dir;
  auto f = gguf::File::open(make_model(dir, "tiny-phi3"));
  Model model(f);
  test::ArchReference ref(*f);
  const std::size_t V = model.config().n_vocab;
  const auto got = run_chunks(model, kTokens, 1);
  const auto windowed = ref.run(kTokens);
  ref.set_window(0);
  const auto full = ref.run(kTokens);
  EXPECT_LT(max_diff(got, windowed, V), 1e-3);
  EXPECT_GT(max_diff(got, full, V), 1e-2);
  // The first `window` positions see everything either way.
  double early = 0;
  for (std::size_t t = 0; t < 4; ++t)
    for (std::size_t v = 0; v < V; ++v) early = std::max(early, std::fabs(got[t * V + v] - full[t][v]));
  EXPECT_LT(early, 1e-3);
}

// attention_range against a direct softmax over the window, on an F16 paged cache with a cap.
TEST(Arch, AttentionRangeKernel) {
  const std::size_t HD = 8, block = 4, n = 11;
  std::vector<std::vector<std::uint16_t>> kb(3, std::vector<std::uint16_t>(block * HD)), vb(3, std::vector<std::uint16_t>(block * HD));
  std::vector<double> kf(n * HD), vf(n * HD), q(HD);
  for (std::size_t j = 0; j < n; ++j) {
    for (std::size_t i = 0; i < HD; ++i) {
      const float kv = std::sin(0.7f * static_cast<float>(j * HD + i)), vv = std::cos(0.3f * static_cast<float>(j + 2 * i));
      kb[j / block][(j % block) * HD + i] = fp32_to_fp16(kv);
      vb[j / block][(j % block) * HD + i] = fp32_to_fp16(vv);
      kf[j * HD + i] = fp16_to_fp32(fp32_to_fp16(kv));
      vf[j * HD + i] = fp16_to_fp32(fp32_to_fp16(vv));
    }
  }
  std::vector<float> qf(HD);
  for (std::size_t i = 0; i < HD; ++i) q[i] = qf[i] = 1.5f * static_cast<float>(i % 3) - 1.0f;
  const void* kp[3] = {kb[0].data(), kb[1].data(), kb[2].data()};
  const void* vp[3] = {vb[0].data(), vb[1].data(), vb[2].data()};
  for (const auto& [first, cap] : {std::pair{std::size_t{0}, 0.0f}, {std::size_t{5}, 0.0f}, {std::size_t{7}, 1.5f}}) {
    std::vector<float> out(HD);
    kernels::attention_range(qf.data(), kp, vp, DType::F16, block, HD, 0, first, n, HD, 0.5f, cap, out.data());
    std::vector<double> s(n), want(HD, 0.0);
    double mx = -1e300, sum = 0;
    for (std::size_t j = first; j < n; ++j) {
      double d = 0;
      for (std::size_t i = 0; i < HD; ++i) d += q[i] * kf[j * HD + i];
      s[j] = 0.5 * d;
      if (cap > 0) s[j] = cap * std::tanh(s[j] / cap);
      mx = std::max(mx, s[j]);
    }
    for (std::size_t j = first; j < n; ++j) sum += s[j] = std::exp(s[j] - mx);
    for (std::size_t j = first; j < n; ++j)
      for (std::size_t i = 0; i < HD; ++i) want[i] += s[j] / sum * vf[j * HD + i];
    for (std::size_t i = 0; i < HD; ++i) EXPECT_NEAR(out[i], want[i], 1e-5) << first << " " << i;
  }
}

struct Edit {
  std::function<void(gguf::Writer&)> metadata;
  std::function<bool(const gguf::TensorInfo&, gguf::Writer&)> tensor;  // true: handled (skipped or replaced)
  std::string drop_key = {};
};

std::string rewrite(const std::string& in, const std::string& out, const Edit& edit) {
  auto f = gguf::File::open(in);
  gguf::Writer w;
  for (const auto& [k, v] : f->metadata()) {
    if (k != edit.drop_key) w.set(k, v);
  }
  if (edit.metadata) edit.metadata(w);
  for (const auto& t : f->tensors()) {
    if (edit.tensor && edit.tensor(t, w)) continue;
    const gguf::TensorInfo* src = &t;
    w.add_tensor(t.name, t.dims, t.type, [src](std::uint8_t* o) { std::memcpy(o, src->data, src->n_bytes); });
  }
  w.write(out);
  return out;
}

std::string load_error(const std::string& path) {
  try {
    Model m(gguf::File::open(path));
  } catch (const Error& e) {
    return e.what();
  }
  return "(loaded)";
}

// Early Mixtral files hold each expert as its own tensor (blk.N.ffn_gate.E.weight); the same
// weights split that way give the same logits.
TEST(Arch, MixtralWithSplitExpertTensors) {
  test::TempDir dir;
  const std::string merged = make_model(dir, "tiny-mixtral");
  const std::string split = rewrite(merged, dir.file("split.gguf"), {{}, [](const gguf::TensorInfo& t, gguf::Writer& w) {
                                                                      const auto at = t.name.find("_exps.weight");
                                                                      if (at == std::string::npos) return false;
                                                                      const std::string base = t.name.substr(0, at);  // blk.N.ffn_gate
                                                                      const std::size_t bytes = t.n_bytes / t.dims[2];
                                                                      for (std::uint64_t e = 0; e < t.dims[2]; ++e) {
                                                                        const std::uint8_t* src = t.data + e * bytes;
                                                                        w.add_tensor(base + "." + std::to_string(e) + ".weight", {t.dims[0], t.dims[1]}, t.type,
                                                                                     [src, bytes](std::uint8_t* o) { std::memcpy(o, src, bytes); });
                                                                      }
                                                                      return true;
                                                                    }});
  auto f = gguf::File::open(split);
  ASSERT_NE(f->find_tensor("blk.1.ffn_down.3.weight"), nullptr);
  const auto a = run_chunks(Model(gguf::File::open(merged)), kTokens, kTokens.size());
  const auto b = run_chunks(Model(f), kTokens, kTokens.size());
  EXPECT_EQ(a, b);
}

// Each family's preset carries its chat format: the template renders its turns, its special tokens
// are single control tokens, and its end-of-turn token ends generation.
TEST(Arch, PresetsCarryTheirFamilysChat) {
  test::TempDir dir;
  const nlohmann::ordered_json messages = nlohmann::ordered_json::parse(R"([{"role":"user","content":"hello there"}])");
  struct Family {
    std::string preset, prompt, end_of_turn;
  };
  for (const Family& fam : {Family{"tiny-qwen3", "<|im_start|>user\nhello there<|im_end|>\n<|im_start|>assistant\n", "<|im_end|>"},
                            Family{"tiny-qwen3moe", "<|im_start|>user\nhello there<|im_end|>\n<|im_start|>assistant\n", "<|im_end|>"},
                            Family{"tiny-gemma2", "<s><start_of_turn>user\nhello there<end_of_turn>\n<start_of_turn>model\n", "<end_of_turn>"},
                            Family{"tiny-gemma3", "<s><start_of_turn>user\nhello there<end_of_turn>\n<start_of_turn>model\n", "<end_of_turn>"},
                            Family{"tiny-phi3", "<|user|>\nhello there<|end|>\n<|assistant|>\n", "<|end|>"},
                            Family{"tiny-mixtral", "<s>[INST] hello there [/INST]", ""}}) {
    auto f = gguf::File::open(make_model(dir, fam.preset));
    const auto source = f->get_string("tokenizer.chat_template");
    ASSERT_TRUE(source) << fam.preset;
    ChatRenderOptions ro;
    ro.bos_token = "<s>";
    ro.eos_token = "</s>";
    EXPECT_EQ(ChatTemplate(*source).render(messages, ro), fam.prompt) << fam.preset;
    if (fam.end_of_turn.empty()) continue;
    const Tokenizer tok(Vocab::from_gguf(*f));
    const std::int32_t eot = tok.vocab().find(fam.end_of_turn);
    ASSERT_GE(eot, 0) << fam.preset;
    const auto ids = tok.encode(fam.prompt, false, true);
    EXPECT_NE(std::find(ids.begin(), ids.end(), eot), ids.end()) << fam.preset;
    const auto eog = tok.vocab().end_of_generation_ids();
    EXPECT_NE(std::find(eog.begin(), eog.end(), eot), eog.end()) << fam.preset;
    // The model runs the rendered prompt.
    const std::vector<int> prompt_ids(ids.begin(), ids.end());
    EXPECT_EQ(run_chunks(Model(f), prompt_ids, prompt_ids.size()).size(), prompt_ids.size() * tok.vocab().size());
  }
  // Qwen3's thinking switch.
  auto f = gguf::File::open(make_model(dir, "tiny-qwen3"));
  const std::string source = *f->get_string("tokenizer.chat_template");
  EXPECT_TRUE(ReasoningSplitter::template_thinks(source));
  ChatRenderOptions ro;
  ro.extra["enable_thinking"] = false;
  EXPECT_EQ(ChatTemplate(source).render(messages, ro),
            "<|im_start|>user\nhello there<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n");
}

// Phi-3 128k / Phi-3.5 LongRoPE: the factors divide the rotation speeds and attn_factor scales cos
// and sin (so every score by its square): the short factors for caches up to the original context,
// the long ones past it.
TEST(Arch, Phi3LongRopeFactors) {
  test::TempDir dir;
  const std::string base = make_model(dir, "tiny-phi3");
  const auto factors = [](float first, float step) {
    return [=](std::uint8_t* o) {
      for (int i = 0; i < 8; ++i) {
        const float f = first + step * static_cast<float>(i);
        std::memcpy(o + 4 * i, &f, 4);
      }
    };
  };
  const std::string path = rewrite(base, dir.file("longrope.gguf"),
                                   {[](gguf::Writer& w) {
                                      w.set_string("phi3.rope.scaling.type", "longrope");
                                      w.set_f32("phi3.rope.scaling.attn_factor", 1.19f);
                                    },
                                    [&](const gguf::TensorInfo& t, gguf::Writer& w) {
                                      if (t.name != "output_norm.weight") return false;
                                      const gguf::TensorInfo* src = &t;
                                      w.add_tensor(t.name, t.dims, t.type, [src](std::uint8_t* o) { std::memcpy(o, src->data, src->n_bytes); });
                                      w.add_tensor("rope_factors_short.weight", {8}, DType::F32, factors(1.0f, 0.5f));
                                      w.add_tensor("rope_factors_long.weight", {8}, DType::F32, factors(2.0f, 4.0f));
                                      return true;
                                    }});
  auto f = gguf::File::open(path);
  Model model(f);
  EXPECT_FLOAT_EQ(model.config().rope_attn_factor, 1.19f);
  const std::size_t V = model.config().n_vocab;
  const auto got = run_chunks(model, kTokens, 1);
  EXPECT_LT(max_diff(got, test::ArchReference(*f).run(kTokens), V), 1e-3);
  auto plain = gguf::File::open(base);
  EXPECT_GT(max_diff(got, test::ArchReference(*plain).run(kTokens), V), 1e-3);  // the factors matter
  // A cache for more positions than the original context (tiny-phi3's 4096) rotates with the long factors.
  ASSERT_EQ(model.config().rope_orig_ctx, 4096u);
  const auto long_ctx = run_chunks(model, kTokens, 1, KvType::F32, 4097);
  test::ArchReference long_reference(*f);
  long_reference.set_context(4097);
  EXPECT_LT(max_diff(long_ctx, long_reference.run(kTokens), V), 1e-3);
  EXPECT_GT(max_diff(long_ctx, test::ArchReference(*f).run(kTokens), V), 1e-3);
  EXPECT_LT(max_diff(run_chunks(model, kTokens, 1, KvType::F32, 4096), test::ArchReference(*f).run(kTokens), V), 1e-3);
}

TEST(Arch, LoadErrorsNameTheTensor) {
  test::TempDir dir;
  const std::string phi3 = make_model(dir, "tiny-phi3"), moe = make_model(dir, "tiny-qwen3moe"), qwen3 = make_model(dir, "tiny-qwen3");
  const auto drop = [&](const std::string& base, const std::string& name) {
    return load_error(rewrite(base, dir.file("drop.gguf"), {{}, [&](const gguf::TensorInfo& t, gguf::Writer&) { return t.name == name; }}));
  };
  const auto reshape = [&](const std::string& base, const std::string& name, std::vector<std::uint64_t> dims) {
    return load_error(rewrite(base, dir.file("shape.gguf"), {{}, [&](const gguf::TensorInfo& t, gguf::Writer& w) {
                                                               if (t.name != name) return false;
                                                               w.add_tensor(t.name, dims, t.type, [](std::uint8_t*) {});
                                                               return true;
                                                             }}));
  };
  EXPECT_NE(drop(phi3, "blk.1.attn_qkv.weight").find("lacks tensor 'blk.1.attn_qkv.weight'"), std::string::npos);
  EXPECT_NE(drop(qwen3, "blk.0.attn_k_norm.weight").find("lacks tensor 'blk.0.attn_k_norm.weight'"), std::string::npos);
  EXPECT_NE(drop(moe, "blk.1.ffn_down_exps.weight").find("lacks tensor 'blk.1.ffn_down_exps.weight'"), std::string::npos);
  EXPECT_NE(reshape(phi3, "blk.0.ffn_up.weight", {64, 192}).find("tensor 'blk.0.ffn_up.weight' has shape [64, 192], expected [64, 384]"),
            std::string::npos);
  EXPECT_NE(reshape(moe, "blk.0.ffn_up_exps.weight", {64, 64, 4})
                .find("tensor 'blk.0.ffn_up_exps.weight' has shape [64, 64, 4], expected [64, 64, 8]"),
            std::string::npos);
  const std::string gemma = make_model(dir, "tiny-gemma2");
  EXPECT_NE(drop(gemma, "blk.0.post_ffw_norm.weight").find("lacks tensor 'blk.0.post_ffw_norm.weight'"), std::string::npos);
  const std::string no_experts =
      load_error(rewrite(moe, dir.file("meta.gguf"), {{}, {}, "qwen3moe.expert_count"}));
  EXPECT_NE(no_experts.find("lacks metadata key 'qwen3moe.expert_count'"), std::string::npos) << no_experts;
  const std::string unknown =
      load_error(rewrite(qwen3, dir.file("arch.gguf"), {[](gguf::Writer& w) { w.set_string("general.architecture", "gpt9"); }, {}}));
  EXPECT_NE(unknown.find("unsupported architecture 'gpt9'; supported: gemma2, gemma3, llama, phi3, qwen2, qwen3, qwen3moe"),
            std::string::npos)
      << unknown;
}

// Sliding-window release: generation that gives back the local layers' KV behind their window
// produces the same tokens and logits as generation that keeps it all (prefill in chunks, then
// decode with n-gram speculation, whose rejected guesses roll the length back), and holds only
// the global layers' full KV plus the local layers' last blocks.
TEST(Arch, SlidingWindowRelease) {
  test::TempDir dir;
  ThreadPool pool(2);
  std::size_t rejected_guesses = 0;
  for (const std::string preset : {"tiny-gemma3", "tiny-gemma2", "tiny-phi3"}) {
    auto f = gguf::File::open(make_model(dir, preset));
    Model model(f);
    const Tokenizer tok(Vocab::from_gguf(*f));
    const ModelConfig& c = model.config();
    std::vector<std::int32_t> prompt;
    for (int i = 0; i < 150; ++i) prompt.push_back(259 + (i * 37) % 200);
    GenerateOptions o;
    o.max_tokens = 60;
    o.ignore_eos = true;
    o.sampling.temperature = 0;
    o.ctx_size = 512;
    o.prefill_chunk = 64;
    spec::NgramProposer ngram(3);
    o.proposer = &ngram;
    o.spec_tokens = 4;
    const GenerateResult released = generate(model, tok, prompt, o, pool, {}, true);
    o.release_window_kv = false;
    const GenerateResult kept = generate(model, tok, prompt, o, pool, {}, true);
    EXPECT_EQ(released.ids, kept.ids) << preset;
    EXPECT_EQ(released.logits, kept.logits) << preset;
    EXPECT_GT(released.timings.spec_drafted, 0u) << preset;  // the passes verified guesses
    rejected_guesses += released.timings.spec_drafted - released.timings.spec_accepted;

    std::size_t n_local = 0;
    for (std::size_t il = 0; il < c.n_layer; ++il) n_local += c.layer_is_local(il) ? 1 : 0;
    ASSERT_GT(n_local, 0u) << preset;
    const std::size_t bt = KvCache::kDefaultBlockTokens, layer_bytes = 2 * bt * kv_row_bytes(c.kv_dim(), KvType::F32);
    // Every block holds all layers when nothing is released; the cache holds at least every token
    // but the last sampled one (and the last pass's rejected guesses may have taken one more block).
    ASSERT_EQ(kept.timings.kv_bytes % (c.n_layer * layer_bytes), 0u) << preset;
    const std::size_t blocks = kept.timings.kv_bytes / (c.n_layer * layer_bytes);
    EXPECT_GE(blocks, (prompt.size() + released.ids.size() - 1 + bt - 1) / bt) << preset;
    // Released: the other layers' blocks whole, and local KV only where the last pass's window
    // (4 positions) and its guesses lay: one or two blocks.
    const std::size_t global = blocks * (c.n_layer - n_local) * layer_bytes;
    EXPECT_GE(released.timings.kv_bytes, global + n_local * layer_bytes) << preset;
    EXPECT_LE(released.timings.kv_bytes, global + 2 * n_local * layer_bytes) << preset;
  }
  EXPECT_GT(rejected_guesses, 0u);  // some pass's length went back after a release (Phi-3's, with these weights)
}

}  // namespace
}  // namespace promptly
