#include "channels/remote_reader.h"

#include <algorithm>
#include <atomic>
#include <map>
#include <mutex>
#include <vector>

#include "channels/data_server.h"
#include "channels/protocol_keys.h"
#include "channels/record_format.h"
#include "channels/socket.h"
#include "common/auth.h"
#include "common/logging.h"
#include "protocol/codec.h"

namespace copse::chan {

using internal::BufferedSocket;
using internal::Socket;
using wire::FrameType;

namespace {

constexpr size_t kMaxIdlePerPeer = 16;
constexpr uint32_t kMaxEndBytes = 1 << 20;
constexpr size_t kHashChunkBytes = 128 << 10;
constexpr const char* kAbortedWhy = "its daemon was declared lost by the job manager";

/// A connection to a peer's data server, in use or idle in the pool. Every live one is known
/// to the pool by its peer, so AbortFetchesFrom can shut it down from another thread.
struct Conn {
  Conn(Socket s, std::string k, std::string p);
  ~Conn();
  Conn(const Conn&) = delete;
  Conn& operator=(const Conn&) = delete;
  BufferedSocket in;
  std::string pool_key;
  std::string peer;                  // host:port
  std::atomic<bool> aborted{false};  // shut down by AbortFetchesFrom
};

StatusCode CodeFromName(const std::string& name) {
  for (auto c : {StatusCode::kNotFound, StatusCode::kDataLoss, StatusCode::kInvalidArgument, StatusCode::kUnavailable,
                 StatusCode::kPermissionDenied, StatusCode::kIOError, StatusCode::kInternal, StatusCode::kCancelled,
                 StatusCode::kTimeout}) {
    if (StatusCodeName(c) == name) return c;
  }
  return StatusCode::kUnavailable;
}

class Pool {
 public:
  static Pool& Get() {
    static Pool* pool = new Pool();  // never destroyed: readers may outlive static destruction
    return *pool;
  }

  std::unique_ptr<Conn> TakeIdle(const std::string& key) {
    std::lock_guard lock(mu_);
    auto it = idle_.find(key);
    if (it == idle_.end() || it->second.empty()) return nullptr;
    auto c = std::move(it->second.back());
    it->second.pop_back();
    ++stats_.connections_reused;
    --stats_.idle;
    return c;
  }

  void Put(std::unique_ptr<Conn> c) {
    if (c->in.buffered() != 0 || c->in.socket().has_received_fds()) return;  // out of step: never reuse
    std::lock_guard lock(mu_);
    if (c->aborted) return;  // shut down after its last read: dead, and Abort set the flag under mu_
    auto& v = idle_[c->pool_key];
    if (v.size() >= kMaxIdlePerPeer) return;
    v.push_back(std::move(c));
    ++stats_.idle;
  }

  void CountOpened(bool local) {
    std::lock_guard lock(mu_);
    ++stats_.connections_opened;
    if (local) ++stats_.local_connections_opened;
  }

  RemotePoolStats Stats() {
    std::lock_guard lock(mu_);
    return stats_;
  }

  void CloseIdle() {
    std::map<std::string, std::vector<std::unique_ptr<Conn>>> closing;  // destroyed unlocked: ~Conn locks
    std::lock_guard lock(mu_);
    closing.swap(idle_);
    stats_.idle = 0;
  }

  void Track(Conn* c) {
    std::lock_guard lock(mu_);
    live_.emplace(c->peer, c);
  }
  /// Called before the connection's socket closes, so that Abort never shuts down a descriptor
  /// that was closed and handed out again.
  void Untrack(Conn* c) {
    std::lock_guard lock(mu_);
    auto [first, last] = live_.equal_range(c->peer);
    for (auto it = first; it != last; ++it) {
      if (it->second == c) {
        live_.erase(it);
        break;
      }
    }
  }

  size_t Abort(const std::string& peer) {
    std::vector<std::unique_ptr<Conn>> closing;  // destroyed unlocked: ~Conn locks
    size_t aborted = 0;
    {
      std::lock_guard lock(mu_);
      for (auto& [key, conns] : idle_) {
        std::erase_if(conns, [&](std::unique_ptr<Conn>& c) {
          if (c->peer != peer) return false;
          closing.push_back(std::move(c));
          --stats_.idle;
          return true;
        });
      }
      auto [first, last] = live_.equal_range(peer);
      for (auto it = first; it != last; ++it) {
        it->second->aborted = true;
        it->second->in.socket().Shutdown();
        ++aborted;
      }
    }
    return aborted - closing.size();  // live_ lists idle ones too: only fetches in progress count
  }

