#include "vertex/jm_session.h"

#include <cstdlib>
#include <thread>
#include <utility>

#include "common/logging.h"
#include "protocol/codec.h"
#include "vertex/jm_registration.h"

namespace copse::vertex {
namespace {

std::shared_ptr<spdlog::logger> SessionLog() {
  static auto log = Logger("daemon");
  return log;
}

}  // namespace

JmSession::JmSession(DaemonOptions options, Handlers handlers)
    : options_(std::move(options)),
      handlers_(std::move(handlers)),
      heartbeat_(io_),
      heartbeat_every_(options_.heartbeat_interval) {}

Status JmSession::Register() {
  if (options_.locate_jm) {
    auto where = options_.locate_jm();
    if (where.ok() && (where->first != options_.jm_host || where->second != options_.jm_port)) {
      SessionLog()->info("daemon {}: the job manager is now at {}:{} (was {}:{})", options_.name, where->first, where->second,
                         options_.jm_host, options_.jm_port);
      options_.jm_host = where->first;
      options_.jm_port = where->second;
    }
  }
  const protocol::Register reg = handlers_.registration();
  COPSE_ASSIGN_OR_RETURN(Registration registered, RegisterWithJobManager(options_, reg));
  heartbeat_every_ = registered.heartbeat_every;
  SessionLog()->info("daemon {} registered over {}; data server on {}:{}", options_.name,
                     registered.client->local() ? "the job manager's local socket" : "TCP", reg.data_host(), reg.data_port());
  COPSE_ASSIGN_OR_RETURN(auto conn, registered.client->Detach(io_, wire::kMaxControlBytes));
  std::lock_guard<std::mutex> lock(mu_);  // other threads send on it
  conn_ = std::move(conn);
  return Status::OK();
}

Status JmSession::Run() {
  while (true) {
    std::shared_ptr<net::FramedConnection> conn = Connection();
    conn->set_proto_handler([this](std::string body) { handlers_.on_message(std::move(body)); });
    // The job manager speaks JSON only to say why it drops us (a refused or malformed message).
    conn->Start(
        [this](Json msg) {
          SessionLog()->error("daemon {}: the job manager says: {}", options_.name,
                              StringMember(msg, "op") == "error" ? StringMember(msg, "message") : DumpJson(msg).substr(0, 200));
        },
        [this](const Status& why) {
          exit_status_ = why.WithContext("job manager connection ended");
          heartbeat_.cancel();
          io_.stop();
        });
    Heartbeat();
    io_.run();
    if (stopping_) return Status::OK();
    SessionLog()->warn("daemon {}: {}; reconnecting", options_.name, exit_status_.message());
    handlers_.on_lost(exit_status_);
    io_.restart();
    while (std::chrono::steady_clock::now() < cut_until_ && !stopping_) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    const bool forever = options_.reconnect_timeout <= std::chrono::milliseconds::zero();
    const auto deadline = std::chrono::steady_clock::now() + options_.reconnect_timeout;
    Status st;
    auto pause = std::chrono::milliseconds(100);
    for (int tries = 1; !stopping_; ++tries) {
      st = Register();
      if (st.ok() || (!forever && std::chrono::steady_clock::now() > deadline)) break;
      // Said once in a while, not per try: a long partition or a stopped job manager.
      if (tries % 50 == 0) SessionLog()->warn("daemon {}: still reconnecting: {}", options_.name, st.message());
      // Jittered, so that a restarted job manager's daemons do not all come back at once.
      std::this_thread::sleep_for(pause * (75 + std::rand() % 50) / 100);
      pause = std::min(pause * 2, std::chrono::milliseconds(1000));
    }
    if (stopping_) return Status::OK();
    if (!st.ok()) return exit_status_.WithContext("gave up reconnecting (" + st.message() + ")");
  }
}

void JmSession::Stop() {
  stopping_ = true;
  asio::post(io_, [this] {
    exit_status_ = Status::OK();
    if (std::shared_ptr<net::FramedConnection> conn = Connection()) conn->Close(Status::Cancelled("stopping"));
    io_.stop();
  });
}

bool JmSession::Send(std::string frame) {
  std::shared_ptr<net::FramedConnection> conn = Connection();
  if (!conn || !conn->open()) return false;
  conn->SendRaw(std::move(frame));
  return true;
}

void JmSession::CutFor(std::chrono::milliseconds how_long) {
  cut_until_ = std::chrono::steady_clock::now() + how_long;
  SessionLog()->warn("daemon {}: cut off from the job manager for {} ms by an injected fault", options_.name, how_long.count());
  Connection()->Close(Status::Unavailable("cut off by an injected fault"));
}

void JmSession::SendErrorAndClose(const std::string& why) { Connection()->SendErrorAndClose(why); }

void JmSession::Heartbeat() {
  heartbeat_.expires_after(heartbeat_every_);
  heartbeat_.async_wait([this](std::error_code ec) {
    if (ec) return;
    static const std::string kHeartbeat = [] {
      protocol::DaemonToJm beat;
      beat.mutable_heartbeat();
      return protocol::EncodeFrame(beat);
    }();
    Send(kHeartbeat);
    Heartbeat();
  });
}

std::shared_ptr<net::FramedConnection> JmSession::Connection() {
  std::lock_guard<std::mutex> lock(mu_);
  return conn_;
}

}  // namespace copse::vertex
