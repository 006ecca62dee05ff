#include "util/huge_pages.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <utility>

namespace promptly {
namespace {

TEST(HugePageBuffer, ZeroedWritableAndMovable) {
  constexpr std::size_t kBytes = (4u << 20) + 123;  // more than two huge pages, not a multiple of any page
  HugePageBuffer buffer(kBytes);
  ASSERT_NE(buffer.data(), nullptr);
  EXPECT_EQ(buffer.size(), kBytes);
  EXPECT_EQ(buffer.data()[0], 0);
  EXPECT_EQ(buffer.data()[kBytes - 1], 0);
  for (std::size_t i = 0; i < kBytes; i += 4096) buffer.data()[i] = static_cast<std::uint8_t>(i >> 12);
  buffer.data()[kBytes - 1] = 7;

  HugePageBuffer moved(std::move(buffer));
  EXPECT_EQ(buffer.data(), nullptr);
  EXPECT_EQ(buffer.size(), 0u);
  ASSERT_EQ(moved.size(), kBytes);
  for (std::size_t i = 0; i < kBytes; i += 4096) ASSERT_EQ(moved.data()[i], static_cast<std::uint8_t>(i >> 12));
  EXPECT_EQ(moved.data()[kBytes - 1], 7);

  HugePageBuffer assigned(4096);
  assigned = std::move(moved);
  EXPECT_EQ(assigned.size(), kBytes);
  EXPECT_EQ(assigned.data()[kBytes - 1], 7);
}

// The kernel backs only aligned 2 MiB ranges with huge pages: a buffer that started at mmap's 4 KiB
// alignment would leave its first and last partial ranges (all of a buffer under 4 MiB) on small pages.
TEST(HugePageBuffer, StartsOnAHugePageBoundary) {
  for (std::size_t bytes : {std::size_t{4096}, (std::size_t{2} << 20) + 1, (std::size_t{7} << 20) + 4321}) {
    HugePageBuffer buffer(bytes);
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(buffer.data()) % (std::size_t{2} << 20), 0u) << bytes;
    buffer.data()[bytes - 1] = 1;  // the whole size lies inside the mapping
    HugePageBuffer moved(std::move(buffer));
    EXPECT_EQ(moved.data()[bytes - 1], 1);
  }
}

TEST(HugePageBuffer, EmptyHoldsNothing) {
  HugePageBuffer empty(0);
  EXPECT_EQ(empty.data(), nullptr);
  EXPECT_EQ(empty.size(), 0u);
}

}  // namespace
}  // namespace promptly
