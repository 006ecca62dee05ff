// Speculative decoding changes how fast tokens come, never which: greedy output with every proposer
// equals plain decoding token for token, on trained and random-weight models and every kernel path.
#include <gtest/gtest.h>

#include <memory>

#include "../chi_square.h"
#include "../test_util.h"
#include "spec_test_util.h"
#include "convert/quantize.h"
#include "convert/synthetic_model.h"
#include "engine/generate.h"
#include "kernels/cpu.h"
#include "model/model.h"
#include "spec/draft_model.h"
#include "spec/ngram.h"
#include "spec/verify.h"
#include "tokenizer/tokenizer.h"
#include "util/error.h"

namespace promptly {
namespace {

using test::greedy;
using test::Loaded;

// Runs the prompt without speculation and with `proposer`; returns both results.
std::pair<GenerateResult, GenerateResult> both(const Loaded& target, const std::vector<std::int32_t>& prompt, GenerateOptions g,
                                               spec::Proposer* proposer, std::size_t k, ThreadPool& pool) {
  GenerateResult plain = generate(*target.model, *target.tokenizer, prompt, g, pool);
  g.proposer = proposer;
  g.spec_tokens = k;
  GenerateResult fast = generate(*target.model, *target.tokenizer, prompt, g, pool);
  return {std::move(plain), std::move(fast)};
}

TEST(Ngram, ProposesWhatFollowedTheLatestLongestMatch) {
  spec::NgramProposer ngram(3);
  spec::Proposal p;
  // "1 2 3 9 ... 1 2 3 7 8 ... 2 3": the 2-gram "2 3" last occurred before "7 8".
  ngram.propose({1, 2, 3, 9, 5, 1, 2, 3, 7, 8, 4, 2, 3}, 2, p);
  EXPECT_EQ(p.tokens, (std::vector<std::int32_t>{7, 8}));
  // The 3-gram "1 2 3" beats the later 1-gram "3".
  ngram.propose({1, 2, 3, 4, 5, 6, 3, 0, 1, 2, 3}, 3, p);
  EXPECT_EQ(p.tokens, (std::vector<std::int32_t>{4, 5, 6}));
  // Past the context's end the copy continues from its own output (a period-2 run).
  ngram.propose({5, 0, 1, 0, 1}, 5, p);
  EXPECT_EQ(p.tokens, (std::vector<std::int32_t>{0, 1, 0, 1, 0}));
  ngram.propose({1, 2, 3}, 4, p);  // nothing repeats
  EXPECT_TRUE(p.tokens.empty());
  EXPECT_TRUE(p.q.empty());
  EXPECT_THROW(spec::NgramProposer(0), Error);
}

TEST(Spec, VerifyChainGreedyAcceptsThePrefixTheTargetAgreesWith) {
  // Three rows over a 4-token vocabulary: the target wants 2, then 1, then 3.
  std::vector<float> rows = {0, 0, 5, 0, 0, 5, 0, 0, 0, 0, 0, 5};
  SamplingParams sp;
  sp.temperature = 0;
  Sampler sampler(sp);
  std::vector<std::int32_t> history = {0}, out;
  std::vector<float> p;
  spec::Proposal proposal;
  proposal.tokens = {2, 3};  // the first guess holds, the second does not
  EXPECT_EQ(spec::verify_chain(rows.data(), 4, proposal, history, sampler, p, out), 1u);
  EXPECT_EQ(out, (std::vector<std::int32_t>{2, 1}));
  EXPECT_EQ(history, (std::vector<std::int32_t>{0}));
  out.clear();
  proposal.tokens = {2, 1};  // both hold: the last row adds the target's third token
  EXPECT_EQ(spec::verify_chain(rows.data(), 4, proposal, history, sampler, p, out), 2u);
  EXPECT_EQ(out, (std::vector<std::int32_t>{2, 1, 3}));
}

TEST(TokenTree, VerifyTreeGreedyFollowsTheTargetsChoiceDownTheTree) {
  // Rows over a 4-token vocabulary for the root and 4 nodes: node 0 (token 1) and node 1 (token 2)
  // after the context, node 2 (token 3) and node 3 (token 0) after node 1. The target wants 2 at the
  // root, then 0 after it, then 3 after that.
  std::vector<float> rows = {0, 0, 5, 0,   // root
                             5, 0, 0, 0,   // node 0
                             5, 0, 0, 0,   // node 1
                             0, 5, 0, 0,   // node 2
                             0, 0, 0, 5};  // node 3
  SamplingParams sp;
  sp.temperature = 0;
  Sampler sampler(sp);
  std::vector<std::int32_t> history = {1}, out;
  std::vector<std::size_t> path;
  std::vector<float> p;
  spec::Proposal tree;
  tree.tokens = {1, 2, 3, 0};
  tree.parents = {-1, -1, 1, 1};
  // The second first-level node holds, then its second child, whose row adds the target's 3.
  EXPECT_EQ(spec::verify_tree(rows.data(), 4, tree, history, sampler, p, out, path), 2u);
  EXPECT_EQ(out, (std::vector<std::int32_t>{2, 0, 3}));
  EXPECT_EQ(path, (std::vector<std::size_t>{1, 3}));
  EXPECT_EQ(history, (std::vector<std::int32_t>{1}));
  // No first-level node is the target's choice: nothing accepted, its own token instead.
  tree.tokens = {1, 3, 3, 0};
  out.clear();
  EXPECT_EQ(spec::verify_tree(rows.data(), 4, tree, history, sampler, p, out, path), 0u);
  EXPECT_EQ(out, (std::vector<std::int32_t>{2}));
  EXPECT_TRUE(path.empty());
}

TEST(Spec, GreedyDraftAndNgramEqualPlainDecodingOnTheCodePair) {
  Loaded target(test::shared_model("code/code-target-f16.gguf"));
  Loaded draft(test::shared_model("code/code-draft-f16.gguf"));
  ThreadPool pool(2);
  const std::string code = test::read_file(test::shared_model("code/val.txt")).substr(4000, 900);
  const auto prompt = target.tokenizer->encode(code, true, false);
  spec::DraftOptions d;
  d.sampling.temperature = 0;
  for (float min_p : {0.0f, 0.3f}) {
    d.min_confidence = min_p;
    spec::DraftModelProposer proposer(*draft.model, d, pool);
    const auto [plain, fast] = both(target, prompt, greedy(96), &proposer, 6, pool);
    EXPECT_EQ(fast.ids, plain.ids) << "min_p " << min_p;
    EXPECT_GT(fast.timings.spec_accepted, 20u);  // a trained draft guesses code well
    EXPECT_LT(fast.timings.spec_passes, 80u);
  }
  spec::NgramProposer ngram(3);
  const auto [plain, fast] = both(target, prompt, greedy(96), &ngram, 8, pool);
  EXPECT_EQ(fast.ids, plain.ids);
}

// The draft's F16 matrices converted to Q8_0 at load (serve's and run's default, --draft-weights):
// the target's tokens all the same, and guesses nearly as good as the F16 draft's.
TEST(Spec, DraftConvertedToQ8_0AtLoadKeepsTheTokensAndItsGuesses) {
  Loaded target(test::shared_model("code/code-target-f16.gguf"));
  Loaded draft(test::shared_model("code/code-draft-f16.gguf"));
  ModelLoadOptions as_q8;
  as_q8.float_matrices_as = DType::Q8_0;
  const Model converted(draft.file, nullptr, as_q8);
  ThreadPool pool(2);
  const std::string code = test::read_file(test::shared_model("code/val.txt")).substr(12000, 900);
  const auto prompt = target.tokenizer->encode(code, true, false);
  spec::DraftOptions d;
  d.sampling.temperature = 0;
  d.min_confidence = spec::kDefaultDraftMinP;
  spec::DraftModelProposer f16_proposer(*draft.model, d, pool), q8_proposer(converted, d, pool);
  const auto [plain, with_f16] = both(target, prompt, greedy(128), &f16_proposer, 3, pool);
  const GenerateResult with_q8 = generate(*target.model, *target.tokenizer, prompt, [&] {
    GenerateOptions g = greedy(128);
    g.proposer = &q8_proposer;
    g.spec_tokens = 3;
    return g;
  }(), pool);
  EXPECT_EQ(with_q8.ids, plain.ids);
  EXPECT_EQ(with_f16.ids, plain.ids);
  EXPECT_GE(with_q8.timings.spec_accepted + 6, with_f16.timings.spec_accepted);
  EXPECT_GT(with_q8.timings.spec_accepted, 40u);
}

TEST(Spec, GreedyEqualsPlainOnStoriesAndRandomModelsOnEveryKernelPath) {
  test::TempDir dir;
  ThreadPool pool(2);
  write_synthetic_model(synthetic_preset("tiny"), DType::Q8_0, 1, dir.file("target.gguf"), pool);
  write_synthetic_model(synthetic_preset("tiny"), DType::F32, 2, dir.file("draft.gguf"), pool);
  std::vector<kernels::Isa> paths = {kernels::Isa::Scalar};
  if (static_cast<int>(kernels::best_isa()) >= static_cast<int>(kernels::Isa::Avx2)) paths.push_back(kernels::Isa::Avx2);
  if (static_cast<int>(kernels::best_isa()) >= static_cast<int>(kernels::Isa::Avx512)) paths.push_back(kernels::Isa::Avx512);
  if (kernels::best_isa() == kernels::Isa::Amx) paths.push_back(kernels::Isa::Amx);
  struct Restore {
    ~Restore() { kernels::set_isa(kernels::best_isa()); }
  } restore;
  for (const kernels::Isa isa : paths) {
    kernels::set_isa(isa);
    for (const auto& [target_path, draft_path] : {std::pair{test::shared_model("stories260K.gguf"), test::shared_model("stories260K.gguf")},
                                                  std::pair{dir.file("target.gguf"), dir.file("draft.gguf")}}) {
      Loaded target(target_path), draft(draft_path);
      spec::check_same_vocabulary(target.tokenizer->vocab(), draft.tokenizer->vocab());
      const auto prompt = target.tokenizer->encode("Once upon a time, there was a little dog. The dog", true, false);
      spec::DraftOptions d;
      d.sampling.temperature = 0;
      spec::DraftModelProposer proposer(*draft.model, d, pool);
      const auto [plain, fast] = both(target, prompt, greedy(60), &proposer, 5, pool);
      EXPECT_EQ(fast.ids, plain.ids) << target_path << " on " << kernels::kernel_table(isa).name;
      spec::NgramProposer ngram(2);
      const auto [plain2, fast2] = both(target, prompt, greedy(60), &ngram, 6, pool);
      EXPECT_EQ(fast2.ids, plain.ids) << target_path << " on " << kernels::kernel_table(isa).name;
      if (target_path == draft_path) {
        EXPECT_EQ(fast.timings.spec_accepted, fast.timings.spec_drafted);  // a model agrees with itself
      }
    }
  }
}

TEST(Spec, StopsAtEosAndAtTheTokenBudgetInsideAnAcceptedRun) {
  Loaded target(test::shared_model("stories260K.gguf"));
  ThreadPool pool(1);
  spec::DraftOptions d;
  d.sampling.temperature = 0;
  spec::DraftModelProposer proposer(*target.model, d, pool);
  const auto prompt = target.tokenizer->encode("Once upon a time", true, false);
  for (int n : {1, 2, 7, 13}) {
    const auto [plain, fast] = both(target, prompt, greedy(n), &proposer, 6, pool);
    EXPECT_EQ(fast.ids.size(), static_cast<std::size_t>(n));
    EXPECT_EQ(fast.ids, plain.ids);
  }
  GenerateOptions g = greedy(400);
  g.ignore_eos = false;  // stories end with EOS within 400 tokens? either way both must agree
  const auto [plain, fast] = both(target, prompt, g, &proposer, 6, pool);
  EXPECT_EQ(fast.ids, plain.ids);
  EXPECT_EQ(fast.finish_reason, plain.finish_reason);
}

// Sampling with speculation draws from the target's distribution. The second generated token's
// marginal, sum over x of p(x | prompt) p(y | prompt, x), is computed exactly from the target (every
// token of stories260K's 512 is possible at temperature 1 without filters); the tokens a
// speculating run produces there must fit it. The second token is the first one a verification
// pass decides. Drafts: a Q4_0 copy (close to the target), the same drawing at temperature 3 (a
// deliberately poor draft: q far flatter than p, mostly rejected), and n-gram lookup (point guesses).
// The target, its Q4_0 copy, the prompt and the exact marginal, computed once for the three modes.
struct SecondTokenMarginal {
  test::TempDir dir;
  ThreadPool pool{1};
  Loaded target{test::shared_model("stories260K.gguf")};
  std::unique_ptr<Loaded> close_draft;
  std::vector<std::int32_t> prompt;
  SamplingParams sp;
  std::vector<float> marginal;

