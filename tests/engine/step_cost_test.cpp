// The step cost model: it learns a machine's step times from observations, resists stalls, and
// sizes chunks consistently with its own predictions.
#include "engine/step_cost.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

namespace promptly {
namespace {

// A machine whose steps cost 8 ms + 2 ms a token + 0.6 us per attended position, with 5% noise.
struct Machine {
  double fixed = 0.008, per_token = 0.002, per_attended = 0.6e-6;
  std::mt19937 rng{3};
  double time(double tokens, double attended) {
    std::normal_distribution<double> noise(1.0, 0.05);
    return (fixed + per_token * tokens + per_attended * attended) * noise(rng);
  }
};

// A mix of what a serving engine runs: decode batches, prefill chunks at various depths.
void feed(StepCostModel& model, Machine& m, int steps) {
  std::mt19937 rng(7);
  for (int i = 0; i < steps; ++i) {
    const std::size_t tokens = std::uniform_int_distribution<std::size_t>(1, 64)(rng);
    const std::size_t start = std::uniform_int_distribution<std::size_t>(0, 3000)(rng);
    const double attended = StepCostModel::attended_by(start, tokens);
    model.observe(static_cast<double>(tokens), attended, m.time(static_cast<double>(tokens), attended));
  }
}

TEST(StepCost, LearnsTheMachineFromAWrongPrior) {
  Machine m;
  StepCostModel model(0.004, 0.004, 0.1e-6);  // fixed and per-token 2x off, attention 6x off
  feed(model, m, 400);
  for (auto [tokens, start] : {std::pair{1.0, 100.0}, {8.0, 2000.0}, {40.0, 0.0}, {40.0, 3000.0}}) {
    const double attended = StepCostModel::attended_by(static_cast<std::size_t>(start), static_cast<std::size_t>(tokens));
    const double truth = m.fixed + m.per_token * tokens + m.per_attended * attended;
    EXPECT_NEAR(model.predict(tokens, attended), truth, 0.08 * truth) << tokens << " tokens at " << start;
  }
}

TEST(StepCost, FollowsAHostThatSlowsDown) {
  Machine m;
  StepCostModel model(m.fixed, m.per_token, m.per_attended);
  feed(model, m, 100);
  m.fixed *= 1.5;
  m.per_token *= 1.5;
  m.per_attended *= 1.5;
  feed(model, m, 200);
  const double truth = m.fixed + m.per_token * 40;
  EXPECT_NEAR(model.predict(40, 0), truth, 0.1 * truth);
}

TEST(StepCost, OneStallMovesThePredictionLittle) {
  Machine m;
  StepCostModel model(m.fixed, m.per_token, m.per_attended);
  feed(model, m, 200);
  const double before = model.predict(40, 0);
  model.observe(40, 0, 10 * before);  // the machine stalled for a moment
  EXPECT_LT(model.predict(40, 0), 1.3 * before);
  EXPECT_GT(model.predict(40, 0), before);
}

TEST(StepCost, TokensWithinIsTheLargestChunkThatFits) {
  const StepCostModel model(0.008, 0.002, 0.6e-6);
  for (double seconds : {0.005, 0.05, 0.1, 0.5}) {
    for (std::size_t start : {0u, 1000u, 4000u}) {
      const std::size_t k = model.tokens_within(seconds, 4, 1000, start, 512);
      auto cost = [&](std::size_t n) { return model.predict(4.0 + static_cast<double>(n), 1000 + StepCostModel::attended_by(start, n)); };
      if (k > 0) {
        EXPECT_LE(cost(k), seconds);
      }
      if (k < 512) {
        EXPECT_GT(cost(k + 1), seconds);
      }
    }
  }
  EXPECT_EQ(model.tokens_within(10, 0, 0, 0, 37), 37u);  // capped by the tokens asked for
}

TEST(StepCost, AttendedCountsEveryPositionATokenReads) {
  EXPECT_EQ(StepCostModel::attended_by(0, 1), 1);
  EXPECT_EQ(StepCostModel::attended_by(0, 3), 1 + 2 + 3);
  EXPECT_EQ(StepCostModel::attended_by(10, 2), 11 + 12);
  // A batch's positions (a decode token at 500, a chunk at 10..11) count the same way.
  EXPECT_EQ(StepCostModel::attended_by(std::vector<std::int32_t>{500, 10, 11}), StepCostModel::attended_by(500, 1) + StepCostModel::attended_by(10, 2));
}

TEST(StepOverrun, IsThe99thPercentileOfActualOverPredicted) {
  StepOverrun overrun;
  EXPECT_DOUBLE_EQ(overrun.p99(), 1.2);  // the prior, until there are enough steps
  std::mt19937 rng(5);
  std::uniform_real_distribution<double> ratio(0.9, 1.1);
  for (int i = 0; i < 990; ++i) overrun.observe(0.1, 0.1 * ratio(rng));
  for (int i = 0; i < 10; ++i) overrun.observe(0.1, 0.15);  // 1% of steps run 50% over
  EXPECT_GT(overrun.p99(), 1.08);
  EXPECT_LE(overrun.p99(), 1.5);
  // A noisier minute: it follows, as the window slides.
  for (int i = 0; i < 1000; ++i) overrun.observe(0.1, i % 20 == 0 ? 0.14 : 0.1);
  EXPECT_NEAR(overrun.p99(), 1.4, 1e-6);
  // Fast steps never make it size steps past the limit.
  for (int i = 0; i < 1000; ++i) overrun.observe(0.1, 0.05);
  EXPECT_DOUBLE_EQ(overrun.p99(), 1.0);
}

}  // namespace
}  // namespace promptly
