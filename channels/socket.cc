#include "channels/socket.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>

#include "channels/iovec_util.h"
#include "common/local_peer.h"

namespace copse::chan::internal {
namespace {

std::string Peer(const std::string& host, uint16_t port) { return host + ":" + std::to_string(port); }

void SetNoDelay(int fd) {
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  ::setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof one);
}

/// Waits until fd is readable/writable; Timeout after timeout_ms.
Status Wait(int fd, short events, int timeout_ms) {
  pollfd p{fd, events, 0};
  for (;;) {
    int n = ::poll(&p, 1, timeout_ms);
    if (n > 0) return Status::OK();
    if (n == 0) return Status::Timeout("no data from peer within " + std::to_string(timeout_ms) + " ms");
    if (errno != EINTR) return Status::Unavailable(std::string("poll: ") + std::strerror(errno));
  }
}

}  // namespace

Socket& Socket::operator=(Socket&& o) noexcept {
  if (this != &o) {
    Close();
    fd_ = o.fd_;
    local_ = o.local_;
    received_fds_ = std::move(o.received_fds_);
    tls_ = std::move(o.tls_);
    o.fd_ = -1;
    o.received_fds_.clear();
  }
  return *this;
}

void Socket::Close() {
  tls_.reset();  // it names the descriptor, whose number the next socket may get
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  for (int fd : received_fds_) ::close(fd);
  received_fds_.clear();
}

int Socket::TakeReceivedFd() {
  if (received_fds_.empty()) return -1;
  int fd = received_fds_.front();
  received_fds_.erase(received_fds_.begin());
  return fd;
}

void Socket::Shutdown() {
  if (fd_ >= 0) ::shutdown(fd_, SHUT_RDWR);
}

uint16_t Socket::LocalPort() const {
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  if (::getsockname(fd_, reinterpret_cast<sockaddr*>(&ss), &len) != 0) return 0;
  if (ss.ss_family == AF_INET) return ntohs(reinterpret_cast<sockaddr_in*>(&ss)->sin_port);
  return ntohs(reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port);
}

Result<Socket> Socket::Connect(const std::string& host, uint16_t port, int timeout_ms) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  std::string service = std::to_string(port);
  if (int rc = ::getaddrinfo(host.c_str(), service.c_str(), &hints, &res); rc != 0) {
    return Status::Unavailable("cannot resolve " + Peer(host, port) + ": " + ::gai_strerror(rc));
  }
  std::string last = "no address";
  for (addrinfo* ai = res; ai; ai = ai->ai_next) {
    Socket s(::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, ai->ai_protocol));
    if (!s.valid()) continue;
    int rc = ::connect(s.fd(), ai->ai_addr, ai->ai_addrlen);
    if (rc != 0 && errno == EINPROGRESS) {
      Status w = Wait(s.fd(), POLLOUT, timeout_ms);
      int err = 0;
      socklen_t len = sizeof err;
      if (!w.ok()) {
        last = "connect timed out";
        continue;
      }
      ::getsockopt(s.fd(), SOL_SOCKET, SO_ERROR, &err, &len);
      rc = err == 0 ? 0 : -1;
      errno = err;
    }
    if (rc != 0) {
      last = std::strerror(errno);
      continue;
    }
    int flags = ::fcntl(s.fd(), F_GETFL);
    ::fcntl(s.fd(), F_SETFL, flags & ~O_NONBLOCK);
    SetNoDelay(s.fd());
    ::freeaddrinfo(res);
    return s;
  }
  ::freeaddrinfo(res);
  return Status::Unavailable("cannot connect to " + Peer(host, port) + ": " + last);
}

