#pragma once
// Framed JSON connections (common/wire.h frames) over TCP, or over a local (Unix domain) socket
// between processes on one host, on both sides of the control plane.
//
// FramedConnection: an asynchronous connection owned by an asio::io_context thread. Received
// frames are delivered to a handler on the io thread. Send() may be called from any thread:
// messages are written in the order Send() was called, and while nothing is queued the calling
// thread writes the frame itself (a worker's message needs no io-thread wakeup, which on a
// busy host would take the worker's core). Start() and Close() belong to the io thread.
// Any protocol violation (bad header, oversized frame, body that is not a JSON object) closes
// the connection with a Status saying why; it never throws out of the io thread. Memory is
// bounded by what the peer does, not what it announces: a body is allocated as its bytes
// arrive, and a peer that leaves kMaxQueuedBytes of messages unread is disconnected.
//
// TLS (common/tls.h): either side may run over a tls::Session. A server's connection starts it
// (the banner, then the handshake, with messages sent meanwhile held until it is done); a
// client's arrives established from BlockingClient::Detach. Under TLS every frame is encrypted
// by the sending thread under the write lock (so records leave in Send() order) and the
// ciphertext goes out as above; reads decrypt on the io thread.
//
// BlockingClient: a synchronous conversation (a CLI's, a test's, a daemon's registration) with
// every step bounded; it can hand its connection over to a FramedConnection.
#include <atomic>
#include <chrono>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <asio.hpp>

#include "common/deadline_io.h"
#include "common/json_util.h"
#include "common/status.h"
#include "common/tls.h"
#include "common/wire.h"

namespace copse::net {

/// "host:port" -> (host, port); InvalidArgument naming `what` (e.g. "--jm") when malformed.
Result<std::pair<std::string, uint16_t>> ParseHostPort(const std::string& text, const std::string& what);

/// The abstract-namespace name (no leading NUL) of the local socket a control server listening
/// on host:port (the job manager) offers beside it: clients on its host and in its network
/// namespace reach it there without the TCP/IP stack. `host` is the address in its canonical
/// text form (asio::ip::address::to_string), so both sides spell it alike.
std::string ControlLocalSocketName(const std::string& host, uint16_t port);

/// The endpoint of an abstract-namespace local socket named `name`.
asio::local::stream_protocol::endpoint AbstractEndpoint(const std::string& name);

class FramedConnection : public std::enable_shared_from_this<FramedConnection> {
 public:
  /// A body is read this much at a time at first, then up to as much as has arrived.
  static constexpr size_t kBodyChunkBytes = 64 << 10;
  /// Messages waiting for a peer that does not read beyond this close the connection.
  static constexpr size_t kMaxQueuedBytes = size_t{256} << 20;
  using MessageHandler = std::function<void(Json)>;
  /// Gets the body of each kProto frame (protocol/codec.h decodes it).
  using ProtoHandler = std::function<void(std::string)>;
  using CloseHandler = std::function<void(const Status&)>;

  using Socket = asio::generic::stream_protocol::socket;

  FramedConnection(asio::ip::tcp::socket socket, uint32_t max_frame_bytes);
  /// Over a local socket: no TCP/IP stack, so a send costs the sender a copy and a wakeup, not
  /// the receiver's whole loopback path as well.
  FramedConnection(asio::local::stream_protocol::socket socket, uint32_t max_frame_bytes);
  /// A connected socket of either kind, with its peer's name.
  FramedConnection(Socket socket, uint32_t max_frame_bytes, bool local, std::string peer);
  ~FramedConnection();

  /// Runs the connection over `session` (before Start): a server session not established yet
  /// sends the banner and does the handshake first; `decrypted` is plaintext already received
  /// (a BlockingClient's, handed over with the session).
  void UseTls(std::unique_ptr<tls::Session> session, std::string decrypted = {});
  bool tls() const { return tls_ != nullptr; }

  /// Starts reading; `on_message` gets each JSON object, `on_close` once when it ends. Without
  /// a proto handler (set_proto_handler) a kProto frame closes the connection.
  void Start(MessageHandler on_message, CloseHandler on_close);
  /// Where kProto frames' bodies go; before Start, or on the io thread.
  void set_proto_handler(ProtoHandler on_proto) { on_proto_ = std::move(on_proto); }
  /// Thread-safe (see above).
  void Send(const Json& message);
  /// Sends an already-encoded frame (header + body); thread-safe.
  void SendRaw(std::string frame);
  /// Sends {"op":"error","message":…} and closes once it is written.
  void SendErrorAndClose(const std::string& message);
  void Close(const Status& why);
  /// Close from any thread: runs Close on the io thread.
  void CloseFromAnyThread(Status why);
  bool open() const { return open_; }
  /// Bytes of messages queued for the peer and not written yet; thread-safe. A sender of many
  /// messages from another thread waits while this is large, instead of overflowing the queue.
  size_t queued_bytes() const;
  std::string peer() const { return peer_; }
  /// Whether it runs over a local socket.
  bool local() const { return local_; }
  /// The largest frame accepted from the next one on; on the io thread (a message handler).
  /// A server starts small and raises it once the peer has authenticated, so that a stranger's
  /// header cannot make it allocate the largest body.
  void set_max_frame_bytes(uint32_t bytes) { max_frame_bytes_ = bytes; }