 private:
  std::mutex mu_;
  std::map<std::string, std::vector<std::unique_ptr<Conn>>> idle_;
  std::multimap<std::string, Conn*> live_;  // every Conn, in use or idle, by peer
  RemotePoolStats stats_;
};

Conn::Conn(Socket s, std::string k, std::string p) : in(std::move(s)), pool_key(std::move(k)), peer(std::move(p)) {
  Pool::Get().Track(this);
}

Conn::~Conn() { Pool::Get().Untrack(this); }

std::string PeerName(const std::string& host, uint16_t port) { return host + ":" + std::to_string(port); }

/// The pool's name for a secret's connections: a MAC of it, so pool keys hold no secret. One
/// HMAC costs more than the rest of a pooled fetch's bookkeeping, so each thread keeps its last.
const std::string& PoolSecretTag(const std::string& secret) {
  thread_local std::string cached_secret, cached_tag;
  if (cached_tag.empty() || cached_secret != secret) {
    cached_tag = auth::Mac(secret, "copse-pool");
    cached_secret = secret;
  }
  return cached_tag;
}

/// The peer's local socket when it is on this host and `o` allows it, else TCP.
Result<Socket> Connect(const std::string& host, uint16_t port, const RemoteReaderOptions& o) {
  if (o.local_socket) {
    auto local = Socket::ConnectLocal(LocalSocketName(host, port), o.connect_timeout_ms);
    if (local.ok()) return local;
    if (local.status().code() == StatusCode::kPermissionDenied) {
      Logger("chan")->warn("local socket of {}: {}; using TCP", PeerName(host, port), local.status().message());
    } else if (local.status().code() != StatusCode::kNotFound) {
      Logger("chan")->debug("local socket of {}: {}; using TCP", PeerName(host, port), local.status().message());
    }
  }
  return Socket::Connect(host, port, o.connect_timeout_ms);
}

Result<std::unique_ptr<Conn>> Dial(const std::string& host, uint16_t port, const std::string& secret, const std::string& pool_key,
                                   const RemoteReaderOptions& o) {
  std::string peer = PeerName(host, port);
  COPSE_ASSIGN_OR_RETURN(Socket s, Connect(host, port, o));
  const bool local = s.local();
  if (o.tls && !local) {
    COPSE_RETURN_NOT_OK(s.StartTls(*o.tls, tls::Session::Role::kClient, peer, o.connect_timeout_ms));
  }
  auto c = std::make_unique<Conn>(std::move(s), pool_key, peer);
  auto hello = internal::ReadJson(c->in, kMaxEndBytes, o.connect_timeout_ms, o.connect_timeout_ms);
  if (!hello.ok()) return Status::Unavailable("handshake with " + peer + ": " + hello.status().message());
  if (tls::IsBanner(*hello)) return Status::FailedPrecondition(peer + ": " + StringMember(*hello, "message"));
  auto answer = auth::AnswerHello(*hello, secret, "peer");
  if (!answer.ok()) return Status::Unavailable("handshake with " + peer + ": " + answer.status().message());
  COPSE_RETURN_NOT_OK(internal::WriteJson(c->in.socket(), answer->message).WithContext("handshake with " + peer));
  auto reply = internal::ReadJson(c->in, kMaxEndBytes, o.connect_timeout_ms, o.connect_timeout_ms);
  if (!reply.ok()) return Status::Unavailable("handshake with " + peer + ": " + reply.status().message());
  // Outputs are taken only from a peer that shows it holds the secret.
  COPSE_RETURN_NOT_OK(auth::CheckWelcome(*reply, secret, *answer).WithContext(peer));
  Pool::Get().CountOpened(local);
  return c;
}

/// Reads the body of a kEnd frame whose header was read: the peer's verdict (protocol/data.proto),
/// decoded and checked.
Result<protocol::FetchEnd> ReadEndBody(BufferedSocket& in, const wire::FrameHeader& h, int timeout_ms) {
  if (h.length > kMaxEndBytes) return Status::InvalidArgument("oversized end frame");
  std::string body(h.length, '\0');
  COPSE_RETURN_NOT_OK(in.ReadFull(body.data(), body.size(), timeout_ms));
  return protocol::DecodeFetchEnd(body);
}

Status PeerVerdict(const protocol::FetchEnd& end, const std::string& peer) {
  if (end.ok()) return Status::OK();
  return Status(CodeFromName(end.code()), peer + ": " + (end.message().empty() ? "fetch failed" : end.message()));
}

class EmptyOutputReader final : public ChannelReader {
 public:
  Result<std::optional<Buffer>> Next() override { return std::optional<Buffer>(); }
};

/// A file output handed over by descriptor, checked to hold the messages its server announced.
class HandedOverFileReader final : public ChannelReader {
 public:
  HandedOverFileReader(std::unique_ptr<ChannelReader> file, std::string what, uint64_t expected)
      : file_(std::move(file)), what_(std::move(what)), expected_(expected) {}

