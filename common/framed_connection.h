#pragma once
// Framed JSON connections over TCP (common/wire.h frames), on both sides of the control plane.
//
// FramedConnection: an asynchronous connection owned by an asio::io_context thread. Messages
// are queued and written in order; received frames are delivered to a handler on the io
// thread. Not thread-safe: call Send() only on the io thread (post() there from others).
// Any protocol violation (bad header, oversized frame, body that is not a JSON object) closes
// the connection with a Status saying why; it never throws out of the io thread.
//
// BlockingClient: a synchronous client for CLIs and tests, with timeouts.
#include <chrono>
#include <deque>
#include <functional>
#include <memory>
#include <string>

#include <asio.hpp>

#include "common/json_util.h"
#include "common/status.h"
#include "common/wire.h"

namespace copse::net {

/// "host:port" -> (host, port); InvalidArgument naming `what` (e.g. "--jm") when malformed.
Result<std::pair<std::string, uint16_t>> ParseHostPort(const std::string& text, const std::string& what);

class FramedConnection : public std::enable_shared_from_this<FramedConnection> {
 public:
  using MessageHandler = std::function<void(Json)>;
  using CloseHandler = std::function<void(const Status&)>;

  FramedConnection(asio::ip::tcp::socket socket, uint32_t max_frame_bytes);
  ~FramedConnection();

  /// Starts reading; `on_message` gets each JSON object, `on_close` once when it ends.
  void Start(MessageHandler on_message, CloseHandler on_close);
  void Send(const Json& message);
  /// Sends an already-encoded frame (header + body).
  void SendRaw(std::string frame);
  /// Sends {"op":"error","message":…} and closes once it is written.
  void SendErrorAndClose(const std::string& message);
  void Close(const Status& why);
  bool open() const { return open_; }
  std::string peer() const { return peer_; }

 private:
  void ReadHeader();
  void ReadBody(uint32_t length);
  void WriteNext();

  asio::ip::tcp::socket socket_;
  uint32_t max_frame_bytes_;
  std::string peer_;
  bool open_ = true;
  bool close_after_write_ = false;
  char header_[wire::kHeaderBytes];
  std::string body_;
  std::deque<std::string> out_;
  MessageHandler on_message_;
  CloseHandler on_close_;
};

class BlockingClient {
 public:
  /// Connects and authenticates with `secret` as `role` ("client", "daemon", …).
  static Result<std::unique_ptr<BlockingClient>> Connect(const std::string& host, uint16_t port,
                                                         const std::string& secret, const std::string& role,
                                                         std::chrono::milliseconds timeout = std::chrono::seconds(10));
  Status Send(const Json& message);
  /// The next message; Timeout when none arrives in `timeout`; an {"op":"error"} reply becomes
  /// a Status with the server's message.
  Result<Json> Receive(std::chrono::milliseconds timeout = std::chrono::seconds(30));
  /// Send then Receive.
  Result<Json> Call(const Json& request, std::chrono::milliseconds timeout = std::chrono::seconds(30));

 private:
  BlockingClient() : socket_(io_) {}
  Status ReadExact(char* data, size_t n, std::chrono::milliseconds timeout);

  asio::io_context io_;
  asio::ip::tcp::socket socket_;
};

}  // namespace copse::net
