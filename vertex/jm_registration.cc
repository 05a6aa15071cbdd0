#include "vertex/jm_registration.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstring>

#include <asio.hpp>

#include "common/local_peer.h"
#include "common/logging.h"
#include "common/text_util.h"
#include "protocol/codec.h"

namespace copse::vertex {
namespace {

std::shared_ptr<spdlog::logger> RegistrationLog() {
  static auto log = Logger("daemon");
  return log;
}

/// Why registering with `jm` failed: a Timeout as a miss of registration's one deadline.
Status Failure(const DaemonOptions& options, const Status& st, const std::string& jm) {
  if (st.code() != StatusCode::kTimeout) return st.WithContext(jm);
  return Status::Timeout(jm + " did not finish the handshake within " + std::to_string(options.handshake_timeout.count()) +
                         " ms");
}

/// Authenticates and registers on `client`, all before `deadline`.
Result<std::chrono::milliseconds> RegisterOn(const DaemonOptions& options, net::BlockingClient& client,
                                             const protocol::Register& reg, net::Deadline deadline, const std::string& jm) {
  // Never take tasks from a server that cannot show it holds the secret.
  Status authenticated = client.Authenticate(options.secret, "daemon", deadline);
  if (!authenticated.ok()) return Failure(options, authenticated, jm);
  if (client.server_runs_tls() && !options.tls) {
    return Status::FailedPrecondition(jm +
                                      " runs TLS, and this daemon has no TLS directory: give it the cluster's "
                                      "(--tls-dir or COPSE_TLS_DIR; the job manager's STATE_DIR/tls)");
  }
  protocol::DaemonToJm hello;
  *hello.mutable_register_() = reg;
  Status sent = client.SendFrame(protocol::EncodeFrame(hello), deadline);
  if (!sent.ok()) return Failure(options, sent, jm);
  auto reply = client.ReceiveFrame(deadline);
  if (!reply.ok()) return Failure(options, reply.status(), jm);
  auto registered = reply->type == wire::FrameType::kProto
                        ? protocol::DecodeJmToDaemon(reply->body)
                        : Result<protocol::JmToDaemon>(Status::InvalidArgument("a JSON frame"));
  if (!registered.ok() || !registered->has_registered()) {
    return Status::Internal("unexpected reply to register: " +
                            (registered.ok() ? std::string(protocol::BodyName(*registered)) : registered.status().message()));
  }
  // The job manager says how often it needs to hear from us (the codec checks 1 to 60,000 ms).
  const std::chrono::milliseconds heartbeat_every(registered->registered().heartbeat_ms());
  if (!client.local()) {
    // Cut off from the job manager (a partition, not its restart or a stall: its kernel still
    // acknowledges), our heartbeats stay unacknowledged, and the kernel ends the connection a
    // little after the job manager has declared us lost: the daemon then abandons the attempts
    // the job manager has re-run elsewhere and reconnects, instead of running them for as long
    // as the partition lasts.
    const unsigned user_timeout_ms = static_cast<unsigned>(6 * heartbeat_every.count());
    if (::setsockopt(client.native_handle(), IPPROTO_TCP, TCP_USER_TIMEOUT, &user_timeout_ms, sizeof user_timeout_ms) != 0) {
      RegistrationLog()->warn("daemon {}: cannot bound unacknowledged sends to the job manager: {}", options.name,
                              std::strerror(errno));
    }
  }
  return heartbeat_every;
}

}  // namespace

std::string NotUtf8(const protocol::Register& reg) {
  if (!IsValidUtf8(reg.name())) return "its name";
  if (!IsValidUtf8(reg.data_host())) return "its data host";
  for (const auto& [key, value] : reg.labels()) {
    if (!IsValidUtf8(key) || !IsValidUtf8(value)) return "its label \"" + key + "\"";
  }
  if (!IsValidUtf8(reg.stream().ipc())) return "its work dir (its live channels' ipc endpoint)";
  if (!IsValidUtf8(reg.stream().host())) return "its host name";
  return "";
}

Result<Registration> RegisterWithJobManager(const DaemonOptions& options, const protocol::Register& reg) {
  if (std::string bad = NotUtf8(reg); !bad.empty()) {
    return Status::InvalidArgument("daemon " + options.name + ": " + bad +
                                   " is not UTF-8 text, which the job manager cannot take");
  }
  std::error_code ec;
  auto address = asio::ip::make_address(options.jm_host == "localhost" ? "127.0.0.1" : options.jm_host, ec);
  if (ec) return Status::InvalidArgument("job manager address \"" + options.jm_host + "\" is not an IP address");
  const std::string jm = "the job manager at " + options.jm_host + ":" + std::to_string(options.jm_port);
  const net::Deadline deadline = std::chrono::steady_clock::now() + options.handshake_timeout;
  Registration out;
  if (options.local_socket) {
    const std::string name = net::ControlLocalSocketName(address.to_string(), options.jm_port);
    auto local = net::BlockingClient::ConnectLocal(name, deadline);
    // Nothing there (a job manager on another host): TCP, quietly. Taken by someone else, or
    // too busy to queue us: TCP, saying why.
    Status peer = local.ok() ? net::CheckLocalPeer((*local)->native_handle(), name) : local.status();
    if (peer.ok()) {
      out.client = std::move(*local);
    } else if (peer.code() != StatusCode::kNotFound) {
      RegistrationLog()->warn("daemon {}: not using the job manager's local socket: {}; using TCP", options.name, peer.message());
    }
  }
  if (!out.client) {
    auto tcp = net::BlockingClient::ConnectTcp(asio::ip::tcp::endpoint(address, options.jm_port), deadline);
    // Its message names the address it tried.
    if (!tcp.ok()) return tcp.status().code() == StatusCode::kTimeout ? Failure(options, tcp.status(), jm) : tcp.status();
    out.client = std::move(*tcp);
    if (options.tls) COPSE_RETURN_NOT_OK(Failure(options, out.client->StartTls(*options.tls, deadline), jm));
  }
  COPSE_ASSIGN_OR_RETURN(out.heartbeat_every, RegisterOn(options, *out.client, reg, deadline, jm));
  return out;
}

}  // namespace copse::vertex