 private:
  void ReadHeader();
  void ReadBody(uint32_t length);
  /// Reads the rest of a body of `length` bytes into body_, then delivers it.
  void ReadMoreBody(uint32_t length);
  /// Reads exactly `n` bytes of the byte stream (decrypted under TLS), then calls done(ec).
  template <class Done>
  void ReadExactly(char* into, size_t n, Done done);
  /// ReadExactly's TLS path: from decrypted_, reading and decrypting more as needed.
  void ReadDecrypted(char* into, size_t n, std::function<void(std::error_code)> done);
  /// Sends bytes as they are (ciphertext under TLS, or plaintext without): the write path of
  /// the comment at the top. Requires write_mu_ held by `lock`.
  void QueueBytes(std::string bytes, std::unique_lock<std::mutex>& lock);
  /// Feeds `got` bytes of ciphertext_in_ to the session; false when it failed (the connection
  /// is closed then).
  bool TakeCiphertext(size_t got);
  /// Once the TLS handshake is over: encrypts and queues what Send() held back meanwhile.
  void ReleaseHeldFrames();
  /// Writes out_.front() asynchronously. Requires write_mu_; on the io thread.
  void WriteNext();
  /// Writes what the socket takes of `frame` now without blocking; the bytes written.
  /// Requires write_mu_.
  size_t WriteWithoutBlocking(const std::string& frame);

  std::string peer_;  // before socket_: a TCP peer's name is read before the socket moves in
  Socket socket_;
  uint32_t max_frame_bytes_;
  bool local_;
  std::atomic<bool> open_{true};
  char header_[wire::kHeaderBytes];
  std::string body_;
  /// Guards the writing side: the queue, whether an asynchronous write owns it, and the socket's
  /// closing (so no thread writes to a closed, possibly reused, descriptor).
  mutable std::mutex write_mu_;
  std::deque<std::string> out_;  // frames not yet written; out_.front() is being written
  size_t queued_bytes_ = 0;      // in out_
  bool overflowed_ = false;      // out_ outgrew kMaxQueuedBytes: closing, nothing more is sent
  bool writing_ = false;         // an asynchronous write (or one posted) owns out_
  bool close_after_write_ = false;
  // TLS: the session (null: plaintext); plaintext decrypted and not read yet (io thread);
  // ciphertext read buffer (io thread); frames sent before the handshake ended (write_mu_).
  std::unique_ptr<tls::Session> tls_;
  std::string decrypted_;
  size_t decrypted_pos_ = 0;
  std::vector<char> ciphertext_in_;
  int sync_reads_ = 0;      // completions run without returning to the io loop (bounds recursion)
  bool tls_ready_ = false;  // under write_mu_: frames are encrypted and sent, not held
  std::vector<std::string> held_frames_;
  MessageHandler on_message_;
  ProtoHandler on_proto_;
  wire::FrameType body_type_ = wire::FrameType::kJson;  // of the frame being read
  CloseHandler on_close_;
};

/// A synchronous conversation with a control server (the job manager): a CLI's requests, a
/// test's, a daemon's registration. Connecting, authenticating and every message are bounded
/// (a timeout per step, or one deadline for several); a timeout closes the connection (the
/// stream's position is lost). An {"op":"error"} reply becomes a FailedPrecondition carrying the
/// server's message.
class BlockingClient {
 public:
  using Socket = asio::generic::stream_protocol::socket;

  /// Connects over TCP and authenticates with `secret` as `role` ("client", "daemon", …).
  /// Connecting, then the whole handshake, each wait at most `timeout`.
  /// With `tls`, the connection runs over TLS (common/tls.h) before authenticating.
  static Result<std::unique_ptr<BlockingClient>> Connect(const std::string& host, uint16_t port, const std::string& secret,
                                                         const std::string& role,
                                                         std::chrono::milliseconds timeout = std::chrono::seconds(10),
                                                         const tls::Context* tls = nullptr);
  /// Connects, without authenticating, before `deadline`: over TCP, or to the abstract local
  /// socket `name` (NotFound when nothing listens there; Unavailable when its accept queue is
  /// full). Timeout when the deadline passes first.
  static Result<std::unique_ptr<BlockingClient>> ConnectTcp(const asio::ip::tcp::endpoint& to, Deadline deadline);
  static Result<std::unique_ptr<BlockingClient>> ConnectLocal(const std::string& name, Deadline deadline);

