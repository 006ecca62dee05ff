#include "loadgen/arrivals.h"

#include <gtest/gtest.h>

#include <cmath>

#include "util/error.h"

namespace promptly::loadgen {
namespace {

struct GapStats {
  double mean = 0, cv = 0;  // coefficient of variation: stddev / mean
};

GapStats gap_stats(const std::vector<double>& times) {
  std::vector<double> gaps;
  for (std::size_t i = 1; i < times.size(); ++i) gaps.push_back(times[i] - times[i - 1]);
  GapStats s;
  for (double g : gaps) s.mean += g;
  s.mean /= static_cast<double>(gaps.size());
  double var = 0;
  for (double g : gaps) var += (g - s.mean) * (g - s.mean);
  s.cv = std::sqrt(var / static_cast<double>(gaps.size())) / s.mean;
  return s;
}

TEST(Arrivals, InfiniteRateSendsEverythingAtOnce) {
  for (double t : arrival_times(50, kInfiniteRate, 1, 3)) EXPECT_EQ(t, 0);
}

TEST(Arrivals, StartAtZeroAndNeverGoBack) {
  const auto times = arrival_times(1000, 4, 1, 7);
  ASSERT_EQ(times.size(), 1000u);
  EXPECT_EQ(times[0], 0);
  for (std::size_t i = 1; i < times.size(); ++i) EXPECT_GE(times[i], times[i - 1]);
}

// The gamma gaps keep the mean at 1/rate for any burstiness, with a coefficient of variation of
// 1/sqrt(burstiness): 1 for Poisson, 2 for burstiness 0.25, 0.5 for burstiness 4.
TEST(Arrivals, GapsHaveTheRateAsMeanAndBurstinessAsShape) {
  for (const auto& [burstiness, cv] : {std::pair{1.0, 1.0}, std::pair{0.25, 2.0}, std::pair{4.0, 0.5}}) {
    const GapStats s = gap_stats(arrival_times(40001, 2.0, burstiness, 11));
    EXPECT_NEAR(s.mean, 0.5, 0.5 * 0.04) << burstiness;
    EXPECT_NEAR(s.cv, cv, cv * 0.06) << burstiness;
  }
}

TEST(Arrivals, SeedDecidesTheSchedule) {
  EXPECT_EQ(arrival_times(20, 3, 1, 5), arrival_times(20, 3, 1, 5));
  EXPECT_NE(arrival_times(20, 3, 1, 5), arrival_times(20, 3, 1, 6));
}

TEST(Arrivals, RejectsRatesAndBurstinessThatAreNotPositive) {
  EXPECT_THROW(arrival_times(5, 0, 1, 1), Error);
  EXPECT_THROW(arrival_times(5, -2, 1, 1), Error);
  EXPECT_THROW(arrival_times(5, std::nan(""), 1, 1), Error);
  EXPECT_THROW(arrival_times(5, 1, 0, 1), Error);
}

TEST(Arrivals, ParsesOneRateOrASweep) {
  EXPECT_EQ(parse_rates("2.5"), std::vector<double>{2.5});
  const auto sweep = parse_rates("0.5,1,2,inf");
  ASSERT_EQ(sweep.size(), 4u);
  EXPECT_EQ(sweep[0], 0.5);
  EXPECT_EQ(sweep[2], 2);
  EXPECT_TRUE(std::isinf(sweep[3]));
  for (const char* bad : {"", "0", "-1", "abc", "1,,2", "2x", "1,", "nan"}) {
    try {
      parse_rates(bad);
      ADD_FAILURE() << "accepted '" << bad << "'";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("--request-rate"), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace promptly::loadgen
