#include "util/thread_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

namespace promptly {

TEST(ThreadPool, CoversEveryItemExactlyOnce) {
  for (int threads : {1, 2, 3, 8}) {
    ThreadPool pool(threads);
    for (std::size_t n : {0u, 1u, 7u, 64u, 1001u}) {
      for (std::size_t grain : {1u, 4u, 16u}) {
        std::vector<std::atomic<int>> hits(n);
        pool.parallel_for(n, grain, [&](std::size_t b, std::size_t e, int) {
          EXPECT_EQ(b % grain, 0u);  // ranges are whole chunks of `grain` items, but for the last
          EXPECT_TRUE((e - b) % grain == 0 || e == n);
          for (std::size_t i = b; i < e; ++i) hits[i]++;
        });
        for (std::size_t i = 0; i < n; ++i) ASSERT_EQ(hits[i].load(), 1) << "threads " << threads << " n " << n << " i " << i;
      }
    }
  }
}

// Work is claimed rather than split in fixed shares, so when one thread is slow (here the caller
// sleeps 40 ms per item, as a core shared with another tenant might stall) the other takes over the
// rest of the job: the caller's first claim is a quarter of its half, and the worker has 200 ms to
// do its own half and steal most of the rest. Fixed shares gave each thread half.
TEST(ThreadPool, FastThreadTakesOverFromSlowOne) {
  ThreadPool pool(2);
  constexpr std::size_t kItems = 40;
  std::atomic<std::size_t> by_caller{0}, by_worker{0};
  pool.parallel_for(kItems, 1, [&](std::size_t b, std::size_t e, int thread) {
    if (thread == 0) {
      std::this_thread::sleep_for(std::chrono::milliseconds(40) * (e - b));
      by_caller += e - b;
    } else {
      by_worker += e - b;
    }
  });
  EXPECT_EQ(by_caller + by_worker, kItems);
  EXPECT_GE(by_worker.load(), 3 * kItems / 4) << "the caller did " << by_caller.load() << " of " << kItems;
}

// Each thread starts at the front of its own part of the job (thread i at the i-th of n equal
// parts), so that a matmul's share on each core is one stream of weights; thieves take from the back
// of a part, so a late worker still starts where its part begins.
TEST(ThreadPool, ThreadsStartOnTheirOwnParts) {
  ThreadPool pool(2);
  constexpr std::size_t kItems = 40;
  std::atomic<std::size_t> first_begin[2] = {kItems, kItems};
  pool.parallel_for(kItems, 1, [&](std::size_t b, std::size_t, int thread) {
    std::size_t unset = kItems;
    first_begin[thread].compare_exchange_strong(unset, b);
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  });
  EXPECT_EQ(first_begin[0].load(), 0u);
  EXPECT_EQ(first_begin[1].load(), kItems / 2);
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
