#include "metrics/process.h"

#include <gtest/gtest.h>

#include <chrono>
#include <ctime>
#include <vector>

namespace promptly::metrics {
namespace {

TEST(ProcessMetrics, StatmResidentField) {
  EXPECT_EQ(statm_resident_pages("1000 250 30 4 0 500 0\n"), 250);
  EXPECT_EQ(statm_resident_pages("1000 250"), 250);
  EXPECT_EQ(statm_resident_pages(""), -1);
  EXPECT_EQ(statm_resident_pages("1000"), -1);
  EXPECT_EQ(statm_resident_pages("1000 x 3"), -1);
  EXPECT_EQ(statm_resident_pages("1000 -5 3"), -1);
  EXPECT_EQ(statm_resident_pages("1000 12abc 3"), -1);
}

TEST(ProcessMetrics, ResidentMemoryGrowsWithTouchedPages) {
  const std::size_t before = process_resident_bytes();
  EXPECT_GT(before, 0u);
  std::vector<char> block(64 << 20);
  volatile char* pages = block.data();  // volatile: the writes must happen
  for (std::size_t i = 0; i < block.size(); i += 4096) pages[i] = 1;
  EXPECT_GE(process_resident_bytes(), before + (48 << 20));
}

// Spins until the kernel's own clock of this process's CPU time has gone 150 ms on (not for a
// stretch of wall time: on a loaded machine 200 ms of wall time may bring under 100 ms of CPU).
TEST(ProcessMetrics, CpuSecondsAdvanceWhileComputing) {
  const auto cpu_clock = [] {
    timespec t{};
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_nsec) / 1e9;
  };
  const double before = process_cpu_seconds(), clock_before = cpu_clock();
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  volatile std::uint64_t sink = 0;
  while (cpu_clock() - clock_before < 0.15 && std::chrono::steady_clock::now() < give_up) sink = sink + 1;
  EXPECT_GE(process_cpu_seconds() - before, 0.1);
}

}  // namespace
}  // namespace promptly::metrics
