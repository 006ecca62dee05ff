#include "quality/perplexity.h"

#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <iterator>

#include "convert/quantize.h"
#include "gguf/gguf.h"
#include "quality/logits_file.h"
#include "../test_util.h"
#include "util/error.h"

namespace promptly::quality {
namespace {

// BOS followed by stories260K's greedy continuation: 201 real tokens the model predicts well.
std::vector<std::int32_t> story_tokens() {
  std::ifstream in(test::shared_model("testvectors/stories260K.greedy200.ids"));
  std::vector<std::int32_t> ids{1};
  for (std::int32_t id; in >> id;) ids.push_back(id);
  return ids;
}

struct Stories {
  std::shared_ptr<const gguf::File> file = gguf::File::open(test::shared_model("stories260K.gguf"));
  Model model{file};
};

TEST(Perplexity, MatchesAFloat64ReferenceComputedTokenByToken) {
  Stories s;
  ThreadPool pool(2);
  const std::vector<std::int32_t> tokens = story_tokens();
  PerplexityOptions o;
  o.ctx = 64;
  o.kv_type = KvType::F32;
  PerplexityRun run;
  run.model = &s.model;
  const PerplexityResult r = evaluate_perplexity(run, tokens, 1, o, pool);
  ASSERT_EQ(r.plan.n_chunks, 3u);
  EXPECT_EQ(r.nll.count, 3u * 31u);

  // The reference: each chunk from BOS one token at a time, log-softmax and sums in double.
  double sum = 0, sum2 = 0;
  std::size_t n = 0;
  const std::size_t n_vocab = s.model.config().n_vocab;
  for (std::size_t c = 0; c < 3; ++c) {
    KvCache cache = s.model.make_cache(64, KvType::F32);
    std::vector<float> logits;
    for (std::size_t p = 0; p + 1 < 64; ++p) {
      Batch b;
      b.add(p == 0 ? 1 : tokens[c * 64 + p], static_cast<std::int32_t>(p), 0, true);
      s.model.forward(b, cache, pool, logits);
      if (p < 32) continue;
      double mx = logits[0];
      for (std::size_t i = 1; i < n_vocab; ++i) mx = std::max(mx, static_cast<double>(logits[i]));
      double z = 0;
      for (std::size_t i = 0; i < n_vocab; ++i) z += std::exp(static_cast<double>(logits[i]) - mx);
      const double nll = -(static_cast<double>(logits[tokens[c * 64 + p + 1]]) - mx - std::log(z));
      sum += nll;
      sum2 += nll * nll;
      ++n;
    }
  }
  ASSERT_EQ(n, r.nll.count);
  const double mean = sum / n, ppl = std::exp(mean);
  const double err = std::sqrt((sum2 / n - mean * mean) / (n - 1)) * ppl;
  EXPECT_NEAR(r.ppl(), ppl, 1e-4 * ppl);
  EXPECT_NEAR(r.ppl_stderr(), err, 1e-3 * err);
  EXPECT_GT(r.ppl(), 1.0);
  EXPECT_LT(r.ppl(), 10.0);  // a trained model on its own greedy text
  ASSERT_EQ(r.running_ppl.size(), 3u);
  EXPECT_DOUBLE_EQ(r.running_ppl.back(), r.ppl());

  // Several chunks side by side in one pass, or a chunk in several passes: the same figures.
  o.batch = 128;
  EXPECT_NEAR(evaluate_perplexity(run, tokens, 1, o, pool).ppl(), r.ppl(), 1e-5 * ppl);
  o.batch = 20;
  EXPECT_NEAR(evaluate_perplexity(run, tokens, 1, o, pool).ppl(), r.ppl(), 1e-5 * ppl);
  o.batch = 100;
  EXPECT_THROW(evaluate_perplexity(run, tokens, 1, o, pool), Error);  // above ctx, not a multiple
}

TEST(Perplexity, ChunkingEdgeCasesAreClearErrors) {
  try {
    plan_chunks(100, 512, -1, 2048);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("only 100 tokens"), std::string::npos) << e.what();
  }
  try {
    plan_chunks(100000, 4096, -1, 2048);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("model's context of 2048"), std::string::npos) << e.what();
  }
  EXPECT_THROW(plan_chunks(1000, 2, -1, 2048), Error);
  EXPECT_THROW(plan_chunks(1000, 64, 0, 2048), Error);
  const ChunkPlan p = plan_chunks(1000, 64, 5, 2048);
  EXPECT_EQ(p.n_chunks, 5u);
  EXPECT_EQ(p.first, 32u);
  EXPECT_EQ(p.scored_per_chunk(), 31u);
  EXPECT_EQ(plan_chunks(1000, 64, -1, 2048).n_chunks, 15u);
}

