#include "engine/busy_meter.h"

#include <algorithm>

namespace promptly {

BusyMeter::BusyMeter(SteadyClock::time_point start, SteadyClock::duration slot) : start_(start), slot_(std::max(slot, SteadyClock::duration(1))) {}

std::int64_t BusyMeter::slot_of(SteadyClock::time_point t) const { return t <= start_ ? 0 : (t - start_) / slot_; }

SteadyClock::time_point BusyMeter::slot_start(std::int64_t index) const { return start_ + index * slot_; }

void BusyMeter::add(SteadyClock::time_point from, SteadyClock::time_point to) {
  from = std::max(from, start_);
  if (to <= from) return;
  total_ += to - from;
  // Slots older than the newest kSlots can never be read again: skip them.
  const std::int64_t last = slot_of(to);
  for (std::int64_t i = std::max(slot_of(from), last - static_cast<std::int64_t>(kSlots) + 1); i <= last; ++i) {
    const SteadyClock::duration overlap = std::min(to, slot_start(i + 1)) - std::max(from, slot_start(i));
    if (overlap <= SteadyClock::duration::zero()) continue;
    Slot& s = slots_[static_cast<std::size_t>(i) % kSlots];
    if (s.index != i) s = Slot{i, {}};
    s.busy += overlap;
  }
}

void BusyMeter::begin(SteadyClock::time_point now) {
  std::lock_guard lock(mutex_);
  in_step_ = true;
  step_begin_ = now;
}

void BusyMeter::end(SteadyClock::time_point now) {
  std::lock_guard lock(mutex_);
  if (!in_step_) return;
  in_step_ = false;
  add(step_begin_, now);
}

double BusyMeter::busy_seconds(SteadyClock::time_point now) const {
  std::lock_guard lock(mutex_);
  SteadyClock::duration busy = total_;
  if (in_step_ && now > step_begin_) busy += now - std::max(step_begin_, start_);
  return std::chrono::duration<double>(busy).count();
}

double BusyMeter::recent_ratio(SteadyClock::time_point now) const {
  std::lock_guard lock(mutex_);
  if (now <= start_) return 0;
  const std::int64_t newest = slot_of(now);
  const std::int64_t oldest = std::max<std::int64_t>(0, newest - static_cast<std::int64_t>(kSlots) + 1);
  const SteadyClock::time_point window_start = slot_start(oldest);
  SteadyClock::duration busy{};
  for (const Slot& s : slots_) {
    if (s.index >= oldest && s.index <= newest) busy += s.busy;
  }
  if (in_step_ && now > step_begin_) busy += now - std::max(step_begin_, window_start);
  const double wall = std::chrono::duration<double>(now - window_start).count();
  return wall > 0 ? std::clamp(std::chrono::duration<double>(busy).count() / wall, 0.0, 1.0) : 0.0;
}

}  // namespace promptly
