#include "grammar/mask_worker.h"

#include <algorithm>
#include <limits>

namespace promptly::grammar {

MaskWorker::~MaskWorker() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  work_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void mask_logits(const std::uint32_t* mask, std::size_t mask_ids, float* logits, std::size_t n_vocab) {
  for (std::size_t i = 0; i < n_vocab; ++i)
    if (i >= mask_ids || !((mask[i / 32] >> (i % 32)) & 1u)) logits[i] = -std::numeric_limits<float>::infinity();
}

bool MaskWorker::spare_core(int compute_threads) {
  return static_cast<int>(std::thread::hardware_concurrency()) > compute_threads;
}

void MaskWorker::request(ConstrainedStream& s) {
  if (!background_) {
    std::lock_guard lock(mutex_);
    s.state = ConstrainedStream::State::Stale;
    return;
  }
  {
    std::lock_guard lock(mutex_);
    if (!thread_.joinable()) thread_ = std::thread([this] { run(); });  // only engines that constrain pay for it
    s.state = ConstrainedStream::State::Queued;
    queue_.push_back(&s);
  }
  work_.notify_one();
}

const std::uint32_t* MaskWorker::wait(ConstrainedStream& s) {
  std::unique_lock lock(mutex_);
  if (s.state == ConstrainedStream::State::Queued || s.state == ConstrainedStream::State::Stale) {
    queue_.erase(std::remove(queue_.begin(), queue_.end(), &s), queue_.end());
    s.state = ConstrainedStream::State::Running;
    lock.unlock();
    s.matcher.fill_mask(s.mask.data());
    lock.lock();
    s.state = ConstrainedStream::State::Ready;
    done_.notify_all();
  }
  done_.wait(lock, [&] { return s.state == ConstrainedStream::State::Ready; });
  return s.mask.data();
}

void MaskWorker::forget(ConstrainedStream& s) {
  std::unique_lock lock(mutex_);
  queue_.erase(std::remove(queue_.begin(), queue_.end(), &s), queue_.end());
  done_.wait(lock, [&] { return s.state != ConstrainedStream::State::Running; });
  s.state = ConstrainedStream::State::Stale;
}

void MaskWorker::run() {
  std::unique_lock lock(mutex_);
  for (;;) {
    work_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
    if (stopping_) return;
    ConstrainedStream* s = queue_.front();
    queue_.pop_front();
    s->state = ConstrainedStream::State::Running;
    lock.unlock();
    s->matcher.fill_mask(s->mask.data());
    lock.lock();
    s->state = ConstrainedStream::State::Ready;
    done_.notify_all();
  }
}

}  // namespace promptly::grammar