TEST(Perplexity, KlOfAModelAgainstItselfIsZeroAndAgainstQ8_0SmallAndPositive) {
  Stories s;
  ThreadPool pool(2);
  const std::vector<std::int32_t> tokens = story_tokens();
  PerplexityOptions o;
  o.ctx = 64;
  PerplexityRun run;
  run.model = &s.model;
  run.reference = &s.model;
  const PerplexityResult self = evaluate_perplexity(run, tokens, 1, o, pool);
  ASSERT_TRUE(self.kl);
  EXPECT_EQ(self.kl->kld.mean(), 0.0);
  EXPECT_EQ(self.kl->same_top, self.nll.count);
  EXPECT_EQ(self.kl->top_p_drop_values.back(), 0.0f);

  // Saved top-k against the same model: zero too; against a Q8_0 copy: small and positive.
  test::TempDir dir;
  run.reference = nullptr;
  run.save_logits_path = dir.file("ref.logits");
  o.top_k = 16;
  const PerplexityResult saved = evaluate_perplexity(run, tokens, 1, o, pool);
  const LogitsFile base = LogitsFile::load(dir.file("ref.logits"));
  EXPECT_EQ(base.n_records(), saved.nll.count);
  PerplexityRun from_file;
  from_file.model = &s.model;
  from_file.reference_file = &base;
  const PerplexityResult self_file = evaluate_perplexity(from_file, tokens, 1, o, pool);
  EXPECT_NEAR(self_file.kl->kld.mean(), 0.0, 1e-6);
  EXPECT_EQ(self_file.kl->same_top, self_file.nll.count);
  EXPECT_NEAR(std::exp(self_file.kl->ref_nll.mean()), saved.ppl(), 1e-4 * saved.ppl());
  // Without -f the file's own chunks are used.
  EXPECT_NEAR(evaluate_perplexity(from_file, {}, 1, o, pool).ppl(), saved.ppl(), 1e-9);

  quantize_model(test::shared_model("stories260K.gguf"), dir.file("q8.gguf"), "Q8_0", pool);
  auto qfile = gguf::File::open(dir.file("q8.gguf"));
  Model q8(qfile);
  PerplexityRun cand;
  cand.model = &q8;
  cand.reference = &s.model;
  const PerplexityResult q = evaluate_perplexity(cand, tokens, 1, o, pool);
  EXPECT_GT(q.kl->kld.mean(), 0.0);
  EXPECT_LT(q.kl->kld.mean(), 0.01);
  EXPECT_GT(static_cast<double>(q.kl->same_top) / q.nll.count, 0.95);
  from_file.model = &q8;
  const PerplexityResult q_file = evaluate_perplexity(from_file, tokens, 1, o, pool);
  EXPECT_GT(q_file.kl->kld.mean(), 0.0);
  EXPECT_LE(q_file.kl->kld.mean(), q.kl->kld.mean() * 1.05);  // the lumped tail bounds the full KL from below

  // A different text is refused rather than compared.
  std::vector<std::int32_t> other = tokens;
  other[70] = other[70] == 5 ? 6 : 5;
  EXPECT_THROW(evaluate_perplexity(from_file, other, 1, o, pool), Error);
}

TEST(LogitsFile, CorruptOrTruncatedFilesAreRefused) {
  Stories s;
  ThreadPool pool(2);
  test::TempDir dir;
  PerplexityOptions o;
  o.ctx = 64;
  o.top_k = 8;
  PerplexityRun run;
  run.model = &s.model;
  run.save_logits_path = dir.file("ref.logits");
  evaluate_perplexity(run, story_tokens(), 1, o, pool);
  std::string bytes;
  {
    std::ifstream in(dir.file("ref.logits"), std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  auto write = [&](const std::string& b) {
    std::ofstream(dir.file("bad.logits"), std::ios::binary) << b;
    return dir.file("bad.logits");
  };
  EXPECT_NO_THROW(LogitsFile::load(write(bytes)));
  EXPECT_THROW(LogitsFile::load(write(bytes.substr(0, bytes.size() - 9))), Error);
  std::string flipped = bytes;
  flipped[bytes.size() / 2] ^= 0x40;
  EXPECT_THROW(LogitsFile::load(write(flipped)), Error);
  EXPECT_THROW(LogitsFile::load(write("not a logits file at all")), Error);
  EXPECT_THROW(LogitsFile::load(dir.file("missing.logits")), Error);
}

}  // namespace
}  // namespace promptly::quality