  SecondTokenMarginal() {
    quantize_model(test::shared_model("stories260K.gguf"), dir.file("q4.gguf"), "Q4_0", pool);
    close_draft = std::make_unique<Loaded>(dir.file("q4.gguf"));
    const std::size_t n_vocab = target.model->config().n_vocab;
    // A prompt whose continuation repeats it, so that the n-gram proposer has guesses to make.
    prompt = target.tokenizer->encode("Tom had a ball. Tom had a ball. Tom had", true, false);
    sp.temperature = 1.0f;
    sp.top_k = 0;
    sp.top_p = 1.0f;
    sp.min_p = 0.0f;
    std::vector<float> logits, p1, p2;
    marginal.assign(n_vocab, 0.0f);
    KvCache cache = target.model->make_cache(64, KvType::F32);
    Batch batch;
    for (std::size_t i = 0; i < prompt.size(); ++i) batch.add(prompt[i], static_cast<std::int32_t>(i), 0, i + 1 == prompt.size());
    target.model->forward(batch, cache, pool, logits);
    Sampler s(sp);
    std::vector<std::int32_t> history = prompt;
    s.distribution(logits.data(), n_vocab, history, p1);
    for (std::size_t x = 0; x < n_vocab; ++x) {
      if (p1[x] == 0) continue;
      cache.set_length(0, prompt.size());
      batch.clear();
      batch.add(static_cast<std::int32_t>(x), static_cast<std::int32_t>(prompt.size()), 0, true);
      target.model->forward(batch, cache, pool, logits);
      history.push_back(static_cast<std::int32_t>(x));
      s.distribution(logits.data(), n_vocab, history, p2);
      history.pop_back();
      for (std::size_t y = 0; y < n_vocab; ++y) marginal[y] += p1[x] * p2[y];
    }
  }
};

const SecondTokenMarginal& second_token_marginal() {
  static const SecondTokenMarginal m;
  return m;
}

// Sampling with speculation draws from the target's distribution. The second generated token's
// marginal, sum over x of p(x | prompt) p(y | prompt, x), is computed exactly from the target (every
// token of stories260K's 512 is possible at temperature 1 without filters); the tokens a
// speculating run produces there must fit it. The second token is the first one a verification
// pass decides. Drafts: a Q4_0 copy (close to the target), the same drawing at temperature 3 (a
// deliberately poor draft: q far flatter than p, mostly rejected), and n-gram lookup (point guesses).
// One test per mode: each is thousands of generations, long under the sanitizers.
void expect_sampled_tokens_follow_the_target(const std::string& mode) {
  const SecondTokenMarginal& m = second_token_marginal();
  ThreadPool pool(1);
  const std::size_t n_vocab = m.target.model->config().n_vocab;
  constexpr int kRuns = test::kSanitized ? 1000 : 4000;
  std::vector<int> counts(n_vocab, 0);
  std::size_t drafted = 0, accepted = 0;
  for (int run = 0; run < kRuns; ++run) {
    GenerateOptions g;
    g.max_tokens = 6;  // room for guesses: a pass commits them and one more token
    g.ignore_eos = true;
    g.sampling = m.sp;
    g.sampling.seed = 1000 + static_cast<std::uint64_t>(run);
    g.spec_tokens = 4;
    g.ctx_size = 64;  // small caches: thousands of runs
    std::unique_ptr<spec::Proposer> proposer;
    if (mode == "ngram") {
      proposer = std::make_unique<spec::NgramProposer>(3);
    } else {
      spec::DraftOptions d;
      d.sampling = g.sampling;
      d.ctx = g.ctx_size;
      if (mode == "poor draft") d.sampling.temperature = 3.0f;  // q far flatter than p: most guesses fail
      if (mode == "tree" || mode == "wide tree") {
        // Token trees: siblings verified one after another against the residual. The wide tree offers
        // eight children a node with no probability floor, so most siblings are unlikely guesses and
        // most roots end in rejections and a draw from the residual.
        d.tree_width = mode == "tree" ? 2 : 8;
        d.tree_depth = 3;
        d.tree_min_p = mode == "tree" ? 0.05f : 0.0f;
        g.spec_tokens = mode == "tree" ? 6 : 16;
      }
      proposer = std::make_unique<spec::DraftModelProposer>(*m.close_draft->model, d, pool);
    }
    g.proposer = proposer.get();
    const GenerateResult r = generate(*m.target.model, *m.target.tokenizer, m.prompt, g, pool);
    ASSERT_EQ(r.ids.size(), 6u);
    ++counts[static_cast<std::size_t>(r.ids[1])];
    drafted += r.timings.spec_drafted;
    accepted += r.timings.spec_accepted;
  }
  EXPECT_TRUE(test::FitsDistribution(counts, m.marginal)) << mode;
  EXPECT_GT(drafted, static_cast<std::size_t>(kRuns) / 2) << mode;  // the verification pass really had guesses to judge
  EXPECT_GT(accepted, 0u) << mode;
}

TEST(Spec, SampledTokensFollowTheTargetsDistributionWithACloseDraft) { expect_sampled_tokens_follow_the_target("close draft"); }
TEST(Spec, SampledTokensFollowTheTargetsDistributionWithAPoorDraft) { expect_sampled_tokens_follow_the_target("poor draft"); }
TEST(Spec, SampledTokensFollowTheTargetsDistributionWithNgrams) { expect_sampled_tokens_follow_the_target("ngram"); }
TEST(TokenTree, SampledTokensFollowTheTargetsDistribution) { expect_sampled_tokens_follow_the_target("tree"); }
TEST(TokenTree, SampledTokensFollowTheTargetsDistributionWithAWideUnlikelyTree) { expect_sampled_tokens_follow_the_target("wide tree"); }

TEST(Spec, ADraftWithAnotherVocabularyIsRefusedNamingTheId) {
  Loaded target(test::shared_model("code/code-target-f16.gguf"));
  Loaded other(test::shared_model("stories260K.gguf"));
  try {
    spec::check_same_vocabulary(target.tokenizer->vocab(), other.tokenizer->vocab());
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("differs from the target's at id"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace promptly