  Result<std::optional<Buffer>> Next() override {
    COPSE_ASSIGN_OR_RETURN(auto m, file_->Next());
    if (m ? ++seen_ > expected_ : seen_ != expected_) {
      return Status::DataLoss("fetching " + what_ + ": the file handed over holds " + (m ? "more than " : "") +
                              std::to_string(seen_) + " messages, not the " + std::to_string(expected_) + " announced");
    }
    return m;
  }

 private:
  std::unique_ptr<ChannelReader> file_;
  std::string what_;
  uint64_t expected_;
  uint64_t seen_ = 0;
};

class RemoteReader final : public ChannelReader {
 public:
  RemoteReader(std::unique_ptr<Conn> conn, OutputKey key, std::string peer, wire::FrameHeader first, int timeout_ms)
      : conn_(std::move(conn)), key_(key), peer_(std::move(peer)), timeout_ms_(timeout_ms), pending_(first), has_pending_(true) {}

  Result<std::optional<Buffer>> Next() override {
    if (!failed_.ok()) return failed_;
    if (done_) return std::optional<Buffer>();
    auto r = NextImpl();
    if (!r.ok()) {
      conn_.reset();  // out of step with the peer: close, never pool
      failed_ = r.status();
    }
    return r;
  }

 private:
  std::string What() const { return "output " + key_.ToString() + " from " + peer_; }

  Status Lost(const Status& st) {
    return Status::Unavailable("fetching " + What() + ": " + (conn_ && conn_->aborted ? kAbortedWhy : st.message()));
  }

  Status Read(char* p, size_t n) {
    Status st = conn_->in.ReadFull(p, n, timeout_ms_);
    return st.ok() ? st : Lost(st);
  }

  /// The kEnd frame: checks the peer's verdict and counts, then pools the connection.
  Status ReadEnd(const wire::FrameHeader& h) {
    auto end = ReadEndBody(conn_->in, h, timeout_ms_);
    if (!end.ok()) return Lost(end.status());
    done_ = true;
    Pool::Get().Put(std::move(conn_));  // a complete exchange: the connection is reusable
    COPSE_RETURN_NOT_OK(PeerVerdict(*end, peer_));
    if (end->messages() != messages_ || end->bytes() != bytes_) {
      return Status::DataLoss("fetching " + What() + ": received " + std::to_string(messages_) + " messages, the peer sent " +
                              std::to_string(end->messages()));
    }
    return Status::OK();
  }

  Result<std::optional<Buffer>> Emit(std::string bytes, uint64_t checksum, uint64_t actual) {
    if (actual != checksum) {
      return Status::DataLoss("fetching " + What() + ": message " + std::to_string(messages_) + " failed its checksum");
    }
    ++messages_;
    bytes_ += bytes.size();
    return std::optional<Buffer>(Buffer(std::move(bytes)));
  }

