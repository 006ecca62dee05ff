#pragma once
// A persistent pool that splits one operation across cores. Workers sleep on a condition
// variable between jobs, so an idle server burns no CPU; the caller thread takes part in every
// job, so `-t 1` means no extra threads at all.
#include <condition_variable>
#include <cstddef>
#include <functional>
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

  // Splits [0, n) into one contiguous range per thread (each a multiple of `grain` items except
  // the last) and waits for all of them.
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
  std::size_t generation_ = 0;
  int pending_ = 0;
  bool stopping_ = false;
};

int default_thread_count();

}  // namespace promptly
