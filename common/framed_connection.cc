#include "common/framed_connection.h"

#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstring>

#include "common/auth.h"
#include "common/deadline_io.h"
#include "common/logging.h"

namespace copse::net {

Result<std::pair<std::string, uint16_t>> ParseHostPort(const std::string& text, const std::string& what) {
  auto colon = text.rfind(':');
  if (colon == std::string::npos || colon == 0) {
    return Status::InvalidArgument(what + ": expected HOST:PORT, got \"" + text + "\"");
  }
  unsigned port = 0;
  const char* first = text.data() + colon + 1;
  const char* last = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(first, last, port);
  if (ec != std::errc() || ptr != last || port > 65535) {
    return Status::InvalidArgument(what + ": \"" + text.substr(colon + 1) + "\" is not a port number (0-65535)");
  }
  std::string host = text.substr(0, colon);
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  return std::make_pair(host, static_cast<uint16_t>(port));
}

std::string ControlLocalSocketName(const std::string& host, uint16_t port) {
  return "copse-jm/" + host + ":" + std::to_string(port);
}

asio::local::stream_protocol::endpoint AbstractEndpoint(const std::string& name) {
  return asio::local::stream_protocol::endpoint(std::string(1, '\0') + name);
}

namespace {

/// "address:port" of the peer (and no Nagle delay: control messages are small and awaited).
std::string TcpPeerName(asio::ip::tcp::socket& socket) {
  std::error_code ec, ignored;
  auto ep = socket.remote_endpoint(ec);
  socket.set_option(asio::ip::tcp::no_delay(true), ignored);
  return ec ? "?" : ep.address().to_string() + ":" + std::to_string(ep.port());
}

}  // namespace

FramedConnection::FramedConnection(asio::ip::tcp::socket socket, uint32_t max_frame_bytes)
    : peer_(TcpPeerName(socket)), socket_(std::move(socket)), max_frame_bytes_(max_frame_bytes), local_(false) {}

FramedConnection::FramedConnection(asio::local::stream_protocol::socket socket, uint32_t max_frame_bytes)
    : peer_("local socket"), socket_(std::move(socket)), max_frame_bytes_(max_frame_bytes), local_(true) {}

FramedConnection::FramedConnection(Socket socket, uint32_t max_frame_bytes, bool local, std::string peer)
    : peer_(std::move(peer)), socket_(std::move(socket)), max_frame_bytes_(max_frame_bytes), local_(local) {}

FramedConnection::~FramedConnection() = default;

void FramedConnection::UseTls(std::unique_ptr<tls::Session> session, std::string decrypted) {
  tls_ = std::move(session);
  decrypted_ = std::move(decrypted);
  std::lock_guard<std::mutex> lock(write_mu_);
  tls_ready_ = tls_->established();
}

void FramedConnection::Start(MessageHandler on_message, CloseHandler on_close) {
  on_message_ = std::move(on_message);
  on_close_ = std::move(on_close);
  if (tls_ && !tls_->established()) {
    // A server's session: the banner a plaintext client reads as its refusal, then the handshake,
    // which the client begins.
    auto first = tls_->Start();
    std::unique_lock<std::mutex> lock(write_mu_);
    QueueBytes(tls::Banner() + (first.ok() ? *first : std::string()), lock);
  }
  ReadHeader();
}

template <class Done>
void FramedConnection::ReadExactly(char* into, size_t n, Done done) {
  if (!tls_) {
    asio::async_read(socket_, asio::buffer(into, n), [done = std::move(done)](std::error_code ec, size_t) mutable { done(ec); });
    return;
  }
  ReadDecrypted(into, n, std::move(done));
}

void FramedConnection::ReadDecrypted(char* into, size_t n, std::function<void(std::error_code)> done) {
  const size_t take = std::min(n, decrypted_.size() - decrypted_pos_);
  std::memcpy(into, decrypted_.data() + decrypted_pos_, take);
  decrypted_pos_ += take;
  if (decrypted_pos_ == decrypted_.size()) {
    decrypted_.clear();
    decrypted_pos_ = 0;
  }
  if (take == n) {
    // Many small messages decrypted at once complete one another's reads without returning to
    // the io loop; every so often one goes through it, so the stack stays shallow.
    if (sync_reads_ < 32) {
      ++sync_reads_;
      done({});
      --sync_reads_;
    } else {
      asio::post(socket_.get_executor(), [done = std::move(done)] { done({}); });
    }
    return;
  }
  if (ciphertext_in_.empty()) ciphertext_in_.resize(kBodyChunkBytes);
  auto self = shared_from_this();
  socket_.async_read_some(asio::buffer(ciphertext_in_),
                          [self, into, n, take, done = std::move(done)](std::error_code ec, size_t got) mutable {
                            if (ec) return done(ec);
                            if (!self->TakeCiphertext(got)) return;
                            self->ReadDecrypted(into + take, n - take, std::move(done));
                          });
}

bool FramedConnection::TakeCiphertext(size_t got) {
  {
    // Under the write lock: records the session answers with (the handshake's, an alert) leave
    // before any that a sending thread encrypts after them.
    std::unique_lock<std::mutex> lock(write_mu_);
    auto reply = tls_->Receive(ciphertext_in_.data(), got, decrypted_);
    if (!reply.ok()) {
      QueueBytes(tls_->TakeUnsent(), lock);  // the alert saying why, which goes out at once
      if (lock.owns_lock()) lock.unlock();
      Logger("net")->warn("disconnecting {}: {}", peer_, reply.status().message());
      Close(reply.status());
      return false;
    }
    if (!reply->empty()) QueueBytes(std::move(*reply), lock);
  }
  if (tls_->established()) ReleaseHeldFrames();
  return true;
}

void FramedConnection::ReleaseHeldFrames() {
  std::unique_lock<std::mutex> lock(write_mu_);
  if (tls_ready_) return;
  tls_ready_ = true;
  auto held = std::move(held_frames_);
  held_frames_.clear();
  for (auto& frame : held) {
    if (!lock.owns_lock()) break;  // QueueBytes gave up on a peer that does not read
    auto cipher = tls_->Encrypt(frame);
    if (!cipher.ok()) return CloseFromAnyThread(cipher.status());
    QueueBytes(std::move(*cipher), lock);
  }
}

void FramedConnection::ReadHeader() {
  auto self = shared_from_this();
  ReadExactly(header_, sizeof(header_), [self](std::error_code ec) {
    if (ec) return self->Close(Status::Unavailable(ec == asio::error::eof ? "peer closed the connection" : ec.message()));
    auto h = wire::DecodeHeader(self->header_, self->max_frame_bytes_);
    if (!h.ok()) return self->SendErrorAndClose(h.status().message());
    if (h->type != wire::FrameType::kJson && !(h->type == wire::FrameType::kProto && self->on_proto_))
      return self->SendErrorAndClose("expected a control frame");
    self->body_type_ = h->type;
    self->ReadBody(h->length);
  });
}

void FramedConnection::ReadBody(uint32_t length) {
  body_.clear();
  ReadMoreBody(length);
}

void FramedConnection::ReadMoreBody(uint32_t length) {
  auto self = shared_from_this();  // alive through on_message_, which may drop every other owner
  const size_t filled = body_.size();
  if (filled < length) {
    // The body grows with what arrives (at most doubling), so a header announcing the largest
    // frame costs its sender the bytes, not this process the allocation.
    const size_t chunk = std::min<size_t>(length - filled, std::max<size_t>(kBodyChunkBytes, filled));
    body_.resize(filled + chunk);
    ReadExactly(body_.data() + filled, chunk, [self, length](std::error_code ec) {
      if (ec) return self->Close(Status::Unavailable(ec.message()));
      self->ReadMoreBody(length);
    });
    return;
  }
  if (body_type_ == wire::FrameType::kProto) {
    if (!open_) return;
    std::string body = std::move(body_);
    body_ = std::string();
    on_proto_(std::move(body));
    if (open_ && !close_after_write_) ReadHeader();
    return;
  }
  auto parsed = ParseJson(body_, "message from " + peer_);
  if (!parsed.ok() || !parsed->is_object() || !parsed->contains("op") || !(*parsed)["op"].is_string()) {
    return SendErrorAndClose(parsed.ok() ? "expected a JSON object with a string \"op\"" : parsed.status().message());
  }
  if (!open_) return;
  body_.clear();
  if (body_.capacity() > kBodyChunkBytes) body_.shrink_to_fit();  // one large message is not kept
  on_message_(std::move(*parsed));
  if (open_ && !close_after_write_) ReadHeader();
}

void FramedConnection::Send(const Json& message) { SendRaw(wire::EncodeFrame(wire::FrameType::kJson, DumpJson(message))); }

size_t FramedConnection::queued_bytes() const {
  std::lock_guard<std::mutex> lock(write_mu_);
  return queued_bytes_;
}

void FramedConnection::SendRaw(std::string frame) {
  std::unique_lock<std::mutex> lock(write_mu_);
  if (!open_ || overflowed_) return;
  if (tls_) {
    if (!tls_ready_) return held_frames_.push_back(std::move(frame));
    auto cipher = tls_->Encrypt(frame);
    if (!cipher.ok()) return CloseFromAnyThread(cipher.status());
    frame = std::move(*cipher);
  }
  QueueBytes(std::move(frame), lock);
}

void FramedConnection::QueueBytes(std::string frame, std::unique_lock<std::mutex>& lock) {
  if (!open_ || overflowed_) return;
  if (writing_) {
    if (queued_bytes_ + frame.size() > kMaxQueuedBytes) {
      // A peer that does not read what it asked for must not grow this process without end.
      overflowed_ = true;
      lock.unlock();
      asio::post(socket_.get_executor(), [self = shared_from_this()] {
        self->Close(Status::Unavailable("the peer does not read: over " + std::to_string(kMaxQueuedBytes >> 20) +
                                        " MiB of messages wait for it"));
      });
      return;
    }
    queued_bytes_ += frame.size();
    out_.push_back(std::move(frame));
    return;
  }
  const size_t written = WriteWithoutBlocking(frame);
  if (written == frame.size()) return;
  // The socket is full (or failed: the asynchronous write reports it on the io thread).
  frame.erase(0, written);
  queued_bytes_ += frame.size();
  out_.push_back(std::move(frame));
  writing_ = true;
  asio::post(socket_.get_executor(), [self = shared_from_this()] {
    std::lock_guard<std::mutex> lock(self->write_mu_);
    if (self->open_) self->WriteNext();
  });
}

size_t FramedConnection::WriteWithoutBlocking(const std::string& frame) {
  size_t done = 0;
  while (done < frame.size()) {
    const ssize_t n = ::send(socket_.native_handle(), frame.data() + done, frame.size() - done, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (n > 0) {
      done += static_cast<size_t>(n);
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else {
      break;
    }
  }
  return done;
}

void FramedConnection::WriteNext() {
  auto self = shared_from_this();
  asio::async_write(socket_, asio::buffer(out_.front()), [self](std::error_code ec, size_t) {
    std::unique_lock<std::mutex> lock(self->write_mu_);
    if (ec) {
      lock.unlock();
      return self->Close(Status::Unavailable(ec.message()));
    }
    self->queued_bytes_ -= self->out_.front().size();
    self->out_.pop_front();
    if (!self->out_.empty()) return self->WriteNext();
    self->writing_ = false;
    if (self->close_after_write_) {
      lock.unlock();
      self->Close(Status::Cancelled("closed after error"));
    }
  });
}

void FramedConnection::SendErrorAndClose(const std::string& message) {
  if (!open_) return;
  Logger("net")->warn("disconnecting {}: {}", peer_, message);
  Send({{"op", "error"}, {"message", message}});
  bool written;
  {
    std::lock_guard<std::mutex> lock(write_mu_);
    close_after_write_ = true;
    written = !writing_;
  }
  if (written) Close(Status::InvalidArgument(message));
  // The close handler reports the protocol error, not the later socket shutdown.
  if (on_close_) {
    auto handler = std::move(on_close_);
    on_close_ = nullptr;
    handler(Status::InvalidArgument(message));
  }
}

void FramedConnection::CloseFromAnyThread(Status why) {
  asio::post(socket_.get_executor(), [self = shared_from_this(), why = std::move(why)] { self->Close(why); });
}

void FramedConnection::Close(const Status& why) {
  if (!open_.exchange(false)) return;
  {
    std::lock_guard<std::mutex> lock(write_mu_);
    std::error_code ec;
    socket_.shutdown(asio::socket_base::shutdown_both, ec);
    socket_.close(ec);
  }
  if (on_close_) {
    auto handler = std::move(on_close_);
    on_close_ = nullptr;
    handler(why);
  }
  on_message_ = nullptr;
  on_proto_ = nullptr;
}

namespace {

std::string Ms(std::chrono::milliseconds t) { return std::to_string(t.count()) + " ms"; }

/// How a Timeout names the wait when a caller gave a deadline, not a duration.
const std::string kTimeAllowed = "the time allowed";

}  // namespace

template <class Endpoint>
Result<std::unique_ptr<BlockingClient>> BlockingClient::ConnectTo(const Endpoint& to, Deadline deadline,
                                                                  const std::string& budget, bool local, std::string peer) {
  std::unique_ptr<BlockingClient> c(new BlockingClient(local, std::move(peer)));
  const std::error_code ec = ConnectBefore(c->io_, c->socket_, asio::generic::stream_protocol::endpoint(to), deadline);
  if (ec == asio::error::timed_out) return Status::Timeout("cannot connect to " + c->peer_ + ": no answer within " + budget);
  if (ec == asio::error::connection_refused && local) return Status::NotFound("nothing listens on " + c->peer_);
  if (ec) return Status::Unavailable("cannot connect to " + c->peer_ + ": " + ec.message());
  if (local) {
    // A full accept queue fails a non-blocking Unix connect with EAGAIN, which asio takes for
    // a connect in progress; should one end as done, the socket is still unconnected.
    std::error_code unconnected;
    c->socket_.remote_endpoint(unconnected);
    if (unconnected) return Status::Unavailable("cannot connect to " + c->peer_ + ": its accept queue is full");
  } else {
    std::error_code ignored;  // control messages are small and awaited: no Nagle delay
    c->socket_.set_option(asio::ip::tcp::no_delay(true), ignored);
  }
  return c;
}

Result<std::unique_ptr<BlockingClient>> BlockingClient::ConnectTcp(const asio::ip::tcp::endpoint& to, Deadline deadline) {
  return ConnectTo(to, deadline, kTimeAllowed, false, to.address().to_string() + ":" + std::to_string(to.port()));
}

Result<std::unique_ptr<BlockingClient>> BlockingClient::ConnectLocal(const std::string& name, Deadline deadline) {
  return ConnectTo(AbstractEndpoint(name), deadline, kTimeAllowed, true, "local socket \"" + name + "\"");
}

Result<std::unique_ptr<BlockingClient>> BlockingClient::Connect(const std::string& host, uint16_t port, const std::string& secret,
                                                                const std::string& role, std::chrono::milliseconds timeout,
                                                                const tls::Context* tls) {
  std::error_code ec;
  auto address = asio::ip::make_address(host == "localhost" ? "127.0.0.1" : host, ec);
  if (ec) return Status::InvalidArgument("\"" + host + "\" is not an IP address");
  const std::string peer = host + ":" + std::to_string(port);
  COPSE_ASSIGN_OR_RETURN(auto c, ConnectTo(asio::ip::tcp::endpoint(address, port), std::chrono::steady_clock::now() + timeout,
                                           Ms(timeout), false, peer));
  const Deadline handshake = std::chrono::steady_clock::now() + timeout;  // TLS's and the secret's, together
  if (tls) COPSE_RETURN_NOT_OK(c->StartTls(*tls, handshake));
  COPSE_RETURN_NOT_OK(c->Authenticate(secret, role, handshake, Ms(timeout)).WithContext("authentication with " + peer));
  return c;
}

Status BlockingClient::Authenticate(const std::string& secret, const std::string& role, Deadline deadline) {
  return Authenticate(secret, role, deadline, kTimeAllowed);
}

Status BlockingClient::Authenticate(const std::string& secret, const std::string& role, Deadline deadline,
                                    const std::string& budget) {
  COPSE_ASSIGN_OR_RETURN(Json hello, ReceiveBefore(deadline, budget));
  if (tls::IsBanner(hello)) return Status::FailedPrecondition(StringMember(hello, "message"));
  server_runs_tls_ = hello.value("tls", false) == true;
  auto answer = auth::AnswerHello(hello, secret, role);
  if (!answer.ok()) return Status::Unavailable("it did not greet like a copse server: " + answer.status().message());
  COPSE_RETURN_NOT_OK(SendBefore(answer->message, deadline, budget));
  COPSE_ASSIGN_OR_RETURN(Json welcome, ReceiveBefore(deadline, budget));
  return auth::CheckWelcome(welcome, secret, *answer);
}

Status BlockingClient::SendBefore(const Json& message, Deadline deadline, const std::string& budget) {
  std::string body = DumpJson(message);
  if (body.size() > wire::kMaxControlBytes) {  // the job manager would hang up on it mid-write
    return Status::InvalidArgument("a message of " + std::to_string(body.size() >> 20) + " MiB is more than the " +
                                   std::to_string(wire::kMaxControlBytes >> 20) + " MiB the job manager accepts");
  }
  return WriteStream(wire::EncodeFrame(wire::FrameType::kJson, body), deadline, budget);
}

Status BlockingClient::WriteRaw(const std::string& bytes, Deadline deadline, const std::string& budget) {
  const std::error_code ec = WriteBefore(io_, socket_, asio::buffer(bytes), deadline);
  if (ec == asio::error::timed_out) return Status::Timeout("the server did not take a message within " + budget);
  if (ec) return Status::Unavailable("send failed: " + ec.message());
  return Status::OK();
}

Status BlockingClient::WriteStream(const std::string& bytes, Deadline deadline, const std::string& budget) {
  if (!tls_) return WriteRaw(bytes, deadline, budget);
  COPSE_ASSIGN_OR_RETURN(std::string cipher, tls_->Encrypt(bytes));
  return WriteRaw(cipher, deadline, budget);
}

Status BlockingClient::ReceiveTls(tls::Session& session, size_t got, Deadline deadline, const std::string& budget) {
  auto reply = session.Receive(ciphertext_in_.data(), got, decrypted_);
  if (!reply.ok()) {
    (void)WriteRaw(session.TakeUnsent(), deadline, budget);  // the alert saying why, best effort
    return reply.status();
  }
  return reply->empty() ? Status::OK() : WriteRaw(*reply, deadline, budget);
}

Result<size_t> BlockingClient::ReadRawSome(Deadline deadline, const std::string& budget) {
  if (ciphertext_in_.empty()) ciphertext_in_.resize(FramedConnection::kBodyChunkBytes);
  size_t got = 0;
  const std::error_code result = ReadSomeBefore(io_, socket_, asio::buffer(ciphertext_in_), deadline, got);
  if (result == asio::error::timed_out) return Status::Timeout("no reply within " + budget);
  if (result) return Status::Unavailable(result == asio::error::eof ? "server closed the connection" : result.message());
  return got;
}

Status BlockingClient::ReadExact(char* data, size_t n, Deadline deadline, const std::string& budget) {
  if (!tls_) {
    const std::error_code result = ReadBefore(io_, socket_, asio::buffer(data, n), deadline);
    if (result == asio::error::timed_out) return Status::Timeout("no reply within " + budget);
    if (result) return Status::Unavailable(result == asio::error::eof ? "server closed the connection" : result.message());
    return Status::OK();
  }
  while (decrypted_.size() < n) {
    COPSE_ASSIGN_OR_RETURN(size_t got, ReadRawSome(deadline, budget));
    COPSE_RETURN_NOT_OK(ReceiveTls(*tls_, got, deadline, budget));
  }
  std::memcpy(data, decrypted_.data(), n);
  decrypted_.erase(0, n);
  return Status::OK();
}

Status BlockingClient::StartTls(const tls::Context& context, Deadline deadline) {
  // The banner is plaintext: read it before the session exists.
  COPSE_ASSIGN_OR_RETURN(Json banner, ReceiveBefore(deadline, kTimeAllowed));
  COPSE_RETURN_NOT_OK(tls::CheckBanner(banner, peer_));
  auto session = std::make_unique<tls::Session>(context, tls::Session::Role::kClient, peer_);
  COPSE_ASSIGN_OR_RETURN(std::string hello, session->Start());
  COPSE_RETURN_NOT_OK(WriteRaw(hello, deadline, kTimeAllowed));
  while (!session->established()) {
    COPSE_ASSIGN_OR_RETURN(size_t got, ReadRawSome(deadline, kTimeAllowed));
    COPSE_RETURN_NOT_OK(ReceiveTls(*session, got, deadline, kTimeAllowed));
  }
  tls_ = std::move(session);
  return Status::OK();
}

Result<wire::Frame> BlockingClient::ReceiveFrameBefore(Deadline deadline, const std::string& budget) {
  char header[wire::kHeaderBytes];
  COPSE_RETURN_NOT_OK(ReadExact(header, sizeof(header), deadline, budget));
  COPSE_ASSIGN_OR_RETURN(auto h, wire::DecodeHeader(header, wire::kMaxControlBytes));
  wire::Frame frame{h.type, std::string(h.length, '\0')};
  COPSE_RETURN_NOT_OK(ReadExact(frame.body.data(), frame.body.size(), deadline, budget));
  return frame;
}

Result<Json> BlockingClient::ReceiveBefore(Deadline deadline, const std::string& budget) {
  COPSE_ASSIGN_OR_RETURN(wire::Frame frame, ReceiveFrameBefore(deadline, budget));
  if (frame.type != wire::FrameType::kJson) return Status::InvalidArgument("the server sent a binary frame where JSON was due");
  COPSE_ASSIGN_OR_RETURN(Json msg, ParseJson(frame.body, "reply"));
  if (!msg.is_object()) return Status::InvalidArgument("the server sent a " + JsonTypeName(msg) + ", not a message");
  return msg;
}

Status BlockingClient::Send(const Json& message, std::chrono::milliseconds timeout) {
  return SendBefore(message, std::chrono::steady_clock::now() + timeout, Ms(timeout));
}

Status BlockingClient::Send(const Json& message, Deadline deadline) { return SendBefore(message, deadline, kTimeAllowed); }

namespace {

Result<Json> ErrorReplyAsStatus(Result<Json> reply) {
  if (reply.ok() && StringMember(*reply, "op") == "error") {
    const std::string message = StringMember(*reply, "message");
    return Status::FailedPrecondition(message.empty() ? "error" : message);
  }
  return reply;
}

}  // namespace

Result<Json> BlockingClient::Receive(std::chrono::milliseconds timeout) {
  return ErrorReplyAsStatus(ReceiveBefore(std::chrono::steady_clock::now() + timeout, Ms(timeout)));
}

Result<Json> BlockingClient::Receive(Deadline deadline) { return ErrorReplyAsStatus(ReceiveBefore(deadline, kTimeAllowed)); }

Result<Json> BlockingClient::Call(const Json& request, std::chrono::milliseconds timeout) {
  COPSE_RETURN_NOT_OK(Send(request, timeout));
  return Receive(timeout);
}

Result<Json> BlockingClient::Call(const Json& request, Deadline deadline) {
  COPSE_RETURN_NOT_OK(Send(request, deadline));
  return Receive(deadline);
}

Status BlockingClient::SendFrame(const std::string& frame, Deadline deadline) {
  return WriteStream(frame, deadline, kTimeAllowed);
}

Result<wire::Frame> BlockingClient::ReceiveFrame(Deadline deadline) {
  COPSE_ASSIGN_OR_RETURN(wire::Frame frame, ReceiveFrameBefore(deadline, kTimeAllowed));
  if (frame.type == wire::FrameType::kJson) {
    COPSE_ASSIGN_OR_RETURN(Json msg, ParseJson(frame.body, "reply"));
    COPSE_RETURN_NOT_OK(ErrorReplyAsStatus(std::move(msg)).status());
  }
  return frame;
}

Result<std::shared_ptr<FramedConnection>> BlockingClient::Detach(asio::io_context& io, uint32_t max_frame_bytes) {
  std::error_code ec;
  const auto protocol = socket_.local_endpoint(ec).protocol();
  const auto fd = ec ? -1 : socket_.release(ec);
  if (ec) return Status::Unavailable(peer_ + ": " + ec.message());
  Socket on_io(io);
  on_io.assign(protocol, fd, ec);
  if (ec) {
    ::close(fd);
    return Status::Unavailable(peer_ + ": " + ec.message());
  }
  auto conn = std::make_shared<FramedConnection>(std::move(on_io), max_frame_bytes, local_, peer_);
  if (tls_) conn->UseTls(std::move(tls_), std::move(decrypted_));
  return conn;
}

}  // namespace copse::net