Result<Socket> Socket::Listen(const std::string& host, uint16_t port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* res = nullptr;
  std::string service = std::to_string(port);
  if (int rc = ::getaddrinfo(host.empty() ? nullptr : host.c_str(), service.c_str(), &hints, &res); rc != 0) {
    return Status::InvalidArgument("cannot resolve listen address " + Peer(host, port) + ": " + ::gai_strerror(rc));
  }
  std::string last = "no address";
  for (addrinfo* ai = res; ai; ai = ai->ai_next) {
    Socket s(::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol));
    if (!s.valid()) continue;
    int one = 1;
    ::setsockopt(s.fd(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (::bind(s.fd(), ai->ai_addr, ai->ai_addrlen) != 0 || ::listen(s.fd(), 512) != 0) {
      last = std::strerror(errno);
      continue;
    }
    ::freeaddrinfo(res);
    return s;
  }
  ::freeaddrinfo(res);
  return Status::Unavailable("cannot listen on " + Peer(host, port) + ": " + last);
}

namespace {

/// An abstract-namespace address: a leading NUL, then the name (not NUL-terminated).
Result<std::pair<sockaddr_un, socklen_t>> LocalAddress(const std::string& name) {
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  if (name.empty() || name.size() + 1 > sizeof a.sun_path) {
    return Status::InvalidArgument("local socket name must be 1.." + std::to_string(sizeof a.sun_path - 1) + " bytes: \"" + name +
                                   "\"");
  }
  std::memcpy(a.sun_path + 1, name.data(), name.size());
  return std::pair{a, static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size())};
}

}  // namespace

Result<Socket> Socket::ConnectLocal(const std::string& name, int timeout_ms) {
  COPSE_ASSIGN_OR_RETURN(auto addr, LocalAddress(name));
  Socket s(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0), /*local=*/true);
  if (!s.valid()) return Status::Unavailable(std::string("socket: ") + std::strerror(errno));
  // A blocking connect to a Unix socket returns at once unless the listener's backlog is full.
  timeval tv{timeout_ms / 1000, (timeout_ms % 1000) * 1000};
  ::setsockopt(s.fd(), SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  if (::connect(s.fd(), reinterpret_cast<const sockaddr*>(&addr.first), addr.second) != 0) {
    if (errno == ECONNREFUSED || errno == ENOENT) return Status::NotFound("no local socket \"" + name + "\"");
    return Status::Unavailable("cannot connect to local socket \"" + name + "\": " + std::strerror(errno));
  }
  timeval none{};
  ::setsockopt(s.fd(), SOL_SOCKET, SO_SNDTIMEO, &none, sizeof none);
  COPSE_RETURN_NOT_OK(net::CheckLocalPeer(s.fd(), name));
  return s;
}

Result<Socket> Socket::ListenLocal(const std::string& name) {
  COPSE_ASSIGN_OR_RETURN(auto addr, LocalAddress(name));
  Socket s(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0), /*local=*/true);
  if (!s.valid()) return Status::Unavailable(std::string("socket: ") + std::strerror(errno));
  if (::bind(s.fd(), reinterpret_cast<const sockaddr*>(&addr.first), addr.second) != 0) {
    if (errno == EADDRINUSE) return Status::AlreadyExists("local socket \"" + name + "\" is taken");
    return Status::Unavailable("cannot bind local socket \"" + name + "\": " + std::strerror(errno));
  }
  if (::listen(s.fd(), 512) != 0) return Status::Unavailable(std::string("listen: ") + std::strerror(errno));
  return s;
}

Result<size_t> Socket::ReadSome(char* p, size_t n, int timeout_ms) {
  if (!tls_) return ReadSomeRaw(p, n, timeout_ms);
  return tls_->Read(p, n, timeout_ms);
}

Status Socket::ReadExactRaw(char* p, size_t n, int timeout_ms) {
  for (size_t have = 0; have < n;) {
    COPSE_ASSIGN_OR_RETURN(size_t got, ReadSomeRaw(p + have, n - have, timeout_ms));
    have += got;
  }
  return Status::OK();
}

