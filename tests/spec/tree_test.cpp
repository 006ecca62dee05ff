// Token trees: one pass over a tree gives every node the logits of its own path run as a plain
// chain (the attention mask hides siblings' branches), and the accepted path's K/V moved into place
// serve later passes as if that path had been decoded.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>

#include "../test_util.h"
#include "spec_test_util.h"
#include "convert/synthetic_model.h"
#include "engine/generate.h"
#include "kernels/cpu.h"
#include "model/model.h"
#include "spec/draft_model.h"
#include "tokenizer/tokenizer.h"

namespace promptly {
namespace {

using test::greedy;
using test::Loaded;

std::vector<kernels::Isa> kernel_paths() {
  std::vector<kernels::Isa> paths = {kernels::Isa::Scalar};
  if (static_cast<int>(kernels::best_isa()) >= static_cast<int>(kernels::Isa::Avx2)) paths.push_back(kernels::Isa::Avx2);
  if (static_cast<int>(kernels::best_isa()) >= static_cast<int>(kernels::Isa::Avx512)) paths.push_back(kernels::Isa::Avx512);
  if (kernels::best_isa() == kernels::Isa::Amx) paths.push_back(kernels::Isa::Amx);
  return paths;
}

struct RestoreIsa {
  ~RestoreIsa() { kernels::set_isa(kernels::best_isa()); }
};

// A tree of 9 nodes over the context (parents by node index, -1: the context's last token), in the
// order a level-by-level builder writes it; branches of different depths, a node with three children.
const std::vector<int> kParents = {-1, -1, -1, 0, 0, 1, 3, 3, 6};

std::vector<int> path_to(int node) {  // the nodes from the first level down to `node`
  std::vector<int> path;
  for (int n = node; n >= 0; n = kParents[static_cast<std::size_t>(n)]) path.insert(path.begin(), n);
  return path;
}

// Prefills `context`, then runs its last token and the tree in one pass; compares each node's
// logits with those of the same path decoded as a chain in a fresh cache.
void expect_tree_logits_equal_chain_logits(const Model& model, const std::vector<std::int32_t>& context, KvType kv_type, ThreadPool& pool,
                                           const std::string& what) {
  const std::size_t n_vocab = model.config().n_vocab;
  std::vector<std::int32_t> tree_tokens;
  for (std::size_t i = 0; i < kParents.size(); ++i) tree_tokens.push_back(static_cast<std::int32_t>((7 * i + 3) % n_vocab));
  const auto C = static_cast<std::int32_t>(context.size());
  KvCache cache = model.make_cache(128, kv_type);
  Batch batch;
  std::vector<float> logits;
  for (std::int32_t i = 0; i + 1 < C; ++i) batch.add(context[static_cast<std::size_t>(i)], i, 0, false);
  model.forward(batch, cache, pool, logits);
  batch.clear();
  batch.add(context.back(), C - 1, 0, true);
  std::vector<std::uint64_t> ancestors(kParents.size());
  for (std::size_t i = 0; i < kParents.size(); ++i) {
    const int parent = kParents[i];
    ancestors[i] = (std::uint64_t{1} << i) | (parent >= 0 ? ancestors[static_cast<std::size_t>(parent)] : 0);
    batch.add_tree_node(tree_tokens[i], 0, C, static_cast<std::int32_t>(i), static_cast<std::int32_t>(path_to(static_cast<int>(i)).size()),
                        ancestors[i], true);
  }
  model.forward(batch, cache, pool, logits);
  ASSERT_EQ(logits.size(), (kParents.size() + 1) * n_vocab);

  for (std::size_t node = 0; node < kParents.size(); ++node) {
    std::vector<std::int32_t> chain = context;
    for (int n : path_to(static_cast<int>(node))) chain.push_back(tree_tokens[static_cast<std::size_t>(n)]);
    KvCache plain = model.make_cache(128, kv_type);
    Batch b;
    for (std::size_t i = 0; i < chain.size(); ++i) b.add(chain[i], static_cast<std::int32_t>(i), 0, i + 1 == chain.size());
    std::vector<float> want;
    model.forward(b, plain, pool, want);
    const float* got = &logits[(node + 1) * n_vocab];
    double worst = 0;
    for (std::size_t v = 0; v < n_vocab; ++v) worst = std::max(worst, static_cast<double>(std::fabs(got[v] - want[v])));
    EXPECT_LT(worst, 2e-3) << what << " node " << node;
  }
}

TEST(TokenTree, EachNodesLogitsEqualItsPathRunAsAChainOnEveryKernelPath) {
  test::TempDir dir;
  ThreadPool pool(2);
  write_synthetic_model(synthetic_preset("tiny"), DType::Q8_0, 1, dir.file("random.gguf"), pool);
  RestoreIsa restore;
  for (const kernels::Isa isa : kernel_paths()) {
    kernels::set_isa(isa);
    for (const std::string& path : {test::shared_model("stories260K.gguf"), dir.file("random.gguf")}) {
      Loaded m(path);
      const auto context = m.tokenizer->encode("Once upon a time, there was a little dog named Max. Max", true, false);
      for (KvType kv : {KvType::F32, KvType::F16}) {
        expect_tree_logits_equal_chain_logits(*m.model, context, kv, pool,
                                              path + " " + kernels::kernel_table(isa).name + " kv " + kv_type_name(kv));
      }
    }
  }
}

TEST(TokenTree, TheAcceptedPathMovedIntoPlaceServesTheNextPassAsIfDecoded) {
  Loaded m(test::shared_model("stories260K.gguf"));
  ThreadPool pool(2);
  const std::size_t n_vocab = m.model->config().n_vocab;
  const auto context = m.tokenizer->encode("Once upon a time, there was a little", true, false);
  const auto C = static_cast<std::int32_t>(context.size());
  // Tree: two first-level nodes, the second with one child; the accepted path is nodes 1 then 2.
  const std::vector<std::int32_t> tokens = {11, 42, 77};
  KvCache cache = m.model->make_cache(128, KvType::F16);
  Batch batch;
  std::vector<float> logits;
  for (std::int32_t i = 0; i < C; ++i) batch.add(context[static_cast<std::size_t>(i)], i, 0, false);
  m.model->forward(batch, cache, pool, logits);
  batch.clear();
  batch.add_tree_node(tokens[0], 0, C, 0, 1, 0b001, false);
  batch.add_tree_node(tokens[1], 0, C, 1, 1, 0b010, false);
  batch.add_tree_node(tokens[2], 0, C, 2, 2, 0b110, false);
  m.model->forward(batch, cache, pool, logits);
  cache.move_position(0, static_cast<std::size_t>(C) + 1, static_cast<std::size_t>(C));
  cache.move_position(0, static_cast<std::size_t>(C) + 2, static_cast<std::size_t>(C) + 1);
  cache.set_length(0, static_cast<std::size_t>(C) + 2);
  batch.clear();
  batch.add(5, C + 2, 0, true);
  m.model->forward(batch, cache, pool, logits);

  std::vector<std::int32_t> chain = context;
  chain.insert(chain.end(), {tokens[1], tokens[2], 5});
  KvCache plain = m.model->make_cache(128, KvType::F16);
  Batch b;
  for (std::size_t i = 0; i < chain.size(); ++i) b.add(chain[i], static_cast<std::int32_t>(i), 0, i + 1 == chain.size());
  std::vector<float> want;
  m.model->forward(b, plain, pool, want);
  for (std::size_t v = 0; v < n_vocab; ++v) ASSERT_NEAR(logits[v], want[v], 2e-3) << v;
}


spec::DraftOptions tree_options(std::size_t width, std::size_t depth, float min_p) {
  spec::DraftOptions d;
  d.sampling.temperature = 0;
  d.tree_width = width;
  d.tree_depth = depth;
  d.tree_min_p = min_p;
  return d;
}

// Greedy decoding with a token tree gives plain decoding's tokens, and the tree is really used:
// passes accept guesses, and some accepted guesses are not the draft's first choice.
TEST(TokenTree, GreedyEqualsPlainDecodingOnTheCodePair) {
  Loaded target(test::shared_model("code/code-target-f16.gguf"));
  Loaded draft(test::shared_model("code/code-draft-f16.gguf"));
  ThreadPool pool(2);
  const std::string code = test::read_file(test::shared_model("code/val.txt")).substr(4000, 900);
  const auto prompt = target.tokenizer->encode(code, true, false);
  const GenerateResult plain = generate(*target.model, *target.tokenizer, prompt, greedy(96), pool);
  spec::DraftModelProposer chain(*draft.model, tree_options(0, 0, 0), pool);
  for (const auto& [width, nodes] : {std::pair{2u, 8u}, std::pair{3u, 16u}, std::pair{4u, 40u}}) {
    spec::DraftModelProposer tree(*draft.model, tree_options(width, 5, 0.01f), pool);
    GenerateOptions g = greedy(96);
    g.proposer = &tree;
    g.spec_tokens = nodes;
    const GenerateResult fast = generate(*target.model, *target.tokenizer, prompt, g, pool);
    EXPECT_EQ(fast.ids, plain.ids) << "width " << width << " nodes " << nodes;
    EXPECT_GT(fast.timings.spec_accepted, 30u);
    EXPECT_LT(fast.timings.spec_passes, 60u);
  }
}

TEST(TokenTree, GreedyEqualsPlainOnStoriesAndRandomModelsOnEveryKernelPath) {
  test::TempDir dir;
  ThreadPool pool(2);
  write_synthetic_model(synthetic_preset("tiny"), DType::Q8_0, 1, dir.file("target.gguf"), pool);
  write_synthetic_model(synthetic_preset("tiny"), DType::F32, 2, dir.file("draft.gguf"), pool);
  RestoreIsa restore;
  for (const kernels::Isa isa : kernel_paths()) {
    kernels::set_isa(isa);
    for (const auto& [target_path, draft_path] : {std::pair{test::shared_model("stories260K.gguf"), test::shared_model("stories260K.gguf")},
                                                  std::pair{dir.file("target.gguf"), dir.file("draft.gguf")}}) {
      Loaded target(target_path), draft(draft_path);
      const auto prompt = target.tokenizer->encode("Once upon a time, there was a little dog. The dog", true, false);
      for (KvType kv : {KvType::F32, KvType::F16}) {
        GenerateOptions g = greedy(60);
        g.kv_type = kv;
        const GenerateResult plain = generate(*target.model, *target.tokenizer, prompt, g, pool);
        spec::DraftOptions d = tree_options(3, 4, 0.0f);
        d.kv_type = kv;
        spec::DraftModelProposer tree(*draft.model, d, pool);
        g.proposer = &tree;
        g.spec_tokens = 12;
        const GenerateResult fast = generate(*target.model, *target.tokenizer, prompt, g, pool);
        EXPECT_EQ(fast.ids, plain.ids) << target_path << " on " << kernels::kernel_table(isa).name << " kv " << kv_type_name(kv);
        // A model agrees with itself: every pass with room for guesses accepts at least its first.
        if (target_path == draft_path) {
          EXPECT_GE(fast.timings.spec_accepted + 1, fast.timings.spec_passes);
        }
      }
    }
  }
}

// Gemma 2's sliding windows and soft caps (applied inside the tiled kernels, whose log-sum-exp is of
// the capped scores in the window) with token trees: a window of 80 positions that a 100-token
// context outruns, so each node's window starts inside the context; every node's logits are its
// path's run as a chain. Then greedy decoding with a tree proposer while the sliding-window KV is
// released behind the root (generate's default) gives plain decoding's tokens.
TEST(TokenTree, SlidingWindowsAndSoftCapsWithTrees) {
  test::TempDir dir;
  ThreadPool pool(2);
  SyntheticModelSpec spec = synthetic_preset("tiny-gemma2");
  spec.sliding_window = 80;
  write_synthetic_model(spec, DType::F32, 3, dir.file("gemma2.gguf"), pool);
  Loaded m(dir.file("gemma2.gguf"));
  ASSERT_EQ(m.model->config().sliding_window, 80u);
  ASSERT_GT(m.model->config().attn_softcap, 0.0f);
  std::vector<std::int32_t> context;
  for (int i = 0; i < 100; ++i) context.push_back(static_cast<std::int32_t>(3 + (i * 29) % (m.model->config().n_vocab - 3)));
  RestoreIsa restore;
  for (const kernels::Isa isa : kernel_paths()) {
    kernels::set_isa(isa);
    expect_tree_logits_equal_chain_logits(*m.model, context, KvType::F32, pool, std::string("gemma2 window 80 on ") + kernels::kernel_table(isa).name);
  }
  kernels::set_isa(kernels::best_isa());
  const std::vector<std::int32_t> prompt(context.begin(), context.begin() + 70);
  GenerateOptions g = greedy(60);
  const GenerateResult plain = generate(*m.model, *m.tokenizer, prompt, g, pool);
  spec::DraftModelProposer tree(*m.model, tree_options(3, 4, 0.0f), pool);
  g.proposer = &tree;
  g.spec_tokens = 12;
  const GenerateResult fast = generate(*m.model, *m.tokenizer, prompt, g, pool);
  EXPECT_EQ(fast.ids, plain.ids);
  EXPECT_GT(fast.timings.spec_accepted, 10u);
}

// A prompt whose K/V comes back from the KV spool (the prefix cache of `run`): the tree grows after
// blocks that were read, not computed, and the output is still plain decoding's.
TEST(TokenTree, GreedyEqualsPlainAfterASpooledPrefix) {
  Loaded target(test::shared_model("stories260K.gguf"));
  ThreadPool pool(2);
  test::TempDir dir;
  const auto prompt = target.tokenizer->encode("Once upon a time, there was a little girl named Lily. She loved to play outside", true, false);
  GenerateOptions g = greedy(48);
  g.kv_type = KvType::F16;
  const GenerateResult plain = generate(*target.model, *target.tokenizer, prompt, g, pool);
  g.kv_spool_dir = dir.file("spool");
  spec::DraftOptions d = tree_options(2, 4, 0.0f);
  d.kv_type = KvType::F16;
  spec::DraftModelProposer tree(*target.model, d, pool);
  g.proposer = &tree;
  g.spec_tokens = 8;
  const GenerateResult cold = generate(*target.model, *target.tokenizer, prompt, g, pool);
  const GenerateResult warm = generate(*target.model, *target.tokenizer, prompt, g, pool);
  EXPECT_EQ(cold.timings.n_spooled, 0u);
  EXPECT_GT(warm.timings.n_spooled, 0u);
  EXPECT_EQ(cold.ids, plain.ids);
  EXPECT_EQ(warm.ids, plain.ids);
  EXPECT_GT(warm.timings.spec_accepted, 0u);
}

}  // namespace
}  // namespace promptly
