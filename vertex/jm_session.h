#pragma once
// JmSession: a daemon's session with the job manager. Registers (vertex/jm_registration.h),
// heartbeats at the rate the job manager asked for, and hands each message to the daemon on
// its io thread. When the connection ends — the job manager restarted or stopped, a partition,
// an injected cut, a malformed message — it tells the daemon (which abandons what ran: the job
// manager re-runs it), stays away while a cut lasts, and registers again, backing off with
// jitter, for up to reconnect_timeout: a restarted job manager resumes with what the daemon
// holds, since each registration asks the daemon what to register.
//
// Threads: Run() is the io thread (it runs the connection, the heartbeats and whatever the
// daemon posts to io()). Send, Stop and io() may be used from any thread.
#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <string>

#include <asio.hpp>

#include "common/framed_connection.h"
#include "common/status.h"
#include "protocol/daemon.pb.h"
#include "vertex/daemon.h"

namespace copse::vertex {

class JmSession {
 public:
  struct Handlers {
    /// What to register, asked before every registration.
    std::function<protocol::Register()> registration;
    /// Each message from the job manager: a protocol frame's body, undecoded (on the io thread).
    std::function<void(std::string body)> on_message;
    /// The connection ended; called on the io thread's way to reconnecting, before it tries.
    std::function<void(const Status& why)> on_lost;
  };

  /// `options`: where the job manager is (locate_jm is asked before each registration), the
  /// secret, TLS, handshake_timeout, reconnect_timeout, heartbeat_interval (until the job
  /// manager says otherwise) and the name in logs.
  JmSession(DaemonOptions options, Handlers handlers);

  /// Registers once: the daemon's start. The error says why (registration's errors).
  Status Register();
  /// Serves the connection on the calling thread until Stop() (OK), or until the job manager
  /// stayed unreachable for reconnect_timeout (the error, with the last try's).
  Status Run();
  /// Ends Run(), from any thread.
  void Stop();

  /// Sends a frame when connected; false when not (it is dropped). Any thread.
  bool Send(std::string frame);
  /// The connection now (replaced at each registration), to send on later: what was taken
  /// together with it under a lock the daemon also holds when it abandons a connection's work
  /// (Handlers::on_lost) goes to that connection or nowhere, never to the next one.
  std::shared_ptr<net::FramedConnection> Connection();
  /// Drops the connection and stays away for `how_long` (an injected partition). Io thread.
  void CutFor(std::chrono::milliseconds how_long);
  /// Drops the connection, telling the job manager why (a malformed message). Io thread.
  void SendErrorAndClose(const std::string& why);

  /// The io loop Run() runs: for the daemon's own timers and posts.
  asio::io_context& io() { return io_; }
  std::chrono::milliseconds heartbeat_every() const { return heartbeat_every_; }
  /// Where the job manager was last found.
  const std::string& jm_host() const { return options_.jm_host; }
  uint16_t jm_port() const { return options_.jm_port; }

 private:
  void Heartbeat();

  DaemonOptions options_;
  Handlers handlers_;
  asio::io_context io_;
  asio::steady_timer heartbeat_;
  std::chrono::milliseconds heartbeat_every_;
  std::atomic<bool> stopping_{false};
  std::chrono::steady_clock::time_point cut_until_{};  // io thread
  Status exit_status_;                                 // io thread
  std::mutex mu_;
  std::shared_ptr<net::FramedConnection> conn_;  // replaced on the io thread under mu_
};

}  // namespace copse::vertex
