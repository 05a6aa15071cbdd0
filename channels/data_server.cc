#include "channels/data_server.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <list>
#include <mutex>
#include <optional>
#include <system_error>
#include <thread>
#include <vector>

#include "channels/protocol_keys.h"
#include "channels/record_format.h"
#include "channels/socket.h"
#include "common/auth.h"
#include "common/logging.h"
#include "common/thread_name.h"
#include "protocol/codec.h"

namespace copse::chan {

using internal::BufferedSocket;
using internal::Socket;
using wire::FrameType;

namespace {

constexpr uint32_t kMaxRequestBytes = 64 << 10;
constexpr uint64_t kMaxFetchWaitMs = 5'000;     // the longest a fetch waits for its output to appear
constexpr int kLocalSendBufferBytes = 4 << 20;  // local sockets (default ~208 KiB): 4.1 vs 3.5 GB/s at 8 MiB

/// The kEnd frame's body of a fetch that failed with `st`.
std::string EndBody(const Status& st) {
  protocol::FetchEnd end;
  end.set_code(std::string(StatusCodeName(st.code())));
  end.set_message(st.message());
  return end.SerializeAsString();
}

/// The kEnd frame's body of a fetch that succeeded.
std::string EndBody(uint64_t messages, uint64_t bytes, bool handoff) {
  protocol::FetchEnd end;
  end.set_ok(true);
  end.set_messages(messages);
  end.set_bytes(bytes);
  end.set_handoff(handoff);
  return end.SerializeAsString();
}

/// Builds data frames out of records and writes them with one sendmsg each, pointing into the
/// stored Buffers (no copy of message bytes in user space; a payload's bytes are gathered in
/// place, not encoded).
class FrameSender {
 public:
  explicit FrameSender(Socket& s) : sock_(s) {}

  Status Add(const Buffer& m, uint64_t checksum) {
    if (m.size() > internal::kMaxPieceBytes) {
      COPSE_RETURN_NOT_OK(Flush());
      return SendPieces(m, checksum);
    }
    auto& h = headers_[records_.size()];
    internal::EncodeRecordHeader(h.data(), static_cast<uint32_t>(m.size()), checksum);
    records_.push_back(m);
    body_bytes_ += internal::kRecordHeaderBytes + m.size();
    if (body_bytes_ >= internal::kBatchBytes || records_.size() == internal::kBatchRecords) return Flush();
    return Status::OK();
  }

  Status Flush() {
    if (records_.empty()) return Status::OK();
    iov_.clear();
    auto head = wire::EncodeHeader(FrameType::kData, static_cast<uint32_t>(1 + body_bytes_));
    std::memcpy(frame_head_.data(), head.data(), head.size());
    frame_head_[wire::kHeaderBytes] = internal::kTagMessages;
    iov_.push_back({frame_head_.data(), frame_head_.size()});
    for (size_t i = 0; i < records_.size(); ++i) {
      iov_.push_back({headers_[i].data(), internal::kRecordHeaderBytes});
      for (std::string_view span : records_[i].spans()) iov_.push_back({const_cast<char*>(span.data()), span.size()});
    }
    Status st = sock_.WriteV(iov_.data(), iov_.size());
    records_.clear();
    body_bytes_ = 0;
    return st;
  }

 private:
  Status SendPieces(const Buffer& m, uint64_t checksum) {
    const std::vector<std::string_view> spans = m.spans();
    size_t span = 0, in_span = 0;  // where the next piece starts
    size_t off = 0;
    while (off < m.size()) {
      size_t piece = std::min(internal::kMaxPieceBytes, m.size() - off);
      char head[wire::kHeaderBytes + 1 + 16];
      size_t head_len = wire::kHeaderBytes + 1;
      if (off == 0) {
        internal::PutU64(head + head_len, m.size());
        internal::PutU64(head + head_len + 8, checksum);
        head_len += 16;
      }
      auto h = wire::EncodeHeader(FrameType::kData, static_cast<uint32_t>(head_len - wire::kHeaderBytes + piece));
      std::memcpy(head, h.data(), h.size());
      head[wire::kHeaderBytes] = off == 0 ? internal::kTagFirstPiece : internal::kTagContinuation;
      std::vector<iovec> iov{{head, head_len}};
      for (size_t left = piece; left > 0;) {
        const size_t take = std::min(left, spans[span].size() - in_span);
        iov.push_back({const_cast<char*>(spans[span].data() + in_span), take});
        left -= take;
        in_span += take;
        if (in_span == spans[span].size()) ++span, in_span = 0;
      }
      COPSE_RETURN_NOT_OK(sock_.WriteV(iov.data(), iov.size()));
      off += piece;
    }
    return Status::OK();
  }

