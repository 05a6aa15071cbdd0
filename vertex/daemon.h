#pragma once
// Daemon: the `copse daemon` process. Registers with the job manager (cpus, gpus, labels, the
// address of its data server), heartbeats, runs the vertices it is given on `cpus` worker
// threads, stores their outputs in its OutputStore and serves them to other daemons.
//
// Threads: one io thread owns the job manager connection (TCP, or the job manager's local
// socket on its host) and reads every message; worker threads run vertex programs and send the
// "report" of what they ran themselves, every report waiting in one message. A vertex that
// throws or returns an error is a failed attempt; it never takes the daemon down.
#include <chrono>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <string>

#include "common/status.h"
#include "common/tls.h"
#include "vertex/program_registry.h"

namespace copse::vertex {

struct DaemonOptions {
  std::string jm_host = "127.0.0.1";
  uint16_t jm_port = 0;
  /// Where the job manager is now, asked before every registration (a job manager started
  /// again on another port says so in its state directory). Unset, or failing: jm_host:jm_port.
  std::function<Result<std::pair<std::string, uint16_t>>()> locate_jm;
  std::string name;
  int cpus = 1;
  int gpus = 0;
  int64_t memory_mb = 0;
  int64_t gpu_memory_mb = 0;  // each of its GPUs' memory (the smallest), for placement; 0: not known
  std::map<std::string, std::string> labels;
  std::filesystem::path work_dir;
  std::string secret;
  /// TCP connections (to the job manager, the data server's, fetches from other daemons) over
  /// TLS with this context (common/tls.h); null: plaintext.
  std::shared_ptr<const tls::Context> tls;
  std::string data_host = "127.0.0.1";  // where other daemons reach this one's outputs
  /// Serve daemons on this host through a local socket too (channels/data_server.h), and reach
  /// a job manager on this host through its local socket (common/framed_connection.h).
  bool local_socket = true;
  uint64_t memory_budget_bytes = 2ull << 30;
  /// Until the job manager says otherwise at registration (a fifth of its heartbeat timeout).
  std::chrono::milliseconds heartbeat_interval{200};
  /// How long to keep trying to reach a job manager that went away (a restart, a partition)
  /// before exiting; zero or less: keep trying for as long as it runs.
  std::chrono::milliseconds reconnect_timeout{0};
  /// How long one attempt to register may take, connecting included: a job manager that
  /// accepts and then says nothing, or an address that drops packets, fails the attempt then.
  std::chrono::milliseconds handshake_timeout{10000};
  const ProgramRegistry* programs = &ProgramRegistry::Default();
  /// Serve Prometheus metrics at http://metrics_host:metrics_port/metrics when set (0: any free
  /// port; the address goes to work_dir/metrics.addr), to holders of the cluster's secret or
  /// its viewer token (common/http_server.h).
  std::optional<uint16_t> metrics_port;
  std::string metrics_host = "127.0.0.1";
};

class Daemon {
 public:
  /// Starts the data server and workers, connects and registers with the job manager.
  static Result<std::unique_ptr<Daemon>> Start(DaemonOptions options);
  ~Daemon();
  /// Runs until Stop(), or until the job manager stays unreachable for reconnect_timeout (if set).
  Status Run();
  void Stop();

 private:
  class Impl;
  explicit Daemon(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace copse::vertex
