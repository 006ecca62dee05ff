#include "util/thread_pool.h"

#include <algorithm>
#include <chrono>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define PROMPTLY_PAUSE() _mm_pause()
#else
#define PROMPTLY_PAUSE() std::this_thread::yield()
#endif

namespace promptly {
namespace {

// How long to spin before sleeping: long enough to bridge the gap between the operations of one
// forward pass, short enough that an idle pool goes quiet almost at once.
constexpr auto kSpin = std::chrono::microseconds(1000);

template <typename Pred>
bool spin_until(Pred done) {
  const auto deadline = std::chrono::steady_clock::now() + kSpin;
  for (int i = 0;; ++i) {
    if (done()) return true;
    PROMPTLY_PAUSE();
    if ((i & 63) == 63 && std::chrono::steady_clock::now() > deadline) return false;
  }
}

}  // namespace

int default_thread_count() {
  unsigned n = std::thread::hardware_concurrency();
  return n == 0 ? 1 : static_cast<int>(n);
}

ThreadPool::ThreadPool(int n_threads) : n_threads_(std::max(1, n_threads)) {
  for (int i = 1; i < n_threads_; ++i) workers_.emplace_back([this, i] { worker_loop(i); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  work_cv_.notify_all();
  for (auto& t : workers_) t.join();
}

// Shares are claimed, not assigned: on a shared machine one core is often slower than the other for
// a while (another tenant, an interrupt), and with fixed equal shares every operation would wait for
// the slowest. Claims shrink as the job drains (a quarter of what is left per claim with 2 threads,
// guided self-scheduling), so a job of ~100 chunks takes ~10-20 claims in all, each an atomic on one
// shared cache line, rather than one per chunk.
void ThreadPool::run_share(int index) {
  const std::size_t chunks = (job_n_ + job_grain_ - 1) / job_grain_;
  const std::size_t divisor = 2 * static_cast<std::size_t>(n_threads_);
  std::size_t first = next_chunk_.load(std::memory_order_relaxed);
  while (first < chunks) {
    const std::size_t take = std::max<std::size_t>(1, (chunks - first) / divisor);
    if (!next_chunk_.compare_exchange_weak(first, first + take, std::memory_order_relaxed)) continue;
    const std::size_t begin = first * job_grain_, end = std::min(job_n_, (first + take) * job_grain_);
    (*job_)(begin, end, index);
    first = next_chunk_.load(std::memory_order_relaxed);
  }
}

void ThreadPool::parallel_for(std::size_t n, std::size_t grain, const RangeFn& fn) {
  if (n == 0) return;
  grain = std::max<std::size_t>(1, grain);
  if (n_threads_ == 1 || n <= grain) {
    fn(0, n, 0);
    return;
  }
  job_ = &fn;
  job_n_ = n;
  job_grain_ = grain;
  next_chunk_.store(0, std::memory_order_relaxed);
  pending_.store(n_threads_ - 1);
  generation_.fetch_add(1);  // publishes the job to spinning workers
  if (sleepers_.load() > 0) {
    { std::lock_guard<std::mutex> lock(mutex_); }  // a worker between its check and its wait holds the lock
    work_cv_.notify_all();
  }
  run_share(0);
  if (!spin_until([this] { return pending_.load(std::memory_order_acquire) == 0; })) {
    std::unique_lock<std::mutex> lock(mutex_);
    done_cv_.wait(lock, [this] { return pending_.load() == 0; });
  }
  job_ = nullptr;
}

void ThreadPool::worker_loop(int index) {
  std::size_t seen = 0;
  for (;;) {
    if (!spin_until([&] { return generation_.load(std::memory_order_acquire) != seen || stopping_.load(); })) {
      std::unique_lock<std::mutex> lock(mutex_);
      sleepers_.fetch_add(1);
      work_cv_.wait(lock, [&] { return generation_.load() != seen || stopping_.load(); });
      sleepers_.fetch_sub(1);
    }
    if (stopping_.load()) return;
    seen = generation_.load();
    run_share(index);
    if (pending_.fetch_sub(1, std::memory_order_acq_rel) == 1) {
      { std::lock_guard<std::mutex> lock(mutex_); }  // the caller may be between its check and its wait
      done_cv_.notify_one();
    }
  }
}

}  // namespace promptly
