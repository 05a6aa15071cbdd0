#pragma once
// Plays the job manager's side of one daemon connection, frame by frame, for daemon tests:
// message orders a live job manager only hits by chance, impostors, silence and malformed
// messages.
#include <poll.h>
#include <sys/socket.h>

#include <chrono>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include <doctest/doctest.h>

#include "channels/socket.h"
#include "common/auth.h"
#include "common/framed_connection.h"
#include "common/json_util.h"
#include "protocol/codec.h"

namespace copse::vertex::testing {

using chan::internal::BufferedSocket;
using chan::internal::Socket;

inline const std::string kSecret = "daemon-chain-test-secret-0123456789";

/// Plays the job manager's side of one daemon connection, frame by frame.
class ScriptedJobManager {
 public:
  ScriptedJobManager() : listener_(ListenOnLoopback()) {}
  uint16_t port() const { return listener_.LocalPort(); }

  /// Accepts the daemon and answers its handshake (hello, auth, register), asking for a
  /// heartbeat every `heartbeat_ms`; returns what it registered.
  protocol::Register Accept(int heartbeat_ms = 200) {
    conn_.emplace(Socket(::accept(listener_.fd(), nullptr, nullptr)));
    REQUIRE(conn_->socket().valid());
    const std::string nonce = auth::NewNonce();
    SendJson({{"op", "hello"}, {"nonce", nonce}, {"version", wire::kProtocolVersion}});
    Json answer = ReadJson();
    CHECK(answer["op"] == "auth");
    SendJson(auth::Welcome(answer, kSecret, nonce));
    const protocol::DaemonToJm hello = Read();
    CHECK(hello.has_register_());
    CHECK(hello.register_().name() == "d0");
    protocol::JmToDaemon registered;
    registered.mutable_registered()->set_daemon(0);
    registered.mutable_registered()->set_heartbeat_ms(heartbeat_ms);
    Send(registered);
    return hello.register_();
  }
  /// Accepts the daemon, greets it, reads its answer and then says nothing more: a job manager
  /// that hangs mid-handshake (stopped, or overloaded).
  /// Runs on a thread of its own, so it never REQUIREs (an exception there would end the run).
  void AcceptAndFallSilent() {
    conn_.emplace(Socket(::accept(listener_.fd(), nullptr, nullptr)));
    if (!chan::internal::WriteJson(conn_->socket(),
                                   {{"op", "hello"}, {"nonce", auth::NewNonce()}, {"version", wire::kProtocolVersion}})
             .ok()) {
      return;
    }
    (void)chan::internal::ReadJson(*conn_, wire::kMaxControlBytes, 10000, 10000);  // the daemon's answer
  }
  /// Whether a connection waits to be accepted within `ms`.
  bool WaitForConnection(int ms) {
    pollfd p{listener_.fd(), POLLIN, 0};
    return ::poll(&p, 1, ms) == 1;
  }
  /// Ends the daemon's connection, still listening for it to come back.
  void Drop() { conn_.reset(); }
  /// Ends every connection, the ones waiting to be accepted too.
  void Close() {
    conn_.reset();
    listener_.Close();
  }
  /// Accepts the daemon as a server without the secret would: hello, and a welcome with no
  /// proof (`forged`: with one made with another secret).
  void AcceptAsImpostor(bool forged) {
    conn_.emplace(Socket(::accept(listener_.fd(), nullptr, nullptr)));
    REQUIRE(conn_->socket().valid());
    const std::string nonce = auth::NewNonce();
    SendJson({{"op", "hello"}, {"nonce", nonce}, {"version", wire::kProtocolVersion}});
    Json answer = ReadJson();
    SendJson(forged ? auth::Welcome(answer, "not-the-secret-0123456789abcdef0123", nonce) : Json{{"op", "welcome"}});
    conn_.reset();  // a daemon that took the welcome would wait for "registered" for ever: fail it now
  }
  void SendJson(const Json& msg) { REQUIRE(chan::internal::WriteJson(conn_->socket(), msg).ok()); }
  void Send(const protocol::JmToDaemon& msg) {
    std::string body;
    REQUIRE(msg.SerializeToString(&body));
    SendBody(body);
  }
  /// A kProto frame with this body, well formed or not.
  void SendBody(const std::string& body) {
    REQUIRE(chan::internal::WriteFrame(conn_->socket(), wire::FrameType::kProto, body).ok());
  }
  Json ReadJson() {
    auto msg = chan::internal::ReadJson(*conn_, wire::kMaxControlBytes, 10000, 10000);
    REQUIRE_MESSAGE(msg.ok(), msg.status().ToString());
    return *msg;
  }
  /// The next frame, waiting at most 10 s for it: a daemon's message, or (JSON) why it hangs up.
  std::variant<protocol::DaemonToJm, Json> ReadAny() {
    auto header = chan::internal::ReadHeader(*conn_, wire::kMaxControlBytes, 10000, 10000);
    REQUIRE_MESSAGE(header.ok(), header.status().ToString());
    auto body = chan::internal::ReadBody(*conn_, *header, 10000);
    REQUIRE_MESSAGE(body.ok(), body.status().ToString());
    if (header->type == wire::FrameType::kJson) return Json::parse(*body);
    auto msg = protocol::DecodeDaemonToJm(*body);
    REQUIRE_MESSAGE(msg.ok(), msg.status().ToString());
    return *msg;
  }
  protocol::DaemonToJm Read() {
    auto any = ReadAny();
    REQUIRE_MESSAGE(std::holds_alternative<protocol::DaemonToJm>(any), std::get<Json>(any).dump());
    return std::get<protocol::DaemonToJm>(any);
  }
  /// The next attempt report, skipping heartbeats; fails the test after 10 s without one.
  protocol::AttemptReport NextReport() {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (pending_.empty()) {
      REQUIRE_MESSAGE(std::chrono::steady_clock::now() < deadline, "no report within 10 s");
      protocol::DaemonToJm msg = Read();
      if (msg.has_report()) {
        for (auto& a : msg.report().attempts()) pending_.push_back(a);
      }
    }
    protocol::AttemptReport next = pending_.front();
    pending_.erase(pending_.begin());
    return next;
  }
  /// Skips the daemon's messages until it hangs up with an error (a JSON frame); its message.
  std::string NextError() {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (true) {
      REQUIRE_MESSAGE(std::chrono::steady_clock::now() < deadline, "no error within 10 s");
      auto any = ReadAny();
      if (auto* json = std::get_if<Json>(&any)) return StringMember(*json, "message");
    }
  }

 private:
  static Socket ListenOnLoopback() {
    auto s = Socket::Listen("127.0.0.1", 0);
    REQUIRE_MESSAGE(s.ok(), s.status().ToString());
    return std::move(*s);
  }
  Socket listener_;
  std::optional<BufferedSocket> conn_;
  std::vector<protocol::AttemptReport> pending_;
};

}  // namespace copse::vertex::testing
