#include "sampling/sampler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <random>
#include <vector>

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

}  // namespace
}  // namespace promptly
