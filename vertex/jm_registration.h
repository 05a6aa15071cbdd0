#pragma once
// A daemon's registration with the job manager: connect (through the job manager's local
// socket when it runs on this host, else TCP, under TLS when the cluster runs it),
// authenticate both ways with the cluster's secret, send the `register` message
// (protocol/daemon.proto) and read `registered` — within one deadline, so a job manager that
// accepts and then says nothing, or an address that drops packets, fails the attempt in time.
// The daemon calls it at start and on every reconnect; it keeps no state.
#include <chrono>
#include <memory>
#include <string>

#include "common/framed_connection.h"
#include "common/status.h"
#include "protocol/daemon.pb.h"
#include "vertex/daemon.h"

namespace copse::vertex {

/// A registered connection, still blocking (the daemon detaches it onto its io loop), and how
/// often the job manager needs to hear from this daemon.
struct Registration {
  std::unique_ptr<net::BlockingClient> client;
  std::chrono::milliseconds heartbeat_every{0};
};

/// Registers `reg` with the job manager at options.jm_host:jm_port (options' local_socket, tls,
/// secret and handshake_timeout apply). Errors name the job manager; a Timeout says the
/// handshake did not finish within handshake_timeout. Refused before connecting when a text
/// of `reg` is not UTF-8 (the job manager could not parse it); refused after authenticating
/// when the job manager runs TLS and this daemon has none (reached through the plaintext local
/// socket, it would serve its outputs in plaintext to a cluster that speaks only TLS).
Result<Registration> RegisterWithJobManager(const DaemonOptions& options, const protocol::Register& reg);

/// Which text of a registration is not UTF-8 ("its name", "its label \"k\"", …), or "".
std::string NotUtf8(const protocol::Register& reg);

}  // namespace copse::vertex
