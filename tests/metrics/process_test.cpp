#include "metrics/process.h"

#include <gtest/gtest.h>

#include <chrono>
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

TEST(ProcessMetrics, CpuSecondsAdvanceWhileComputing) {
  const double before = process_cpu_seconds();
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(200);
  volatile std::uint64_t sink = 0;
  while (std::chrono::steady_clock::now() < until) sink = sink + 1;
  EXPECT_GE(process_cpu_seconds() - before, 0.1);
}

}  // namespace
}  // namespace promptly::metrics