  Result<std::optional<Buffer>> NextImpl() {
    for (;;) {
      if (frame_left_ == 0) {
        wire::FrameHeader h;
        if (has_pending_) {
          h = pending_;
          has_pending_ = false;
        } else {
          auto hr = internal::ReadHeader(conn_->in, wire::kMaxDataBytes, timeout_ms_, timeout_ms_);
          if (!hr.ok()) return Lost(hr.status());
          h = *hr;
        }
        if (h.type == FrameType::kEnd) {
          if (piece_filled_ < piece_total_) return Lost(Status::InvalidArgument("stream ended inside a message"));
          COPSE_RETURN_NOT_OK(ReadEnd(h));
          return std::optional<Buffer>();
        }
        if (h.type != FrameType::kData || h.length < 1) {
          if (h.type == FrameType::kJson && h.length <= kMaxEndBytes) {
            std::string body(h.length, '\0');
            COPSE_RETURN_NOT_OK(Read(body.data(), body.size()));
            return Lost(Status::InvalidArgument("peer error: " + body));
          }
          return Lost(Status::InvalidArgument("unexpected frame in a data stream"));
        }
        COPSE_RETURN_NOT_OK(Read(&tag_, 1));
        frame_left_ = h.length - 1;
        if (tag_ == internal::kTagFirstPiece) {
          char ph[16];
          if (frame_left_ < 16 || piece_filled_ < piece_total_) return Lost(Status::InvalidArgument("bad piece"));
          COPSE_RETURN_NOT_OK(Read(ph, 16));
          frame_left_ -= 16;
          piece_total_ = internal::GetU64(ph);
          piece_checksum_ = internal::GetU64(ph + 8);
          piece_filled_ = 0;
          // The buffer grows with the bytes that arrive: what the peer announces is not
          // trusted with memory (a total of 2^63 must not become an allocation).
          piece_.clear();
          piece_.reserve(std::min<uint64_t>(piece_total_, wire::kMaxDataBytes));
        } else if (tag_ == internal::kTagContinuation) {
          if (piece_filled_ >= piece_total_) return Lost(Status::InvalidArgument("unexpected continuation"));
        } else if (tag_ != internal::kTagMessages) {
          return Lost(Status::InvalidArgument("unknown data frame tag"));
        }
        if (frame_left_ == 0 && tag_ == internal::kTagMessages) continue;
      }
      if (tag_ == internal::kTagMessages) {
        char rh[internal::kRecordHeaderBytes];
        if (frame_left_ < sizeof rh) return Lost(Status::InvalidArgument("record header crosses a frame"));
        COPSE_RETURN_NOT_OK(Read(rh, sizeof rh));
        uint32_t len = internal::GetU32(rh);
        frame_left_ -= sizeof rh;
        if (len > frame_left_) return Lost(Status::InvalidArgument("record crosses a frame"));
        std::string bytes = internal::UninitializedString(len);
        frame_left_ -= len;
        if (len < kHashChunkBytes) {
          COPSE_RETURN_NOT_OK(Read(bytes.data(), len));
          return Emit(std::move(bytes), internal::GetU64(rh + 4), internal::Checksum(bytes));
        }
        // Hash each chunk right after it arrived, while it is still in cache.
        XXH3_64bits_reset(hash_.get());
        for (size_t off = 0; off < len; off += kHashChunkBytes) {
          size_t n = std::min<size_t>(kHashChunkBytes, len - off);
          COPSE_RETURN_NOT_OK(Read(bytes.data() + off, n));
          XXH3_64bits_update(hash_.get(), bytes.data() + off, n);
        }
        return Emit(std::move(bytes), internal::GetU64(rh + 4), XXH3_64bits_digest(hash_.get()));
      }
      // A piece of a large message.
      const uint64_t n = std::min<uint64_t>(frame_left_, piece_total_ - piece_filled_);
      if (n != frame_left_) return Lost(Status::InvalidArgument("piece overruns its message"));
      piece_.resize(piece_filled_ + n);
      COPSE_RETURN_NOT_OK(Read(piece_.data() + piece_filled_, n));
      piece_filled_ += n;
      frame_left_ = 0;
      if (piece_filled_ == piece_total_) {
        piece_filled_ = 0;
        piece_total_ = 0;
        uint64_t actual = internal::Checksum(piece_);
        return Emit(std::exchange(piece_, std::string()), piece_checksum_, actual);
      }
    }
  }

