#include "util/thread_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <vector>

namespace promptly {

TEST(ThreadPool, CoversEveryItemExactlyOnce) {
  for (int threads : {1, 2, 3, 8}) {
    ThreadPool pool(threads);
    for (std::size_t n : {0u, 1u, 7u, 64u, 1001u}) {
      for (std::size_t grain : {1u, 4u, 16u}) {
        std::vector<std::atomic<int>> hits(n);
        pool.parallel_for(n, grain, [&](std::size_t b, std::size_t e, int) {
          for (std::size_t i = b; i < e; ++i) hits[i]++;
        });
        for (std::size_t i = 0; i < n; ++i) ASSERT_EQ(hits[i].load(), 1) << "threads " << threads << " n " << n << " i " << i;
      }
    }
  }
}

TEST(ThreadPool, ReusableManyTimes) {
  ThreadPool pool(2);
  std::atomic<long> sum{0};
  for (int rep = 0; rep < 2000; ++rep) {
    pool.parallel_for(10, 1, [&](std::size_t b, std::size_t e, int) {
      for (std::size_t i = b; i < e; ++i) sum += static_cast<long>(i);
    });
  }
  EXPECT_EQ(sum.load(), 2000L * 45);
}

}  // namespace promptly
