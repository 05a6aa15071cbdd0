#pragma once
// JmServer: the `copse jm` process's network face. One io thread runs the Asio event loop and
// the Scheduler together, so the scheduler needs no locks. Every connection first proves it
// holds the secret (common/auth.h); then a daemon registers and heartbeats, a client submits,
// queries and cancels. A peer that speaks garbage, another protocol version or oversized
// frames gets an error and is disconnected; nothing a peer sends can stop the loop.
#include <atomic>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>

#include "common/clock.h"
#include "common/status.h"
#include "common/tls.h"
#include "jobmanager/job_parser.h"
#include "jobmanager/scheduler.h"

namespace copse::jm {

struct JmServerOptions {
  std::string host = "127.0.0.1";
  uint16_t port = 0;  // 0: any free port; the chosen address is written to state_dir/jm.addr
  std::filesystem::path state_dir;
  ProgramCatalog catalog = ProgramCatalog::AcceptAny();
  std::chrono::milliseconds heartbeat_timeout{1000};  // a daemon silent this long is lost
  /// How long a new connection has to authenticate: apart from the heartbeat timeout, so that a
  /// short one (150 ms) does not cut off a client or daemon further away than that.
  std::chrono::milliseconds handshake_timeout{10000};
  std::chrono::milliseconds tick{50};
  /// When set, TCP connections run over TLS with this context (common/tls.h) and plaintext
  /// peers are refused; the local socket stays plaintext.
  std::shared_ptr<const tls::Context> tls;
  SchedulerOptions scheduler;
  bool journal_fsync = false;  // fdatasync the journal at every group commit
  /// Compact the journal once it reaches this size and at least half of it is superseded (0: never).
  uint64_t journal_compact_bytes = 64ull << 20;
  /// How long a finished job's history (summary, event log, trace, vertex logs) is kept; zero:
  /// for ever.
  std::chrono::seconds history_retention = std::chrono::hours(24 * 7);
  /// The HTTP API and dashboard (http_api.h), when set: on http_host:http_port (0: any free
  /// port; the address goes to state_dir/http.addr).
  std::optional<uint16_t> http_port;
  std::string http_host = "127.0.0.1";
  std::chrono::milliseconds http_event_interval{500};
};

class JmServer {
 public:
  static Result<std::unique_ptr<JmServer>> Start(JmServerOptions options);
  ~JmServer();
  uint16_t port() const;
  /// The HTTP API's port (0: not serving).
  uint16_t http_port() const;
  /// Runs the event loop until Stop() (from any thread or a signal handler's flag).
  void Run();
  void Stop();

 private:
  class Impl;
  explicit JmServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace copse::jm
