#include "spec/rejection.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <sstream>
#include <utility>
#include <vector>

#include "../chi_square.h"

namespace promptly::spec {
namespace {

// Every test checks the one property that matters: whatever the guesses, the tokens that come out
// are distributed as the target's p. They draw the guesses as a proposer would, verify them
// 20000 times and compare the frequencies with p by a chi-square test; the seeds are fixed.

constexpr int kTrials = 20000;

using test::FitsDistribution;

// The proposer's own randomness, separate from the verifier's generator.
class Proposer {
 public:
  explicit Proposer(std::uint64_t seed) : rng_(seed) {}
  // A token drawn from the distribution q (inverse CDF in double).
  std::int32_t draw(const std::vector<float>& q) {
    double total = 0;
    for (float v : q) total += v;
    const double u = static_cast<double>(rng_() >> 11) * 0x1.0p-53 * total;
    double cum = 0;
    for (std::size_t i = 0; i < q.size(); ++i) {
      cum += q[i];
      if (u < cum) return static_cast<std::int32_t>(i);
    }
    for (std::size_t i = q.size(); i-- > 0;) {
      if (q[i] > 0) return static_cast<std::int32_t>(i);
    }
    return 0;
  }

 private:
  std::mt19937_64 rng_;
};

std::vector<float> normalized(std::vector<double> w) {
  double total = 0;
  for (double v : w) total += v;
  std::vector<float> out(w.size());
  for (std::size_t i = 0; i < w.size(); ++i) out[i] = static_cast<float>(w[i] / total);
  return out;
}

// The target: a softmax over 37 tokens (not a multiple of the four or sixteen the passes over the
// vocabulary take at a time, so their remainders run too), with two tokens filtered out
// (probability 0), as top-k or min-p leave them.
std::vector<float> target() {
  std::vector<double> w(37);
  for (std::size_t i = 0; i < w.size(); ++i) w[i] = std::exp(1.6 * std::sin(0.7 * static_cast<double>(i) + 0.3));
  w[5] = w[20] = 0;
  return normalized(w);
}

// Draft distributions against that target: poor (all its mass on the tokens p finds least likely,
// most of it on the two p rules out, none on the likely half), close (p at another temperature,
// mass on every token) and identical.
std::vector<std::pair<const char*, std::vector<float>>> drafts(const std::vector<float>& p) {
  std::vector<double> poor(p.size()), close(p.size());
  std::vector<float> sorted = p;
  std::sort(sorted.begin(), sorted.end());
  const float median = sorted[sorted.size() / 2];
  for (std::size_t i = 0; i < p.size(); ++i) {
    poor[i] = p[i] < median ? 1.0 / (p[i] + 0.01) : 0.0;
    close[i] = std::pow(p[i] + 1e-3, 0.7);
  }
  return {{"poor draft", normalized(poor)}, {"close draft", normalized(close)}, {"draft equal to the target", p}};
}

double overlap(const std::vector<float>& p, const std::vector<float>& q) {
  double s = 0;
  for (std::size_t i = 0; i < p.size(); ++i) s += std::min(p[i], q[i]);
  return std::min(s, 1.0);  // float probabilities may sum a hair above 1
}

// Five standard deviations of a frequency over kTrials draws with probability `rate`.
double tolerance(double rate) { return 5 * std::sqrt(rate * (1 - rate) / kTrials) + 1e-6; }

// A guess drawn from q and checked against p: the output follows p, and the guess is kept at the
// rate sum min(p, q) that the method promises (within five standard deviations).
TEST(Rejection, DraftTokenOutputFollowsTheTarget) {
  const std::vector<float> p = target();
  for (const auto& [name, q] : drafts(p)) {
    SCOPED_TRACE(name);
    Proposer proposer(1);
    std::mt19937_64 rng(2);
    std::vector<int> counts(p.size(), 0);
    int accepted = 0;
    for (int t = 0; t < kTrials; ++t) {
      const std::int32_t guess = proposer.draw(q);
      const Verdict v = verify_draft_token(p.data(), q.data(), p.size(), guess, rng);
      ASSERT_EQ(v.accepted, v.token == guess) << "a replacement is never the rejected guess";
      accepted += v.accepted;
      ++counts[static_cast<std::size_t>(v.token)];
    }
    EXPECT_TRUE(FitsDistribution(counts, p));
    const double rate = overlap(p, q);
    EXPECT_NEAR(accepted / static_cast<double>(kTrials), rate, tolerance(rate));
  }
}

// A one-hot q makes verify_draft_token the point proposal, draw for draw.
TEST(Rejection, OneHotDraftIsThePointProposal) {
  const std::vector<float> p = target();
  std::mt19937_64 a(5), b(5);
  for (int t = 0; t < 2000; ++t) {
    const auto guess = static_cast<std::int32_t>(t % p.size());
    std::vector<float> q(p.size(), 0.0f);
    q[static_cast<std::size_t>(guess)] = 1.0f;
    const Verdict general = verify_draft_token(p.data(), q.data(), p.size(), guess, a);
    const Verdict point = verify_point_proposal(p.data(), p.size(), guess, b);
    ASSERT_EQ(general.accepted, point.accepted) << t;
    ASSERT_EQ(general.token, point.token) << t;
  }
}

// A deterministic guess (an n-gram match, a greedy draft's token) is kept with probability p(guess)
// and the output follows p, whether the guess is the likeliest token, an unlikely one or one p rules
// out.
TEST(Rejection, PointProposalOutputFollowsTheTarget) {
  const std::vector<float> p = target();
  const auto likeliest = static_cast<std::int32_t>(std::max_element(p.begin(), p.end()) - p.begin());
  const auto unlikely = static_cast<std::int32_t>(std::min_element(p.begin(), p.end(), [](float x, float y) { return x > 0 && (y == 0 || x < y); }) - p.begin());
  for (const std::int32_t guess : {likeliest, unlikely, std::int32_t{5}}) {
    SCOPED_TRACE(::testing::Message() << "guess " << guess << ", p " << p[static_cast<std::size_t>(guess)]);
    std::mt19937_64 rng(8);
    std::vector<int> counts(p.size(), 0);
    int accepted = 0;
    for (int t = 0; t < kTrials; ++t) {
      const Verdict v = verify_point_proposal(p.data(), p.size(), guess, rng);
      ASSERT_EQ(v.accepted, v.token == guess);
      accepted += v.accepted;
      ++counts[static_cast<std::size_t>(v.token)];
    }
    EXPECT_TRUE(FitsDistribution(counts, p));
    const double rate = p[static_cast<std::size_t>(guess)];
    EXPECT_NEAR(accepted / static_cast<double>(kTrials), rate, tolerance(rate));
  }
}

// Where rounding leaves p <= q everywhere (here p sums to less than 1), a rejection has no residual
// to draw from and draws from p; a draw of the guess itself counts as its acceptance.
TEST(Rejection, EmptyResidualFallsBackToTheTarget) {
  const std::vector<float> p = {0.25f, 0.5f}, q = {0.5f, 0.5f};
  std::mt19937_64 rng(4);
  int zeros = 0;
  for (int t = 0; t < 2000; ++t) {
    const Verdict v = verify_draft_token(p.data(), q.data(), 2, 0, rng);
    ASSERT_EQ(v.accepted, v.token == 0);
    zeros += v.token == 0;
  }
  EXPECT_NEAR(zeros / 2000.0, 0.5 + 0.5 / 3, 0.05);  // kept half the time, else 1/3 from p
}

// Sibling guesses drawn independently from draft distributions (one draft model sampled three
// times, or two draft models), verified by recursive rejection: the output follows p, and a
// replacement is never one of the candidates.
TEST(Rejection, IndependentSiblingsFollowTheTarget) {
  const std::vector<float> base = target();
  const auto ds = drafts(base);
  const std::vector<float>& poor = ds[0].second;
  const std::vector<float>& close = ds[1].second;
  const std::vector<std::pair<const char*, std::vector<const std::vector<float>*>>> setups = {
      {"three from the poor draft", {&poor, &poor, &poor}},
      {"two from the close draft", {&close, &close}},
      {"two draft models", {&poor, &close, &poor}},
  };
  for (const auto& [name, qs] : setups) {
    SCOPED_TRACE(name);
    Proposer proposer(3);
    std::mt19937_64 rng(4);
    std::vector<int> counts(base.size(), 0), accepted_at(qs.size() + 1, 0);
    std::vector<float> p;
    std::vector<std::pair<std::int32_t, const float*>> candidates;
    for (int t = 0; t < kTrials; ++t) {
      candidates.clear();
      for (const std::vector<float>* q : qs) candidates.emplace_back(proposer.draw(*q), q->data());
      p = base;
      const MultiVerdict v = verify_siblings(p, candidates, p.size(), rng);
      if (v.accepted_index >= 0) {
        ASSERT_EQ(v.token, candidates[static_cast<std::size_t>(v.accepted_index)].first);
      } else {
        for (const auto& c : candidates) ASSERT_NE(v.token, c.first);
      }
      ++accepted_at[static_cast<std::size_t>(v.accepted_index + 1)];
      ++counts[static_cast<std::size_t>(v.token)];
    }
    EXPECT_TRUE(FitsDistribution(counts, base));
    // The first candidate alone is verify_draft_token: kept at the rate sum min(p, q).
    const double rate = overlap(base, *qs[0]);
    EXPECT_NEAR(accepted_at[1] / static_cast<double>(kTrials), rate, tolerance(rate));
  }
}

// Candidates drawn from q without replacement (a small vocabulary, so repeats would be common).
// Candidate i's distribution, given the ones before it, is q without them, renormalized. Verified
// against those conditional distributions, as verify_siblings asks, the output follows p. Verified
// against the unconditional q each time, it does not: for p = (0.6, 0.4, 0) and q uniform it gives
// the first token with probability 0.567, which the chi-square test sees (this also shows that the
// test can tell).
TEST(Rejection, SiblingsWithoutReplacementNeedTheConditionalDraft) {
  struct Setup {
    std::vector<float> p, q;
    std::size_t siblings;
  };
  const std::vector<float> base = target();
  for (const Setup& s : {Setup{{0.6f, 0.4f, 0.0f}, {1 / 3.0f, 1 / 3.0f, 1 / 3.0f}, 2}, Setup{base, drafts(base)[0].second, 3}}) {
    SCOPED_TRACE(::testing::Message() << s.siblings << " siblings over " << s.p.size() << " tokens");
    for (const bool conditional : {true, false}) {
      Proposer proposer(6);
      std::mt19937_64 rng(7);
      std::vector<int> counts(s.p.size(), 0);
      std::vector<std::vector<float>> qs(s.siblings);
      std::vector<float> p;
      std::vector<std::pair<std::int32_t, const float*>> candidates;
      for (int t = 0; t < kTrials; ++t) {
        candidates.clear();
        std::vector<double> left(s.q.begin(), s.q.end());
        for (std::size_t i = 0; i < s.siblings; ++i) {
          qs[i] = normalized(left);
          const std::int32_t x = proposer.draw(qs[i]);
          candidates.emplace_back(x, conditional ? qs[i].data() : s.q.data());
          left[static_cast<std::size_t>(x)] = 0;
        }
        p = s.p;
        const MultiVerdict v = verify_siblings(p, candidates, p.size(), rng);
        ++counts[static_cast<std::size_t>(v.token)];
      }
      if (conditional) {
        EXPECT_TRUE(FitsDistribution(counts, s.p)) << "with the conditional draft distributions";
      } else if (s.p.size() == 3) {
        EXPECT_FALSE(FitsDistribution(counts, s.p)) << "with the unconditional draft distribution";
        EXPECT_NEAR(counts[0] / static_cast<double>(kTrials), 0.5 + 0.2 / 3, 0.015);
      }
    }
  }
}

// Deterministic siblings (an n-gram table's top continuations): candidate i is kept with
// probability p(x_i) when they are distinct, and the output follows p, also with a candidate p rules
// out and with a repeat.
TEST(Rejection, PointSiblingsFollowTheTarget) {
  const std::vector<float> base = target();
  std::vector<std::int32_t> by_p(base.size());
  for (std::size_t i = 0; i < by_p.size(); ++i) by_p[i] = static_cast<std::int32_t>(i);
  std::sort(by_p.begin(), by_p.end(), [&](std::int32_t a, std::int32_t b) { return base[a] > base[b]; });
  for (const std::vector<std::int32_t>& tokens : std::vector<std::vector<std::int32_t>>{
           {by_p[0], by_p[1], by_p[2]}, {by_p[20], by_p[3]}, {5, by_p[1], by_p[10]}, {by_p[1], by_p[1], by_p[0]}}) {
    SCOPED_TRACE(::testing::Message() << "candidates " << ::testing::PrintToString(tokens));
    std::mt19937_64 rng(9);
    std::vector<int> counts(base.size(), 0), accepted_at(tokens.size() + 1, 0);
    std::vector<float> p;
    for (int t = 0; t < kTrials; ++t) {
      p = base;
      const MultiVerdict v = verify_point_siblings(p, tokens, p.size(), rng);
      if (v.accepted_index >= 0) {
        ASSERT_EQ(v.token, tokens[static_cast<std::size_t>(v.accepted_index)]);
      } else {
        for (const std::int32_t x : tokens) ASSERT_NE(v.token, x);
      }
      ++accepted_at[static_cast<std::size_t>(v.accepted_index + 1)];
      ++counts[static_cast<std::size_t>(v.token)];
    }
    EXPECT_TRUE(FitsDistribution(counts, base));
    for (std::size_t i = 0; i < tokens.size(); ++i) {
      const bool repeat = std::find(tokens.begin(), tokens.begin() + static_cast<std::ptrdiff_t>(i), tokens[i]) != tokens.begin() + static_cast<std::ptrdiff_t>(i);
      const double rate = repeat ? 0.0 : base[static_cast<std::size_t>(tokens[i])];
      EXPECT_NEAR(accepted_at[i + 1] / static_cast<double>(kTrials), rate, tolerance(rate)) << "candidate " << i;
    }
  }
}

// A vocabulary of Qwen's size (less one, for the remainders), where the sums must run in double: p
// and q from softmaxes of random logits, the output's top tokens follow p and every token comes out
// in range.
TEST(Rejection, LargeVocabulary) {
  const std::size_t n = 152063;
  std::mt19937 gen(12);
  std::normal_distribution<double> dist(0.0, 2.0);
  std::vector<double> wp(n), wq(n);
  for (std::size_t i = 0; i < n; ++i) {
    const double l = dist(gen);
    wp[i] = std::exp(l + (i < 8 ? 9.0 : 0.0));  // eight tokens hold about half the mass
    wq[i] = std::exp(0.5 * l + dist(gen) + (i < 8 ? 8.0 : 0.0));
  }
  const std::vector<float> p = normalized(wp), q = normalized(wq);
  std::vector<double> cdf(n);
  double cum = 0;
  for (std::size_t i = 0; i < n; ++i) cdf[i] = cum += q[i];
  std::mt19937_64 proposer_rng(13), rng(14);
  const auto propose = [&] {
    const double u = static_cast<double>(proposer_rng() >> 11) * 0x1.0p-53 * cum;
    return static_cast<std::int32_t>(std::min<std::ptrdiff_t>(std::upper_bound(cdf.begin(), cdf.end(), u) - cdf.begin(), static_cast<std::ptrdiff_t>(n) - 1));
  };
  std::vector<int> counts(9, 0);  // the eight top tokens, then the rest pooled
  std::vector<float> expected(9, 0.0f), work;
  for (std::size_t i = 0; i < n; ++i) expected[std::min<std::size_t>(i, 8)] += p[i];
  const int trials = 3000;
  for (int t = 0; t < trials; ++t) {
    const std::int32_t guess = propose();
    work = p;
    const MultiVerdict v = t % 2 ? verify_siblings(work, {{guess, q.data()}, {propose(), q.data()}}, n, rng)
                                 : MultiVerdict{0, verify_draft_token(p.data(), q.data(), n, guess, rng).token};
    ASSERT_GE(v.token, 0);
    ASSERT_LT(static_cast<std::size_t>(v.token), n);
    ++counts[std::min<std::size_t>(static_cast<std::size_t>(v.token), 8)];
  }
  EXPECT_TRUE(FitsDistribution(counts, expected));
}

}  // namespace
}  // namespace promptly::spec
