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

ThreadPool::ThreadPool(int n_threads) : n_threads_(std::max(1, n_threads)), ranges_(std::make_unique<Range[]>(static_cast<std::size_t>(n_threads_))) {
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

// Each thread starts on its own contiguous part of the job (thread i the i-th of n equal parts),
// claiming it from the front a piece at a time, and a thread that runs out steals the back half of
// whatever another has left. Why both:
// - Contiguous parts: a decode step's matmuls stream weights from DRAM, and a core's hardware
//   prefetcher keeps up only along one long stream. Handing out chunks in turn from one shared
//   counter interleaved the two cores' pieces of every matrix, so each piece started a stream cold
//   (and each core's prefetcher ran on into the piece the other core had claimed): a 768 x 768
//   Q4_0 matvec on 2 threads took 8.2 us that way and 5.9-6.6 us in two contiguous halves.
// - Stealing: on a shared machine one core is often slower than the other for a while (another
//   tenant, an interrupt), and with fixed shares every operation would wait for the slower one.
// Claims shrink as a part drains (a quarter of what is left with 2 threads), so a thread's part of
// ~50 chunks takes ~10 claims, each an atomic on a cache line that only a thief also touches.
namespace {
constexpr std::uint64_t pack(std::uint64_t first, std::uint64_t end) { return first << 32 | end; }
constexpr std::size_t first_of(std::uint64_t r) { return static_cast<std::size_t>(r >> 32); }
constexpr std::size_t end_of(std::uint64_t r) { return static_cast<std::size_t>(r & 0xffffffffu); }
}  // namespace

void ThreadPool::run_share(int index) {
  const std::size_t divisor = 2 * static_cast<std::size_t>(n_threads_);
  std::atomic<std::uint64_t>& mine = ranges_[index].chunks;
  for (;;) {
    std::uint64_t r = mine.load(std::memory_order_relaxed);
    while (first_of(r) < end_of(r)) {
      const std::size_t first = first_of(r), take = std::max<std::size_t>(1, (end_of(r) - first) / divisor);
      if (!mine.compare_exchange_weak(r, pack(first + take, end_of(r)), std::memory_order_relaxed)) continue;
      (*job_)(first * job_grain_, std::min(job_n_, (first + take) * job_grain_), index);
      r = mine.load(std::memory_order_relaxed);
    }
    // Out of work: steal the back half of the largest part left, and make it this thread's own (so
    // that it can be stolen from in turn).
    int victim = -1;
    std::uint64_t vr = 0;
    for (int i = 0; i < n_threads_; ++i) {
      const std::uint64_t ri = ranges_[i].chunks.load(std::memory_order_relaxed);
      if (i != index && end_of(ri) > first_of(ri) && (victim < 0 || end_of(ri) - first_of(ri) > end_of(vr) - first_of(vr))) {
        victim = i;
        vr = ri;
      }
    }
    if (victim < 0) return;
    const std::size_t left = end_of(vr) - first_of(vr), steal = (left + 1) / 2, split = end_of(vr) - steal;
    if (ranges_[victim].chunks.compare_exchange_strong(vr, pack(first_of(vr), split), std::memory_order_relaxed)) {
      mine.store(pack(split, end_of(vr)), std::memory_order_relaxed);
    }
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
  // Chunk indices are packed in 32 bits: a job of more chunks takes several grains per chunk.
  constexpr std::size_t kMaxChunks = std::size_t{1} << 31;
  std::size_t chunks = (n + grain - 1) / grain;
  if (chunks > kMaxChunks) {
    grain *= (chunks + kMaxChunks - 1) / kMaxChunks;
    chunks = (n + grain - 1) / grain;
  }
  job_n_ = n;
  job_grain_ = grain;
  for (int i = 0; i < n_threads_; ++i) {
    const std::size_t t = static_cast<std::size_t>(i), parts = static_cast<std::size_t>(n_threads_);
    ranges_[i].chunks.store(pack(chunks * t / parts, chunks * (t + 1) / parts), std::memory_order_relaxed);
  }
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
