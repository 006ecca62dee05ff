#pragma once
// How much of the wall time the engine's step loop spends computing: a total since start (a counter
// for Prometheus' rate()) and the fraction of the last few seconds (what a status panel shows now,
// without anyone having to scrape twice). Thread-safe: the step loop writes, the server reads.
#include <array>
#include <chrono>
#include <cstdint>
#include <mutex>

#include "util/clock.h"

namespace promptly {

class BusyMeter {
 public:
  // The recent fraction covers kSlots slots of `slot` each, the newest one partly elapsed.
  static constexpr std::size_t kSlots = 10;
  explicit BusyMeter(SteadyClock::time_point start = SteadyClock::now(), SteadyClock::duration slot = std::chrono::seconds(1));

  // A step runs from `begin` to `end`; begin and end alternate, and times never go backwards.
  void begin(SteadyClock::time_point now);
  void end(SteadyClock::time_point now);

  // Busy seconds since start, the step in progress counted up to `now`.
  double busy_seconds(SteadyClock::time_point now) const;
  // Busy fraction of the window that ends at `now`: the last kSlots slots (fewer while the meter is
  // younger than that), the step in progress included. In [0, 1].
  double recent_ratio(SteadyClock::time_point now) const;

  // Times one step: begin at construction, end at destruction (also when the step throws).
  class Step {
   public:
    explicit Step(BusyMeter& meter) : meter_(meter) { meter_.begin(SteadyClock::now()); }
    ~Step() { meter_.end(SteadyClock::now()); }
    Step(const Step&) = delete;
    Step& operator=(const Step&) = delete;

   private:
    BusyMeter& meter_;
  };

 private:
  std::int64_t slot_of(SteadyClock::time_point t) const;
  SteadyClock::time_point slot_start(std::int64_t index) const;
  // Adds [from, to) to the slots it overlaps (only the last kSlots are kept).
  void add(SteadyClock::time_point from, SteadyClock::time_point to);

  const SteadyClock::time_point start_;
  const SteadyClock::duration slot_;
  mutable std::mutex mutex_;
  struct Slot {
    std::int64_t index = -1;  // which slot since start this entry holds; -1: none yet
    SteadyClock::duration busy{};
  };
  std::array<Slot, kSlots> slots_{};  // slot i lives at i % kSlots
  SteadyClock::duration total_{};
  bool in_step_ = false;
  SteadyClock::time_point step_begin_;
};

}  // namespace promptly
