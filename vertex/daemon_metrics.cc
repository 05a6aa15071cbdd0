#include "vertex/daemon_metrics.h"

#include <algorithm>
#include <cctype>

namespace copse::vertex {

void DaemonMetrics::AttemptEnded(const protocol::AttemptReport& report, double seconds) {
  run_seconds_.Observe(seconds);
  if (report.ok()) succeeded_.fetch_add(1, std::memory_order_relaxed);
  std::lock_guard lock(mu_);
  busy_seconds_ += seconds;
  if (report.ok()) return;
  // As the job manager names it: FAILURE_PROGRAM_ERROR -> program_error.
  std::string name = protocol::FailureClass_Name(report.failure());
  if (name.rfind("FAILURE_", 0) == 0) name.erase(0, 8);
  for (char& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  ++failed_[name];
}

void DaemonMetrics::Write(metrics::MetricsWriter& out, const Gauges& g) const {
  const double uptime = std::chrono::duration<double>(std::chrono::steady_clock::now() - started_).count();
  double busy = 0;
  std::map<std::string, uint64_t> failed;
  {
    std::lock_guard lock(mu_);
    busy = busy_seconds_;
    failed = failed_;
  }
  out.Family("copse_daemon_attempts_total", "counter", "Attempts this daemon ran, by outcome (failure class when failed).");
  out.Sample("copse_daemon_attempts_total", static_cast<double>(succeeded_.load()), {{"outcome", "succeeded"}});
  for (const auto& [cls, n] : failed) out.Sample("copse_daemon_attempts_total", static_cast<double>(n), {{"outcome", cls}});
  out.Family("copse_daemon_attempt_seconds", "histogram", "How long attempts ran on this daemon's workers.");
  out.HistogramSamples("copse_daemon_attempt_seconds", run_seconds_);
  out.Gauge("copse_daemon_slots", "Vertex slots (--cpus) this daemon offers.", g.slots);
  out.Gauge("copse_daemon_attempts_running", "Attempts running on this daemon's workers.", static_cast<double>(g.running));
  out.Gauge("copse_daemon_attempts_queued", "Attempts queued for a worker.", static_cast<double>(g.queued));
  out.Gauge("copse_daemon_attempts_held", "Chained attempts waiting here for their predecessors.", static_cast<double>(g.held));
  out.Counter("copse_daemon_busy_seconds_total", "Seconds attempts ran, summed over attempts.", busy);
  out.Gauge("copse_daemon_utilisation", "Busy seconds per slot-second since the daemon started (0 to 1).",
            uptime > 0 && g.slots > 0 ? std::min(1.0, busy / (uptime * g.slots)) : 0.0);
  out.Gauge("copse_daemon_store_memory_bytes", "Bytes of memory outputs the output store holds.",
            static_cast<double>(g.store_memory_bytes));
  out.Gauge("copse_daemon_store_memory_budget_bytes", "The output store's memory budget (--memory-budget-mb).",
            static_cast<double>(g.store_budget_bytes));
  out.Gauge("copse_daemon_store_outputs", "Outputs the output store holds (memory and files).", static_cast<double>(g.outputs));
  out.Counter("copse_daemon_store_spills_total", "Memory outputs spilled to disk over the budget.",
              static_cast<double>(g.spills));
  out.Counter("copse_daemon_store_spilled_bytes_total", "Bytes memory outputs held when they spilled.",
              static_cast<double>(g.spilled_bytes));
  out.Counter("copse_daemon_fetches_served_total", "Outputs this daemon's data server sent to readers.",
              static_cast<double>(g.fetches_served));
  out.Counter("copse_daemon_data_connections_total", "Connections this daemon's data server accepted.",
              static_cast<double>(g.data_connections));
  out.Family("copse_daemon_remote_connections_total", "counter", "Connections opened to other daemons' data servers.");
  out.Sample("copse_daemon_remote_connections_total", static_cast<double>(g.remote_connections_opened), {{"pooled", "new"}});
  out.Sample("copse_daemon_remote_connections_total", static_cast<double>(g.remote_connections_reused), {{"pooled", "reused"}});
}

}  // namespace copse::vertex
