#include "sampling/sampler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <random>
#include <sstream>
#include <vector>

#include "../chi_square.h"

namespace promptly {
namespace {

TEST(Sampler, GreedyAtTemperatureZero) {
  SamplingParams p;
  p.temperature = 0;
  Sampler s(p);
  std::vector<float> logits = {0.1f, 3.0f, 2.9f, -1.0f};
  EXPECT_EQ(s.sample(logits.data(), logits.size(), {}), 1);
}

// The first of the largest values, wherever it sits (the vector lanes, the tail), as std::max_element.
TEST(Sampler, ArgmaxIsTheFirstLargest) {
  std::mt19937 rng(5);
  std::normal_distribution<float> dist;
  for (std::size_t n : {1u, 7u, 8u, 9u, 31000u, 32003u}) {
    std::vector<float> l(n);
    for (float& v : l) v = dist(rng);
    EXPECT_EQ(argmax(l.data(), n), std::max_element(l.begin(), l.end()) - l.begin()) << n;
    l[n - 1] = 100.0f;  // in the tail
    EXPECT_EQ(argmax(l.data(), n), static_cast<std::int32_t>(n - 1)) << n;
    l[n / 2] = 100.0f;  // a tie: the first wins
    EXPECT_EQ(argmax(l.data(), n), static_cast<std::int32_t>(n / 2)) << n;
  }
}

// The log-probabilities' normalizer against a double-precision reference, at awkward lengths and
// with logits spread far enough that some exponents underflow.
TEST(Sampler, LogSumExpMatchesDoubleReference) {
  std::mt19937 rng(9);
  for (float spread : {0.1f, 3.0f, 40.0f}) {
    std::normal_distribution<float> dist(0.0f, spread);
    for (std::size_t n : {1u, 3u, 5u, 33u, 32000u}) {
      std::vector<float> l(n);
      for (float& v : l) v = dist(rng);
      const double mx = *std::max_element(l.begin(), l.end());
      double sum = 0;
      for (float v : l) sum += std::exp(static_cast<double>(v) - mx);
      EXPECT_NEAR(log_sum_exp(l.data(), n), mx + std::log(sum), 1e-5) << n << " logits, spread " << spread;
    }
  }
}

TEST(Sampler, RepeatPenaltyChangesGreedyChoice) {
  SamplingParams p;
  p.temperature = 0;
  p.repeat_penalty = 1.5f;
  Sampler s(p);
  std::vector<float> logits = {0.1f, 3.0f, 2.9f, -1.0f};
  EXPECT_EQ(s.sample(logits.data(), logits.size(), {1}), 2);  // 3.0 / 1.5 = 2.0 < 2.9
}

TEST(Sampler, SameSeedSameTokens) {
  SamplingParams p;
  p.temperature = 1.0f;
  p.top_k = 0;
  p.top_p = 1.0f;
  p.min_p = 0.0f;
  p.seed = 1234;
  std::vector<std::int32_t> a, b;
  Sampler s1(p), s2(p);
  for (int i = 0; i < 50; ++i) {
    std::vector<float> l1 = {1, 2, 3, 4, 5}, l2 = l1;
    a.push_back(s1.sample(l1.data(), 5, {}));
    b.push_back(s2.sample(l2.data(), 5, {}));
  }
  EXPECT_EQ(a, b);
}

TEST(Sampler, TopKRestrictsAndFrequenciesFollowSoftmax) {
  SamplingParams p;
  p.temperature = 1.0f;
  p.top_k = 2;
  p.top_p = 1.0f;
  p.min_p = 0.0f;
  Sampler s(p);
  std::map<int, int> counts;
  const int n = 20000;
  for (int i = 0; i < n; ++i) {
    std::vector<float> l = {0.0f, std::log(3.0f), 0.0f, -5.0f};  // top-2: ids 1 (p=3/4) and 0 or 2
    counts[s.sample(l.data(), 4, {})]++;
  }
  EXPECT_EQ(counts[3], 0);
  EXPECT_EQ(counts[0] + counts[1] + counts[2], n);
  EXPECT_TRUE(counts[0] == 0 || counts[2] == 0);  // only one of the tied pair survives top-2
  EXPECT_NEAR(counts[1] / static_cast<double>(n), 0.75, 0.02);
}

TEST(Sampler, TopPAndMinPCut) {
  SamplingParams p;
  p.temperature = 1.0f;
  p.top_k = 0;
  p.top_p = 0.5f;
  p.min_p = 0.0f;
  Sampler s(p);
  for (int i = 0; i < 200; ++i) {
    std::vector<float> l = {5.0f, 0.0f, 0.0f, 0.0f};  // id 0 alone holds > 50%
    ASSERT_EQ(s.sample(l.data(), 4, {}), 0);
  }
  p.top_p = 1.0f;
  p.min_p = 0.5f;
  Sampler m(p);
  for (int i = 0; i < 200; ++i) {
    std::vector<float> l = {1.0f, 1.0f, -2.0f, -2.0f};  // ids 2, 3 are below half of the top probability
    const auto id = m.sample(l.data(), 4, {});
    ASSERT_TRUE(id == 0 || id == 1);
  }
}

TEST(Sampler, TemperatureSharpens) {
  SamplingParams p;
  p.top_k = 0;
  p.top_p = 1.0f;
  p.min_p = 0.0f;
  p.temperature = 0.1f;
  Sampler s(p);
  int top = 0;
  for (int i = 0; i < 1000; ++i) {
    std::vector<float> l = {1.0f, 0.5f};
    top += s.sample(l.data(), 2, {}) == 0;
  }
  EXPECT_GT(top, 975);  // p(top) = 1 / (1 + e^-5) ~ 0.9933
}

// The filters keep exactly what sorting the whole vocabulary and cutting it would keep (the
// sampler sorts only a head long enough for the cuts, grown as needed), and the draw follows the
// kept tokens' renormalized probabilities.
TEST(Sampler, FiltersKeepWhatAFullSortKeeps) {
  std::mt19937 rng(7);
  const std::size_t n_vocab = 3000;
  struct Case {
    int top_k;
    float top_p, min_p;
    float spread;  // of the logits: small is flat (long heads), large is peaked
  };
  for (const Case& c : {Case{0, 0.5f, 0.0f, 3.0f}, Case{0, 0.99f, 0.0f, 0.5f}, Case{0, 1.0f, 0.2f, 2.0f}, Case{0, 0.9f, 0.01f, 1.0f},
                        Case{50, 0.9f, 0.05f, 2.0f}, Case{0, 0.999f, 0.0f, 0.05f}}) {
    std::normal_distribution<float> dist(0.0f, c.spread);
    std::vector<float> logits(n_vocab);
    for (float& v : logits) v = dist(rng);
    // The reference: the whole vocabulary sorted (ties by id), then top-k, top-p, min-p.
    std::vector<std::int32_t> order(n_vocab);
    for (std::size_t i = 0; i < n_vocab; ++i) order[i] = static_cast<std::int32_t>(i);
    std::sort(order.begin(), order.end(), [&](std::int32_t a, std::int32_t b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); });
    std::size_t n = c.top_k > 0 ? static_cast<std::size_t>(c.top_k) : n_vocab;
    double z = 0;
    for (std::size_t i = 0; i < n; ++i) z += std::exp(static_cast<double>(logits[order[i]] - logits[order[0]]));
    const auto prob = [&](std::size_t i) { return std::exp(static_cast<double>(logits[order[i]] - logits[order[0]])) / z; };
    if (c.top_p < 1.0f) {
      double cum = 0;
      for (std::size_t i = 0; i < n; ++i) {
        if ((cum += prob(i)) >= c.top_p) {
          n = i + 1;
          break;
        }
      }
    }
    if (c.min_p > 0.0f) {
      std::size_t k = 1;
      while (k < n && prob(k) >= prob(0) * c.min_p) ++k;
      n = k;
    }
    std::vector<int> rank(n_vocab, -1);  // in the kept head
    for (std::size_t i = 0; i < n; ++i) rank[static_cast<std::size_t>(order[i])] = static_cast<int>(i);

    SamplingParams p;
    p.temperature = 1.0f;
    p.top_k = c.top_k;
    p.top_p = c.top_p;
    p.min_p = c.min_p;
    Sampler s(p);
    const int draws = 1500;
    int top = 0, deepest = 0;
    for (int d = 0; d < draws; ++d) {
      std::vector<float> l = logits;
      const std::int32_t id = s.sample(l.data(), n_vocab, {});
      ASSERT_GE(rank[static_cast<std::size_t>(id)], 0) << "token " << id << " is outside the kept " << n << " (case top_p " << c.top_p << ")";
      top += id == order[0];
      deepest = std::max(deepest, rank[static_cast<std::size_t>(id)]);
    }
    double kept = 0;
    for (std::size_t i = 0; i < n; ++i) kept += prob(i);
    EXPECT_NEAR(top / static_cast<double>(draws), prob(0) / kept, 0.04) << "kept " << n;
    if (n > 1000) {
      EXPECT_GT(deepest, 256) << "a long kept head is drawn from beyond the first 256";
    }
  }
}

using test::FitsDistribution;

struct ParamMix {
  const char* name;
  float temperature;
  int top_k;
  float top_p, min_p;
  float repeat_penalty = 1.0f, presence_penalty = 0.0f, frequency_penalty = 0.0f;
};

SamplingParams params_of(const ParamMix& m, std::uint64_t seed) {
  SamplingParams p;
  p.temperature = m.temperature;
  p.top_k = m.top_k;
  p.top_p = m.top_p;
  p.min_p = m.min_p;
  p.repeat_penalty = m.repeat_penalty;
  p.presence_penalty = m.presence_penalty;
  p.frequency_penalty = m.frequency_penalty;
  p.seed = seed;
  return p;
}

const ParamMix kMixes[] = {
    {"temperature only", 1.3f, 0, 1.0f, 0.0f},
    {"top-k", 1.0f, 7, 1.0f, 0.0f},
    {"top-p", 0.9f, 0, 0.8f, 0.0f},
    {"min-p", 1.0f, 0, 1.0f, 0.3f},
    {"defaults", 0.8f, 40, 0.95f, 0.05f},
    {"penalties and every filter", 1.1f, 20, 0.9f, 0.05f, 1.3f, 0.4f, 0.2f},
    {"penalties only", 1.0f, 0, 1.0f, 0.0f, 1.5f, 0.5f, 0.3f},
};

// What speculative decoding rests on: distribution() is the distribution sample() draws from, for
// every mix of settings. Its support is the set of tokens sample() returns (no token outside it is
// ever drawn; every token in it that 20000 draws should see ten times or more is drawn) and sample()'s
// frequencies pass a chi-square test against it. The penalties change the logits alike.
TEST(Sampler, DistributionIsWhatSampleDraws) {
  const std::size_t n_vocab = 32;
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> dist(-1.5f, 1.5f);
  std::vector<float> logits(n_vocab);
  for (float& v : logits) v = dist(rng);
  // Penalized tokens: repeated ones, and the best one, so that penalties change the order at the top.
  const std::int32_t best = argmax(logits.data(), n_vocab);
  const std::vector<std::int32_t> history = {3, 9, 9, best, 17, 3, 9, best, 30};
  for (const ParamMix& m : kMixes) {
    SCOPED_TRACE(m.name);
    Sampler s(params_of(m, 99));
    std::vector<float> lp = logits, ls = logits, probs;
    s.distribution(lp.data(), n_vocab, history, probs);
    s.sample(ls.data(), n_vocab, history);
    ASSERT_EQ(lp, ls) << "distribution() and sample() penalize the logits alike";
    ASSERT_EQ(probs.size(), n_vocab);
    double sum = 0;
    for (float q : probs) {
      ASSERT_GE(q, 0.0f);
      sum += q;
    }
    EXPECT_NEAR(sum, 1.0, 1e-6);

    const int draws = 20000;
    std::vector<int> counts(n_vocab, 0);
    for (int d = 0; d < draws; ++d) {
      std::vector<float> l = logits;
      ++counts[static_cast<std::size_t>(s.sample(l.data(), n_vocab, history))];
    }
    for (std::size_t i = 0; i < n_vocab; ++i) {
      if (probs[i] == 0) {
        EXPECT_EQ(counts[i], 0) << "token " << i << " is outside distribution()'s support";
      } else if (probs[i] * draws >= 10) {
        EXPECT_GT(counts[i], 0) << "token " << i << " has probability " << probs[i] << " and was never drawn";
      }
    }
    EXPECT_TRUE(FitsDistribution(counts, probs));
  }
}

// distribution() against an independent double-precision reference: the penalties, the whole
// vocabulary sorted (ties by id), top-k, then top-p and min-p on the temperature-1 probabilities of
// what top-k kept, then a softmax at the temperature over what is left, zeros elsewhere. At sizes
// from a toy vocabulary to Qwen's 152K, where the sampler sorts only a head of the vocabulary.
TEST(Sampler, DistributionMatchesFullSortReference) {
  std::mt19937 rng(3);
  for (const std::size_t n_vocab : {32u, 3000u, 152064u}) {
    for (const float spread : {0.5f, 3.0f}) {
      std::normal_distribution<float> dist(0.0f, spread);
      std::vector<float> logits(n_vocab);
      for (float& v : logits) v = dist(rng);
      std::vector<std::int32_t> history;
      for (int i = 0; i < 40; ++i) history.push_back(static_cast<std::int32_t>(rng() % std::min<std::size_t>(n_vocab, 50)));
      for (const ParamMix& m : kMixes) {
        SCOPED_TRACE(::testing::Message() << m.name << ", " << n_vocab << " tokens, spread " << spread);
        const SamplingParams params = params_of(m, 1);
        // The penalties, as documented (history is shorter than repeat_last_n).
        std::vector<double> l(logits.begin(), logits.end());
        std::map<std::int32_t, int> counts;
        for (std::int32_t t : history) ++counts[t];
        if (params.repeat_penalty != 1.0f || params.presence_penalty != 0.0f || params.frequency_penalty != 0.0f) {
          for (const auto& [id, count] : counts) {
            float v = logits[static_cast<std::size_t>(id)];
            v = v > 0 ? v / params.repeat_penalty : v * params.repeat_penalty;
            v -= static_cast<float>(count) * params.frequency_penalty + params.presence_penalty;
            l[static_cast<std::size_t>(id)] = v;
          }
        }
        std::vector<std::int32_t> order(n_vocab);
        for (std::size_t i = 0; i < n_vocab; ++i) order[i] = static_cast<std::int32_t>(i);
        std::sort(order.begin(), order.end(), [&](std::int32_t a, std::int32_t b) { return l[a] > l[b] || (l[a] == l[b] && a < b); });
        std::size_t n = params.top_k > 0 ? std::min<std::size_t>(n_vocab, static_cast<std::size_t>(params.top_k)) : n_vocab;
        double z = 0;
        for (std::size_t i = 0; i < n; ++i) z += std::exp(l[order[i]] - l[order[0]]);
        const auto prob = [&](std::size_t i) { return std::exp(l[order[i]] - l[order[0]]) / z; };
        if (params.top_p < 1.0f) {
          double cum = 0;
          for (std::size_t i = 0; i < n; ++i) {
            if ((cum += prob(i)) >= params.top_p) {
              n = i + 1;
              break;
            }
          }
        }
        if (params.min_p > 0.0f) {
          std::size_t k = 1;
          while (k < n && prob(k) >= prob(0) * params.min_p) ++k;
          n = k;
        }
        std::vector<double> expected(n_vocab, 0.0);
        double zt = 0;
        for (std::size_t i = 0; i < n; ++i) zt += std::exp((l[order[i]] - l[order[0]]) / params.temperature);
        for (std::size_t i = 0; i < n; ++i) expected[order[i]] = std::exp((l[order[i]] - l[order[0]]) / params.temperature) / zt;

        Sampler s(params);
        std::vector<float> work = logits, probs;
        s.distribution(work.data(), n_vocab, history, probs);
        ASSERT_EQ(probs.size(), n_vocab);
        std::size_t support = 0;
        for (std::size_t i = 0; i < n_vocab; ++i) {
          support += probs[i] > 0;
          ASSERT_NEAR(probs[i], expected[i], 1e-7 + 1e-5 * expected[i]) << "token " << i;
        }
        EXPECT_EQ(support, n);
      }
    }
  }
}

// Greedy: all the mass on the token sample() returns, the first of tied best logits, after the
// penalties.
TEST(Sampler, GreedyDistributionIsOneHotOnTheSampledToken) {
  SamplingParams p;
  p.temperature = 0;
  p.repeat_penalty = 1.5f;
  Sampler s(p);
  for (const auto& [logits, history] : std::vector<std::pair<std::vector<float>, std::vector<std::int32_t>>>{
           {{0.1f, 3.0f, 2.9f, -1.0f}, {}}, {{0.1f, 3.0f, 2.9f, -1.0f}, {1}}, {{0.5f, 2.0f, -1.0f, 2.0f, 2.0f}, {}}, {{2.0f, 2.0f, 1.0f}, {0}}}) {
    std::vector<float> lp = logits, ls = logits, probs;
    s.distribution(lp.data(), logits.size(), history, probs);
    const std::int32_t token = s.sample(ls.data(), logits.size(), history);
    std::vector<float> one_hot(logits.size(), 0.0f);
    one_hot[static_cast<std::size_t>(token)] = 1.0f;
    EXPECT_EQ(probs, one_hot) << "sample() returned " << token;
  }
}

// distribution() draws nothing: sample()'s tokens for a seed stay the same with calls in between.
TEST(Sampler, DistributionLeavesTheGeneratorAlone) {
  const SamplingParams p = params_of(kMixes[4], 77);
  Sampler a(p), b(p);
  std::vector<float> probs;
  for (int i = 0; i < 100; ++i) {
    std::vector<float> l1 = {1, 2, 3, 4, 5, 0.5f, 2.5f}, l2 = l1, l3 = l1;
    a.distribution(l1.data(), l1.size(), {}, probs);
    EXPECT_EQ(a.sample(l2.data(), l2.size(), {}), b.sample(l3.data(), l3.size(), {}));
  }
}

// draw() from unnormalized weights with zeros among them: zeros never come out, frequencies follow
// the weights; with no positive weight, 0. draw(distribution()) then samples as sample() does.
TEST(Sampler, DrawFollowsTheWeights) {
  Sampler s(SamplingParams{});
  std::vector<float> w(40);
  for (std::size_t i = 0; i < w.size(); ++i) w[i] = i % 5 == 3 ? 0.0f : static_cast<float>(1 + (i * 7) % 11) * 0.37f;
  std::vector<int> counts(w.size(), 0);
  for (int d = 0; d < 20000; ++d) ++counts[static_cast<std::size_t>(s.draw(w))];
  EXPECT_TRUE(FitsDistribution(counts, w));
  EXPECT_EQ(s.draw(std::vector<float>(10, 0.0f)), 0);
  EXPECT_EQ(s.draw({0.0f, 0.0f, 2.0f}), 2);
  EXPECT_EQ(s.draw({0.0f, 3.0f, 0.0f}), 1);

  // The defaults (top-k, top-p and min-p all cutting) at a vocabulary of 32.
  std::vector<float> logits(32), probs;
  for (std::size_t i = 0; i < logits.size(); ++i) logits[i] = std::sin(static_cast<float>(i)) * 2.0f;
  std::vector<float> l = logits;
  s.distribution(l.data(), l.size(), {}, probs);
  counts.assign(logits.size(), 0);
  for (int d = 0; d < 20000; ++d) ++counts[static_cast<std::size_t>(s.draw(probs))];
  EXPECT_TRUE(FitsDistribution(counts, probs));
}

// next_uniform() is the uniform the next draw takes, and skip_uniform() moves past it as that draw
// would: a device that draws with it (backend/device_draw.h) leaves the generator where the host's
// own draw would have.
TEST(Sampler, NextUniformIsWhatTheNextDrawTakes) {
  Sampler peeked(SamplingParams{}), drawn(SamplingParams{});
  const std::vector<float> equal(1000, 1.0f);  // token floor(u * 1000): the sums are exact
  for (int i = 0; i < 200; ++i) {
    const double u = peeked.next_uniform();
    ASSERT_GE(u, 0.0);
    ASSERT_LT(u, 1.0);
    EXPECT_EQ(peeked.next_uniform(), u);  // peeking takes nothing
    EXPECT_EQ(drawn.draw(equal), static_cast<std::int32_t>(u * 1000));
    peeked.skip_uniform();
  }
  std::vector<float> l1 = {1, 2, 3, 4, 5, 0.5f, 2.5f}, l2 = l1;
  EXPECT_EQ(peeked.sample(l1.data(), l1.size(), {}), drawn.sample(l2.data(), l2.size(), {}));
}

}  // namespace
}  // namespace promptly
