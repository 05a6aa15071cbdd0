#pragma once
// DaemonMetrics: what a daemon counts for `/metrics` (`copse daemon --metrics HOST:PORT`), in
// the Prometheus text format (common/metrics.h): attempts by outcome, their run times, how busy
// its slots are, what its output store holds and spills, and what its data server serves.
// Thread-safe: workers count as attempts end, the HTTP server's thread writes.
#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>

#include "common/metrics.h"
#include "protocol/daemon.pb.h"

namespace copse::vertex {

class DaemonMetrics {
 public:
  /// An attempt that ran `seconds` on a worker ended with `report`.
  void AttemptEnded(const protocol::AttemptReport& report, double seconds);

  /// The daemon's state at the moment of a scrape.
  struct Gauges {
    int slots = 0;
    size_t running = 0, queued = 0, held = 0;
    uint64_t store_memory_bytes = 0, store_budget_bytes = 0, outputs = 0, spills = 0, spilled_bytes = 0;
    uint64_t fetches_served = 0, data_connections = 0;
    uint64_t remote_connections_opened = 0, remote_connections_reused = 0;
  };
  void Write(metrics::MetricsWriter& out, const Gauges& gauges) const;

 private:
  const std::chrono::steady_clock::time_point started_ = std::chrono::steady_clock::now();
  std::atomic<uint64_t> succeeded_{0};
  mutable std::mutex mu_;
  std::map<std::string, uint64_t> failed_;  // by failure class
  double busy_seconds_ = 0;                 // summed over attempts (slot-seconds when each takes a slot)
  metrics::Histogram run_seconds_{metrics::Histogram::Exponential(1e-4, 4, 13)};  // 100 µs to 28 min
};

}  // namespace copse::vertex
