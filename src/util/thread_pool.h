#pragma once
// A persistent pool that splits one operation across cores. A decode step runs a hundred or more
// parallel operations, each tens of microseconds long, so waking threads through the kernel every
// time would cost more than the work: workers and the caller spin briefly (a few tens of
// microseconds) on an atomic before sleeping on a condition variable. An idle server therefore
// burns no CPU, and back-to-back operations never pay a wake-up. The caller takes part in every
// job, so `-t 1` means no extra threads at all.
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <cstddef>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace promptly {

class ThreadPool {
 public:
  // fn(begin, end, thread_index) processes items [begin, end).
  using RangeFn = std::function<void(std::size_t, std::size_t, int)>;

  explicit ThreadPool(int n_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return n_threads_; }

  // Calls fn on contiguous ranges covering [0, n) exactly once, each a whole number of `grain`
  // items (the last range may be short), on whichever threads claim them first, and waits for all
  // of them. A thread may get several ranges of one job, one after another. Not reentrant: one job
  // at a time.
  void parallel_for(std::size_t n, std::size_t grain, const RangeFn& fn);

 private:
  void worker_loop(int index);
  void run_share(int index);

  int n_threads_;
  std::vector<std::thread> workers_;
  std::mutex mutex_;
  std::condition_variable work_cv_;
  std::condition_variable done_cv_;
  const RangeFn* job_ = nullptr;
  std::size_t job_n_ = 0;
  std::size_t job_grain_ = 1;
  std::atomic<std::size_t> generation_{0};
  // Each thread's unclaimed chunks of the current job, [first, end) packed as (first << 32) | end:
  // its owner claims from the front, threads with nothing left steal from the back.
  struct alignas(64) Range {
    std::atomic<std::uint64_t> chunks{0};
  };
  std::unique_ptr<Range[]> ranges_;
  std::atomic<int> pending_{0};
  std::atomic<int> sleepers_{0};
  std::atomic<bool> stopping_{false};
};

int default_thread_count();

}  // namespace promptly
