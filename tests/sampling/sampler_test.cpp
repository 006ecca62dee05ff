#include "sampling/sampler.h"

#include <gtest/gtest.h>

#include <map>
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

}  // namespace
}  // namespace promptly
