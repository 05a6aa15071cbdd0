#pragma once
// The clock the job manager's state machine reads. Production uses SteadyClock; tests inject a
// ManualClock so timeouts, heartbeats and straggler detection are deterministic.
#include <atomic>
#include <chrono>
#include <cstdint>

namespace copse {

using Duration = std::chrono::nanoseconds;
using TimePoint = std::chrono::time_point<std::chrono::steady_clock, Duration>;

class Clock {
 public:
  virtual ~Clock() = default;
  virtual TimePoint Now() const = 0;
};

class SteadyClock final : public Clock {
 public:
  TimePoint Now() const override { return std::chrono::steady_clock::now(); }
};

/// A clock that moves only when told to. Thread-safe.
class ManualClock final : public Clock {
 public:
  TimePoint Now() const override { return TimePoint(Duration(now_ns_.load())); }
  void Advance(Duration d) { now_ns_ += d.count(); }

 private:
  std::atomic<int64_t> now_ns_{1'000'000'000};
};

}  // namespace copse