  /// Reads a TLS server's banner and does the handshake (common/tls.h); FailedPrecondition when
  /// the server speaks plaintext, Unavailable when the handshake fails (naming OpenSSL's reason).
  Status StartTls(const tls::Context& context, Deadline deadline);

  /// Answers the server's hello with `secret` as `role` and checks that its welcome proves it
  /// holds the secret too; PermissionDenied when it refuses us or cannot prove it.
  Status Authenticate(const std::string& secret, const std::string& role, Deadline deadline);

  /// Timeout when the server has not taken the whole message within `timeout` (it stopped reading).
  Status Send(const Json& message, std::chrono::milliseconds timeout = std::chrono::seconds(30));
  Status Send(const Json& message, Deadline deadline);
  /// The next message; Timeout when none arrives in `timeout`.
  Result<Json> Receive(std::chrono::milliseconds timeout = std::chrono::seconds(30));
  Result<Json> Receive(Deadline deadline);
  /// Send then Receive.
  Result<Json> Call(const Json& request, std::chrono::milliseconds timeout = std::chrono::seconds(30));
  Result<Json> Call(const Json& request, Deadline deadline);
  /// An encoded frame (protocol::EncodeFrame's), and the next frame of any type: a JSON
  /// {"op":"error"} becomes FailedPrecondition with the server's message.
  Status SendFrame(const std::string& frame, Deadline deadline);
  Result<wire::Frame> ReceiveFrame(Deadline deadline);

  /// Whether the server's hello said it runs TLS (set by Authenticate): a daemon without TLS
  /// that reached it through its plaintext local socket must not go on (security.md).
  bool server_runs_tls() const { return server_runs_tls_; }

  /// The connected socket's descriptor (to ask the kernel who holds a local socket's other end).
  int native_handle() { return socket_.native_handle(); }
  /// Whether it runs over a local socket.
  bool local() const { return local_; }
  /// Moves the connection onto `io` as an asynchronous FramedConnection (a daemon's, once it has
  /// registered); this client is closed afterwards.
  Result<std::shared_ptr<FramedConnection>> Detach(asio::io_context& io, uint32_t max_frame_bytes);

 private:
  BlockingClient(bool local, std::string peer) : socket_(io_), local_(local), peer_(std::move(peer)) {}
  /// `budget` names the wait in a Timeout's message ("300 ms").
  template <class Endpoint>
  static Result<std::unique_ptr<BlockingClient>> ConnectTo(const Endpoint& to, Deadline deadline, const std::string& budget,
                                                           bool local, std::string peer);
  Status Authenticate(const std::string& secret, const std::string& role, Deadline deadline, const std::string& budget);
  Status SendBefore(const Json& message, Deadline deadline, const std::string& budget);
  /// The next message as sent, {"op":"error"} included.
  Result<Json> ReceiveBefore(Deadline deadline, const std::string& budget);
  Result<wire::Frame> ReceiveFrameBefore(Deadline deadline, const std::string& budget);
  /// Reads exactly n bytes of the byte stream (decrypted under TLS).
  Status ReadExact(char* data, size_t n, Deadline deadline, const std::string& budget);
  /// Reads what arrives next (ciphertext under TLS) into ciphertext_in_; the bytes read.
  Result<size_t> ReadRawSome(Deadline deadline, const std::string& budget);
  /// Writes bytes of the stream (encrypting them under TLS).
  Status WriteStream(const std::string& bytes, Deadline deadline, const std::string& budget);
  Status WriteRaw(const std::string& bytes, Deadline deadline, const std::string& budget);
  /// Feeds `got` bytes of ciphertext_in_ to `session`, sending what it answers (its alert too,
  /// when it fails).
  Status ReceiveTls(tls::Session& session, size_t got, Deadline deadline, const std::string& budget);

  asio::io_context io_;
  Socket socket_;
  bool local_;
  std::string peer_;  // "host:port" or "local socket NAME"
  std::unique_ptr<tls::Session> tls_;
  bool server_runs_tls_ = false;
  std::string decrypted_;  // under TLS: plaintext received and not read yet
  std::vector<char> ciphertext_in_;
};

}  // namespace copse::net
