#include "engine/busy_meter.h"

#include <gtest/gtest.h>

namespace promptly {
namespace {

using std::chrono::milliseconds;

class BusyMeterTest : public ::testing::Test {
 protected:
  SteadyClock::time_point t0 = SteadyClock::now();
  BusyMeter meter{t0, std::chrono::seconds(1)};
  SteadyClock::time_point at(int ms) const { return t0 + milliseconds(ms); }
  void step(int from_ms, int to_ms) {
    meter.begin(at(from_ms));
    meter.end(at(to_ms));
  }
};

TEST_F(BusyMeterTest, IdleIsZero) {
  EXPECT_EQ(meter.recent_ratio(at(5000)), 0.0);
  EXPECT_EQ(meter.busy_seconds(at(5000)), 0.0);
  EXPECT_EQ(meter.recent_ratio(t0), 0.0);
}

TEST_F(BusyMeterTest, YoungMeterDividesByItsAge) {
  step(0, 100);
  step(200, 300);
  EXPECT_NEAR(meter.recent_ratio(at(400)), 0.5, 1e-9);
  EXPECT_NEAR(meter.busy_seconds(at(400)), 0.2, 1e-9);
}

TEST_F(BusyMeterTest, StepInProgressCountsUpToNow) {
  meter.begin(at(500));
  EXPECT_NEAR(meter.recent_ratio(at(1000)), 0.5, 1e-9);
  EXPECT_NEAR(meter.busy_seconds(at(1000)), 0.5, 1e-9);
  meter.end(at(1000));
  EXPECT_NEAR(meter.busy_seconds(at(2000)), 0.5, 1e-9);
}

TEST_F(BusyMeterTest, AStepAcrossSlotsIsSplitAndNeverExceedsOne) {
  step(0, 12'000);  // longer than the whole window
  EXPECT_NEAR(meter.recent_ratio(at(12'000)), 1.0, 1e-9);
  EXPECT_NEAR(meter.busy_seconds(at(12'000)), 12.0, 1e-9);
}

TEST_F(BusyMeterTest, OldWorkLeavesTheWindow) {
  step(0, 1000);
  // 20 s later the window (10 slots of 1 s, the newest partial) holds no work; the total keeps it.
  EXPECT_EQ(meter.recent_ratio(at(20'500)), 0.0);
  EXPECT_NEAR(meter.busy_seconds(at(20'500)), 1.0, 1e-9);
  // Fully busy from 20 s on: the window starts at slot 11 (11 s) and ends at 20.5 s.
  step(20'000, 20'500);
  EXPECT_NEAR(meter.recent_ratio(at(20'500)), 0.5 / 9.5, 1e-9);
}

TEST_F(BusyMeterTest, ReusedSlotForgetsItsOldContent) {
  step(500, 1000);  // slot 0
  step(10'000, 10'100);  // slot 10 shares slot 0's place
  EXPECT_NEAR(meter.recent_ratio(at(10'500)), 0.1 / 9.5, 1e-9);
}

TEST_F(BusyMeterTest, UnmatchedEndIsIgnored) {
  meter.end(at(100));
  EXPECT_EQ(meter.busy_seconds(at(200)), 0.0);
}

}  // namespace
}  // namespace promptly
