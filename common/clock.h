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
  /// Monotonic time: what timeouts and intervals are measured on.
  virtual TimePoint Now() const = 0;
  /// Wall-clock time in ms since the Unix epoch: what is recorded for people and survives a
  /// restart (when a job was submitted, when it finished).
  virtual int64_t UnixMs() const = 0;
};

class SteadyClock final : public Clock {
 public:
  TimePoint Now() const override { return std::chrono::steady_clock::now(); }
  int64_t UnixMs() const override {
    return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch()).count();
  }
};

/// A clock that moves only when told to, its wall clock with it. Thread-safe.
class ManualClock final : public Clock {
 public:
  TimePoint Now() const override { return TimePoint(Duration(now_ns_.load())); }
  int64_t UnixMs() const override { return kUnixStartMs + (now_ns_.load() - kStartNs) / 1'000'000; }
  void Advance(Duration d) { now_ns_ += d.count(); }

 private:
  static constexpr int64_t kStartNs = 1'000'000'000;
  static constexpr int64_t kUnixStartMs = 1'800'000'000'000;  // 2027-01-15
  std::atomic<int64_t> now_ns_{kStartNs};
};

}  // namespace copse