  Socket& sock_;
  std::array<char, wire::kHeaderBytes + 1> frame_head_{};
  std::array<std::array<char, internal::kRecordHeaderBytes>, internal::kBatchRecords> headers_{};
  std::vector<Buffer> records_;
  std::vector<iovec> iov_;
  size_t body_bytes_ = 0;
};

constexpr int64_t kAcceptRestMs = 100;

int64_t SteadyMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace

struct DataServer::Impl {
  struct Conn {
    Socket sock;
    std::thread thread;
    std::atomic<bool> done{false};
    /// Until the peer has authenticated: when the whole handshake must be over (steady-clock
    /// ms; 0 after it). Reads time out one at a time, so a peer trickling a byte now and then
    /// would hold a thread for ever; the accept loop shuts such a connection down instead.
    std::atomic<int64_t> handshake_until_ms{0};
  };

  OutputStore& store;
  std::string secret;
  DataServerOptions options;
  Socket listener;
  Socket local_listener;  // not valid when the local fast path is off
  uint16_t port = 0;
  int wake_fd = -1;
  std::thread acceptor;
  std::mutex mu;
  std::list<Conn> conns;  // guarded by mu
  std::atomic<bool> stopping{false};
  std::atomic<uint64_t> accepted{0};
  std::atomic<uint64_t> fetches{0};
  std::atomic<uint64_t> handoffs{0};

  Impl(OutputStore& s, std::string sec, DataServerOptions o) : store(s), secret(std::move(sec)), options(o) {}

  void AcceptLoop();
  void ReapLocked();
  /// Serves one connection until it closes; clears `handshake_until_ms` once it authenticated.
  void Serve(Socket& sock, std::atomic<int64_t>& handshake_until_ms);
  /// Shuts down connections whose handshake outlived its deadline. Requires mu.
  void EndOverdueHandshakesLocked();
  /// Shuts down the connection that has been in its handshake longest. Requires mu.
  void EndOldestHandshakeLocked();
  /// Authenticates a new connection and clears its `handshake_until_ms`; false when it must be
  /// closed.
  bool Handshake(BufferedSocket& in, const std::string& peer, std::atomic<int64_t>& handshake_until_ms);
  /// Streams one output (hands a file output over on a local connection); false when the
  /// connection is no longer usable.
  bool Fetch(Socket& sock, const OutputKey& key, bool local);
  /// Answers a fetch of a file output on a local connection with the file's descriptor;
  /// nullopt when the output must be streamed instead (in memory, empty, or its file is gone).
  std::optional<bool> HandOff(Socket& sock, const OutputKey& key, const OutputStore::Stored& stored);
  /// Waits up to wait_ms for `key` to be stored (or removed); false when it was not by then.
  bool WaitForOutput(const OutputKey& key, uint64_t wait_ms);
};

void DataServer::Impl::AcceptLoop() {
  SetThreadName("copse-data-acc");
  // Out of descriptors (or memory), accept fails and leaves the connection waiting, so poll
  // would report it again at once: the listeners rest until then instead of spinning.
  int64_t resting_until_ms = 0;
  int64_t refused_logged_ms = 0;
  for (;;) {
    const bool resting = SteadyMs() < resting_until_ms;
    // The local listener's slot stays (fd -1, ignored by poll) when the fast path is off.
    pollfd fds[3] = {
        {wake_fd, POLLIN, 0}, {resting ? -1 : listener.fd(), POLLIN, 0}, {resting ? -1 : local_listener.fd(), POLLIN, 0}};
    int n = ::poll(fds, 3, resting ? static_cast<int>(kAcceptRestMs) : 1000);
    if (stopping) return;
    std::lock_guard lock(mu);
    ReapLocked();
    EndOverdueHandshakesLocked();
    if (n <= 0) continue;
    for (int i = 1; i < 3; ++i) {
      if (!(fds[i].revents & POLLIN)) continue;
      const bool local = i == 2;
      int fd = ::accept4(fds[i].fd, nullptr, nullptr, SOCK_CLOEXEC);
      if (fd < 0) {
        if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
          Logger("chan")->warn("data server: cannot accept a connection ({}); resting {} ms", std::strerror(errno),
                               kAcceptRestMs);
          resting_until_ms = SteadyMs() + kAcceptRestMs;
        }
        continue;
      }
      // At the cap, the connection longest in its handshake makes room: a peer that opens
      // connections and says nothing cannot lock real ones out, whose handshake takes a
      // round trip, unless it opens max_handshaking of them in that time.
      const auto handshaking =
          std::count_if(conns.begin(), conns.end(), [](const Conn& c) { return c.handshake_until_ms.load() != 0; });
      if (handshaking >= options.max_handshaking) {
        if (SteadyMs() - refused_logged_ms >= 1000) {  // one line a second, however many come
          Logger("chan")->warn("data server: {} connections are in their handshake; closing the oldest for each new one",
                               handshaking);
          refused_logged_ms = SteadyMs();
        }
        EndOldestHandshakeLocked();
      }
      if (!local) {
        int one = 1;
        ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
      } else {
        int bytes = kLocalSendBufferBytes;
        ::setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &bytes, sizeof bytes);
      }
      ++accepted;
      Conn& c = conns.emplace_back();
      c.sock = Socket(fd, local);
      c.handshake_until_ms = SteadyMs() + options.handshake_timeout_ms;
      try {
        c.thread = std::thread([this, &c] {
          SetThreadName("copse-data-srv");
          try {
            Serve(c.sock, c.handshake_until_ms);
          } catch (const std::exception& e) {  // a peer's message no check foresaw ends its connection, not the daemon
            Logger("chan")->warn("data server: connection ended by an unexpected message: {}", e.what());
          }
          c.sock.Shutdown();  // closed (after join) by the reaper or Stop
          c.done = true;
        });
      } catch (const std::system_error& e) {  // no thread to be had (a pids limit): this one goes unserved
        Logger("chan")->warn("data server: cannot start a thread for a connection ({}); closing it", e.what());
        conns.pop_back();  // closes its socket
        resting_until_ms = SteadyMs() + kAcceptRestMs;
      }
    }
  }
}