Status Socket::StartTls(const tls::Context& context, tls::Session::Role role, const std::string& peer, int timeout_ms) {
  if (role == tls::Session::Role::kServer) {
    const std::string banner = tls::Banner();
    iovec iov{const_cast<char*>(banner.data()), banner.size()};
    COPSE_RETURN_NOT_OK(WriteVRaw(&iov, 1, -1));
  } else {
    // The banner comes before any TLS byte, and nothing follows it until we start: reading
    // exactly its frame leaves the handshake's bytes unread.
    char header[wire::kHeaderBytes];
    COPSE_RETURN_NOT_OK(ReadExactRaw(header, sizeof header, timeout_ms));
    COPSE_ASSIGN_OR_RETURN(auto h, wire::DecodeHeader(header, 4096));
    std::string body(h.length, '\0');
    COPSE_RETURN_NOT_OK(ReadExactRaw(body.data(), body.size(), timeout_ms));
    Json banner = Json::parse(body, nullptr, /*allow_exceptions=*/false);
    COPSE_RETURN_NOT_OK(tls::CheckBanner(banner, peer));
  }
  auto session = std::make_unique<tls::FdSession>(context, role, peer, fd_);
  COPSE_RETURN_NOT_OK(session->Handshake(timeout_ms));
  tls_ = std::move(session);
  return Status::OK();
}

Result<size_t> Socket::ReadSomeRaw(char* p, size_t n, int timeout_ms) {
  for (;;) {
    ssize_t r;
    if (local_) {
      // recvmsg, so that descriptors passed with these bytes are kept rather than dropped.
      iovec iov{p, n};
      alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * 4)];
      msghdr msg{};
      msg.msg_iov = &iov;
      msg.msg_iovlen = 1;
      msg.msg_control = control;
      msg.msg_controllen = sizeof control;
      r = ::recvmsg(fd_, &msg, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
      if (r >= 0) {
        for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c)) {
          if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
          const size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
          for (size_t i = 0; i < count; ++i) {
            int fd;
            std::memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof fd);
            received_fds_.push_back(fd);
          }
        }
      }
    } else {
      r = ::recv(fd_, p, n, MSG_DONTWAIT);
    }
    if (r > 0) return static_cast<size_t>(r);
    if (r == 0) return Status::Unavailable("peer closed the connection");
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) {
      return Status::Unavailable(std::string("connection lost: ") + std::strerror(errno));
    }
    COPSE_RETURN_NOT_OK(Wait(fd_, POLLIN, timeout_ms));
  }
}

Status Socket::WriteAll(const char* p, size_t n) {
  iovec iov{const_cast<char*>(p), n};
  return WriteV(&iov, 1);
}

Status Socket::WriteV(iovec* iov, size_t count, int pass_fd) {
  return tls_ ? WriteVTls(iov, count) : WriteVRaw(iov, count, pass_fd);
}

Status Socket::WriteVTls(const iovec* iov, size_t count) {
  // Large pieces are encrypted straight from the caller's memory; small ones (frame headers,
  // batches of small messages) are gathered first, so that each does not become a record and
  // a system call of its own.
  constexpr size_t kGatherBelow = 16 << 10;
  std::string gathered;
  auto flush = [&]() -> Status {
    if (gathered.empty()) return Status::OK();
    Status st = tls_->Write(gathered.data(), gathered.size(), -1);
    gathered.clear();
    return st;
  };
  for (size_t i = 0; i < count; ++i) {
    const char* base = static_cast<const char*>(iov[i].iov_base);
    if (iov[i].iov_len < kGatherBelow) {
      gathered.append(base, iov[i].iov_len);
      if (gathered.size() >= kGatherBelow) COPSE_RETURN_NOT_OK(flush());
    } else {
      COPSE_RETURN_NOT_OK(flush());
      COPSE_RETURN_NOT_OK(tls_->Write(base, iov[i].iov_len, -1));
    }
  }
  return flush();
}