  std::unique_ptr<Conn> conn_;
  OutputKey key_;
  std::string peer_;
  int timeout_ms_;
  wire::FrameHeader pending_;
  bool has_pending_;
  bool done_ = false;
  Status failed_;
  char tag_ = 0;
  uint64_t frame_left_ = 0;
  std::string piece_;  // the bytes of a large message received so far (piece_filled_ of piece_total_)
  uint64_t piece_total_ = 0;
  uint64_t piece_checksum_ = 0;
  uint64_t piece_filled_ = 0;
  uint64_t messages_ = 0, bytes_ = 0;
  std::unique_ptr<XXH3_state_t, decltype(&XXH3_freeState)> hash_{XXH3_createState(), &XXH3_freeState};
};

/// An answer that is one kEnd frame: the peer's refusal (NotFound, DataLoss), an empty output,
/// or a file output handed over by descriptor on a local connection.
Result<std::unique_ptr<ChannelReader>> FinishUnstreamed(std::unique_ptr<Conn> conn, const wire::FrameHeader& h,
                                                        const OutputKey& key, const std::string& peer,
                                                        const RemoteReaderOptions& o) {
  const std::string what = "output " + key.ToString() + " from " + peer;
  auto end = ReadEndBody(conn->in, h, o.read_timeout_ms);
  if (!end.ok()) return Status::Unavailable("fetching " + what + ": " + end.status().message());
  const bool handoff = end->handoff();
  const int fd = handoff ? conn->in.socket().TakeReceivedFd() : -1;
  Pool::Get().Put(std::move(conn));  // a complete exchange: the connection is reusable
  COPSE_RETURN_NOT_OK(PeerVerdict(*end, peer));
  const uint64_t messages = end->messages();
  if (!handoff) {
    if (messages != 0) return Status::DataLoss("fetching " + what + ": the peer announced messages but sent none");
    return std::unique_ptr<ChannelReader>(new EmptyOutputReader());
  }
  if (fd < 0) return Status::Unavailable("fetching " + what + ": the peer handed over no descriptor");
  COPSE_ASSIGN_OR_RETURN(auto file, OutputStore::OpenOutputFile(fd, key.ToString() + " (handed over by " + peer + ")"));
  return std::unique_ptr<ChannelReader>(new HandedOverFileReader(std::move(file), what, messages));
}

}  // namespace

Result<std::unique_ptr<ChannelReader>> OpenRemoteReader(const std::string& host, uint16_t port, const OutputKey& key,
                                                        const std::string& secret) {
  return OpenRemoteReader(host, port, key, secret, RemoteReaderOptions{});
}

Result<std::unique_ptr<ChannelReader>> OpenRemoteReader(const std::string& host, uint16_t port, const OutputKey& key,
                                                        const std::string& secret, const RemoteReaderOptions& o) {
  const std::string peer = PeerName(host, port);
  // The secret itself is not kept; readers that may not use a local connection never get one.
  const std::string pool_key = peer + (o.local_socket ? "\nlocal-ok\n" : "\ntcp\n") + PoolSecretTag(secret) +
                               (o.tls ? "\ntls:" + o.tls->dir().string() : "");
  protocol::DataRequest fetch;
  *fetch.mutable_fetch()->mutable_key() = ToProtocol(key);
  if (o.wait_ms > 0) fetch.mutable_fetch()->set_wait_ms(static_cast<uint32_t>(o.wait_ms));
  const std::string request = fetch.SerializeAsString();
  for (int attempt = 0;; ++attempt) {
    // A pooled connection may have been closed by the peer while idle: that shows on first use,
    // before any byte of the answer, and is retried once on a fresh connection.
    std::unique_ptr<Conn> conn = attempt == 0 ? Pool::Get().TakeIdle(pool_key) : nullptr;
    bool reused = conn != nullptr;
    if (!conn) {
      COPSE_ASSIGN_OR_RETURN(conn, Dial(host, port, secret, pool_key, o));
    }
    Status st = internal::WriteFrame(conn->in.socket(), FrameType::kProto, request);
    Result<wire::FrameHeader> first =
        st.ok()
            ? internal::ReadHeader(conn->in, wire::kMaxDataBytes, o.read_timeout_ms + std::max(o.wait_ms, 0), o.read_timeout_ms)
            : Result<wire::FrameHeader>(st);
    if (!first.ok()) {
      if (conn->aborted) return Status::Unavailable("fetching output " + key.ToString() + " from " + peer + ": " + kAbortedWhy);
      if (reused && first.status().code() == StatusCode::kUnavailable) continue;
      return Status::Unavailable("fetching output " + key.ToString() + " from " + peer + ": " + first.status().message());
    }
    if (first->type == FrameType::kEnd) return FinishUnstreamed(std::move(conn), *first, key, peer, o);
    return std::unique_ptr<ChannelReader>(std::make_unique<RemoteReader>(std::move(conn), key, peer, *first, o.read_timeout_ms));
  }
}

RemotePoolStats GetRemotePoolStats() { return Pool::Get().Stats(); }
size_t AbortFetchesFrom(const std::string& host, uint16_t port) { return Pool::Get().Abort(PeerName(host, port)); }
void CloseIdleRemoteConnections() { Pool::Get().CloseIdle(); }

}  // namespace copse::chan