void DataServer::Impl::EndOldestHandshakeLocked() {
  Conn* oldest = nullptr;
  int64_t oldest_until = 0;
  for (auto& c : conns) {
    const int64_t until = c.handshake_until_ms.load();
    if (until != 0 && (!oldest || until < oldest_until)) oldest = &c, oldest_until = until;
  }
  if (oldest && oldest->handshake_until_ms.compare_exchange_strong(oldest_until, 0)) {
    ::shutdown(oldest->sock.fd(), SHUT_RDWR);  // its thread's blocked read ends
  }
}

void DataServer::Impl::EndOverdueHandshakesLocked() {
  const int64_t now = SteadyMs();
  for (auto& c : conns) {
    int64_t until = c.handshake_until_ms.load();
    if (until == 0 || now < until) continue;
    if (!c.handshake_until_ms.compare_exchange_strong(until, 0)) continue;  // it authenticated just now
    Logger("chan")->warn("data server: a peer did not finish its handshake within {} ms; closing it",
                         options.handshake_timeout_ms);
    ::shutdown(c.sock.fd(), SHUT_RDWR);  // its thread's blocked read ends
  }
}

void DataServer::Impl::ReapLocked() {
  for (auto it = conns.begin(); it != conns.end();) {
    if (it->done) {
      it->thread.join();
      it = conns.erase(it);
    } else {
      ++it;
    }
  }
}