Status Socket::WriteVRaw(iovec* iov, size_t count, int pass_fd) {
  if (pass_fd >= 0 && count == 0) return Status::InvalidArgument("a descriptor needs at least one byte to travel with");
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  while (count > 0) {
    msghdr msg{};
    msg.msg_iov = iov;
    msg.msg_iovlen = std::min<size_t>(count, IOV_MAX);
    if (pass_fd >= 0) {  // with the first bytes sent only
      msg.msg_control = control;
      msg.msg_controllen = sizeof control;
      cmsghdr* c = CMSG_FIRSTHDR(&msg);
      c->cmsg_level = SOL_SOCKET;
      c->cmsg_type = SCM_RIGHTS;
      c->cmsg_len = CMSG_LEN(sizeof(int));
      std::memcpy(CMSG_DATA(c), &pass_fd, sizeof pass_fd);
    }
    ssize_t w = ::sendmsg(fd_, &msg, MSG_NOSIGNAL);
    if (w < 0) {
      if (errno == EINTR) continue;
      return Status::Unavailable(std::string("connection lost: ") + std::strerror(errno));
    }
    pass_fd = -1;
    AdvanceIovec(iov, count, static_cast<size_t>(w));
  }
  return Status::OK();
}

Status BufferedSocket::ReadFull(char* p, size_t n, int timeout_ms) {
  size_t have = std::min(n, end_ - begin_);
  std::memcpy(p, buf_.data() + begin_, have);
  begin_ += have;
  if (begin_ == end_) begin_ = end_ = 0;
  while (have < n) {
    size_t want = n - have;
    if (want >= buf_.size() / 2) {
      COPSE_ASSIGN_OR_RETURN(size_t got, sock_.ReadSome(p + have, want, timeout_ms));
      have += got;
    } else {
      COPSE_ASSIGN_OR_RETURN(size_t got, sock_.ReadSome(buf_.data(), buf_.size(), timeout_ms));
      size_t take = std::min(got, want);
      std::memcpy(p + have, buf_.data(), take);
      have += take;
      begin_ = take;
      end_ = got;
      if (begin_ == end_) begin_ = end_ = 0;
    }
  }
  return Status::OK();
}

Status WriteFrame(Socket& s, wire::FrameType type, std::string_view body, int pass_fd) {
  auto h = wire::EncodeHeader(type, static_cast<uint32_t>(body.size()));
  iovec iov[2] = {{h.data(), h.size()}, {const_cast<char*>(body.data()), body.size()}};
  return s.WriteV(iov, body.empty() ? 1 : 2, pass_fd);
}

Result<wire::FrameHeader> ReadHeader(BufferedSocket& s, uint32_t max_body, int first_byte_timeout_ms, int timeout_ms) {
  char h[wire::kHeaderBytes];
  COPSE_RETURN_NOT_OK(s.ReadFull(h, 1, first_byte_timeout_ms));
  COPSE_RETURN_NOT_OK(s.ReadFull(h + 1, sizeof h - 1, timeout_ms));
  return wire::DecodeHeader(h, max_body);
}

Result<std::string> ReadBody(BufferedSocket& s, const wire::FrameHeader& h, int timeout_ms) {
  std::string body(h.length, '\0');
  COPSE_RETURN_NOT_OK(s.ReadFull(body.data(), body.size(), timeout_ms));
  return body;
}

Result<Json> ReadJson(BufferedSocket& s, uint32_t max_body, int first_byte_timeout_ms, int timeout_ms) {
  COPSE_ASSIGN_OR_RETURN(auto h, ReadHeader(s, max_body, first_byte_timeout_ms, timeout_ms));
  COPSE_ASSIGN_OR_RETURN(std::string body, ReadBody(s, h, timeout_ms));
  if (h.type != wire::FrameType::kJson) return Status::InvalidArgument("expected a JSON frame");
  if (JsonNestingExceeds(body, kMaxJsonDepth) != std::string_view::npos) {
    return Status::InvalidArgument("frame body nests deeper than " + std::to_string(kMaxJsonDepth) + " levels");
  }
  Json j = Json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return Status::InvalidArgument("frame body is not a JSON object");
  return j;
}

}  // namespace copse::chan::internal