bool DataServer::Impl::Handshake(BufferedSocket& in, const std::string& peer, std::atomic<int64_t>& handshake_until_ms) {
  Socket& s = in.socket();
  std::string nonce = auth::NewNonce();
  if (!internal::WriteJson(s, Json{{"op", "hello"}, {"nonce", nonce}, {"version", wire::kProtocolVersion}}).ok()) {
    return false;
  }
  auto refuse = [&](const std::string& why) {
    Logger("chan")->warn("data server: refused {}: {}", peer, why);
    (void)internal::WriteJson(s, Json{{"op", "error"}, {"message", why}});
    return false;
  };
  auto msg = internal::ReadJson(in, kMaxRequestBytes, options.handshake_timeout_ms, options.handshake_timeout_ms);
  if (!msg.ok()) {
    // Shut down by the acceptor (overdue, or the oldest at the cap), which said so at a
    // bounded rate: a line per such connection would let a peer flood the log.
    if (handshake_until_ms.load() == 0) return false;
    return refuse("bad handshake: " + msg.status().message());
  }
  const Json& j = *msg;
  if (StringMember(j, "op") != "auth") return refuse("expected {\"op\":\"auth\"} first");
  const std::string role = StringMember(j, "role");
  if (role != "peer" && role != "client") return refuse("role must be \"peer\" or \"client\", not \"" + role + "\"");
  auto mac = j.find("mac");
  if (mac == j.end() || !mac->is_string() || !auth::ConstantTimeEquals(mac->get<std::string>(), auth::Mac(secret, nonce))) {
    return refuse("authentication failed: wrong secret");
  }
  // No longer counted as in its handshake from before the welcome: a peer that goes on to open
  // more connections at once must find this one's place free.
  int64_t until = handshake_until_ms.load();
  if (until == 0 || !handshake_until_ms.compare_exchange_strong(until, 0)) return false;  // shut down as overdue meanwhile
  return internal::WriteJson(s, auth::Welcome(j, secret, nonce)).ok();
}

void DataServer::Impl::Serve(Socket& sock, std::atomic<int64_t>& handshake_until_ms) {
  // Own read buffer; `sock` stays owned by Conn. Requests never carry descriptors: plain reads.
  BufferedSocket in(Socket(::dup(sock.fd())), 64 << 10);
  const bool local = sock.local();
  std::string peer = "connection " + std::to_string(accepted.load());
  if (options.tls && !local) {
    Status secured = in.socket().StartTls(*options.tls, tls::Session::Role::kServer, peer, options.handshake_timeout_ms);
    if (!secured.ok()) {
      if (handshake_until_ms.load() != 0) Logger("chan")->warn("data server: refused {}: {}", peer, secured.message());
      return;
    }
  }
  if (!Handshake(in, peer, handshake_until_ms)) return;
  Socket& out = in.socket();
  // A request that is not one (garbage, JSON, a message that breaks the schema) drops the
  // peer with an error naming what is wrong.
  auto refuse = [&](const std::string& why) {
    Logger("chan")->warn("data server: {}: {}", peer, why);
    (void)internal::WriteJson(out, Json{{"op", "error"}, {"message", why}});
  };
  while (!stopping) {
    auto header = internal::ReadHeader(in, kMaxRequestBytes, -1, options.frame_timeout_ms);
    auto body = header.ok() ? internal::ReadBody(in, *header, options.frame_timeout_ms) : Result<std::string>(header.status());
    if (!body.ok()) {
      if (body.status().code() == StatusCode::kInvalidArgument) refuse(body.status().message());
      return;  // closed, reset or garbage
    }
    if (header->type != FrameType::kProto) return refuse("expected a request (a protocol frame, protocol/data.proto)");
    auto req = protocol::DecodeDataRequest(*body);
    if (!req.ok()) return refuse(req.status().message());
    if (req->has_ping()) {
      protocol::DataReply pong;
      pong.mutable_pong();
      if (!internal::WriteFrame(out, FrameType::kProto, pong.SerializeAsString()).ok()) return;
      continue;
    }
    const OutputKey key = FromProtocol(req->fetch().key());
    // wait_ms: the consumer asks before the producer has finished (chained dispatch); the
    // answer waits up to that long for the output to appear (capped, and cut short by Stop).
    const uint64_t wait_ms = std::min<uint64_t>(req->fetch().wait_ms(), kMaxFetchWaitMs);
    if (wait_ms > 0 && !WaitForOutput(key, wait_ms)) {
      // Not produced yet (its producer may still run): the consumer asks again.
      auto st = Status::Timeout("output " + key.ToString() + " is not produced yet");
      if (!internal::WriteFrame(out, FrameType::kEnd, EndBody(st)).ok()) return;
      continue;
    }
    if (!Fetch(out, key, local)) return;
  }
}

bool DataServer::Impl::WaitForOutput(const OutputKey& key, uint64_t wait_ms) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(wait_ms);
  while (!stopping) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - std::chrono::steady_clock::now());
    if (left.count() <= 0) return store.WaitFor(key, std::chrono::milliseconds(0));
    if (store.WaitFor(key, std::min(left, std::chrono::milliseconds(50)))) return true;  // slices: Stop is noticed
  }
  return false;
}

std::optional<bool> DataServer::Impl::HandOff(Socket& sock, const OutputKey& key, const OutputStore::Stored& stored) {
  if (stored.file.empty()) return std::nullopt;  // in memory (streamed) or without messages
  const int fd = ::open(stored.file.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return std::nullopt;  // gone: the streamed path reports it
  const bool sent =
      internal::WriteFrame(sock, FrameType::kEnd, EndBody(stored.info.messages, stored.info.bytes, /*handoff=*/true), fd).ok();
  ::close(fd);  // the reader holds its own duplicate
  if (sent) ++handoffs;
  return sent;
}

bool DataServer::Impl::Fetch(Socket& sock, const OutputKey& key, bool local) {
  ++fetches;
  auto end = [&](const std::string& body) { return internal::WriteFrame(sock, FrameType::kEnd, body).ok(); };
  auto stored = store.Lookup(key);
  if (!stored.ok()) return end(EndBody(stored.status()));
  if (stored->damaged) return end(EndBody(Status::DataLoss("output " + key.ToString() + " is damaged")));
  if (local) {
    if (auto handed = HandOff(sock, key, *stored)) return *handed;
  }
  FrameSender sender(sock);
  uint64_t messages = 0, bytes = 0;
  if (stored->memory) {
    const StoredMessages& m = *stored->memory;
    for (size_t i = 0; i < m.messages.size(); ++i) {
      if (!sender.Add(m.messages[i], m.ChecksumOf(i)).ok()) return false;
    }
    messages = m.messages.size();
    bytes = m.bytes;
  } else if (!stored->file.empty()) {
    auto reader = FileRecordReader::Open(stored->file, key.ToString(), /*verify=*/false);
    if (!reader.ok()) return end(EndBody(reader.status()));
    for (;;) {
      auto rec = (*reader)->Next();
      if (!rec.ok()) {
        if (!sender.Flush().ok()) return false;
        return end(EndBody(rec.status()));
      }
      if (!rec->has_value()) break;
      if (!sender.Add((*rec)->bytes, (*rec)->checksum).ok()) return false;
      ++messages;
      bytes += (*rec)->bytes.size();
    }
  }
  if (!sender.Flush().ok()) return false;
  return end(EndBody(messages, bytes, /*handoff=*/false));
}

DataServer::DataServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Result<std::unique_ptr<DataServer>> DataServer::Start(OutputStore& store, const std::string& host, uint16_t port,
                                                      std::string secret, DataServerOptions options) {
  auto impl = std::make_unique<Impl>(store, std::move(secret), options);
  COPSE_ASSIGN_OR_RETURN(impl->listener, Socket::Listen(host, port));
  impl->port = impl->listener.LocalPort();
  if (options.local_socket) {
    auto local = Socket::ListenLocal(LocalSocketName(host, impl->port));
    if (local.ok()) {
      impl->local_listener = std::move(*local);
    } else {  // e.g. another server in this network namespace serves the same address
      Logger("chan")->warn("data server: no same-host fast path: {}", local.status().message());
    }
  }
  impl->wake_fd = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (impl->wake_fd < 0) return Status::Internal("eventfd failed");
  Impl* p = impl.get();
  impl->acceptor = std::thread([p] { p->AcceptLoop(); });
  Logger("chan")->info("data server listening on {}:{}", host, impl->port);
  return std::unique_ptr<DataServer>(new DataServer(std::move(impl)));
}

uint16_t DataServer::port() const { return impl_->port; }
uint64_t DataServer::connections_accepted() const { return impl_->accepted; }
uint64_t DataServer::fetches() const { return impl_->fetches; }
uint64_t DataServer::handoffs() const { return impl_->handoffs; }
bool DataServer::serves_local() const { return impl_->local_listener.valid(); }

std::string LocalSocketName(const std::string& host, uint16_t port) { return "copse-data/" + host + ":" + std::to_string(port); }

void DataServer::Stop() {
  if (!impl_ || impl_->stopping.exchange(true)) return;
  uint64_t one = 1;
  (void)::write(impl_->wake_fd, &one, sizeof one);
  if (impl_->acceptor.joinable()) impl_->acceptor.join();
  impl_->listener.Close();
  impl_->local_listener.Close();
  std::lock_guard lock(impl_->mu);
  for (auto& c : impl_->conns) c.sock.Shutdown();
  for (auto& c : impl_->conns) c.thread.join();
  impl_->conns.clear();
  ::close(impl_->wake_fd);
}

DataServer::~DataServer() { Stop(); }

}  // namespace copse::chan
