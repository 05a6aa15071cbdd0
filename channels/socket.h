#pragma once
// Internal: blocking TCP and local (Unix domain) sockets with bounded waits, and copse frames
// over them — the one place the data server and the remote reader touch POSIX networking.
//
// Local sockets live in Linux's abstract namespace (no file to clean up; reachable from the
// same host and network namespace only) and can pass file descriptors (SCM_RIGHTS): a local
// Socket keeps every descriptor that arrives with the bytes it reads until TakeReceivedFd().
//
// Reads wait at most `timeout_ms` for progress (negative: forever) and report a peer that
// closed or reset the connection as Unavailable, a silent one as Timeout. Writes never raise
// SIGPIPE. A Socket is used by one thread at a time, except Shutdown(), which any thread may
// call to wake a thread blocked on it.
//
// TLS (common/tls.h): after StartTls a TCP Socket reads and writes through its session; every
// other member works as before.
#include <sys/uio.h>

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/json_util.h"
#include "common/status.h"
#include "common/tls.h"
#include "common/wire.h"

namespace copse::chan::internal {

class Socket {
 public:
  Socket() = default;
  explicit Socket(int fd, bool local = false) : fd_(fd), local_(local) {}
  ~Socket() { Close(); }
  Socket(Socket&& o) noexcept : fd_(o.fd_), local_(o.local_), received_fds_(std::move(o.received_fds_)), tls_(std::move(o.tls_)) {
    o.fd_ = -1;
    o.received_fds_.clear();
  }
  Socket& operator=(Socket&& o) noexcept;
  Socket(const Socket&) = delete;
  Socket& operator=(const Socket&) = delete;

  /// Connects to host:port (IPv4 or IPv6) within `timeout_ms`; Unavailable naming the peer.
  static Result<Socket> Connect(const std::string& host, uint16_t port, int timeout_ms);
  /// A listening socket bound to host:port (port 0: any free port).
  static Result<Socket> Listen(const std::string& host, uint16_t port);
  /// Connects to the local socket `name` (abstract namespace) within `timeout_ms`;
  /// NotFound when nothing on this host listens there.
  static Result<Socket> ConnectLocal(const std::string& name, int timeout_ms);
  /// A listening local socket `name` (abstract namespace); AlreadyExists when taken.
  static Result<Socket> ListenLocal(const std::string& name);

  /// Runs the connection over TLS from now on, within `timeout_ms`: a server sends the banner and
  /// answers the handshake, a client checks the banner (FailedPrecondition when the peer speaks
  /// plaintext) and starts it. `peer` names the other side in errors.
  Status StartTls(const tls::Context& context, tls::Session::Role role, const std::string& peer, int timeout_ms);
  bool tls() const { return tls_ != nullptr; }

  bool valid() const { return fd_ >= 0; }
  int fd() const { return fd_; }
  bool local() const { return local_; }
  void Close();
  /// Ends both directions; a thread blocked in a read or write returns an error.
  void Shutdown();
  /// The local port (for a listening socket bound to port 0).
  uint16_t LocalPort() const;

  /// Reads 1..n bytes.
  Result<size_t> ReadSome(char* p, size_t n, int timeout_ms);
  Status WriteAll(const char* p, size_t n);
  /// Writes every iovec in order; modifies `iov`. Local sockets: `pass_fd` >= 0 passes a
  /// duplicate of that descriptor with the first bytes.
  Status WriteV(iovec* iov, size_t count, int pass_fd = -1);
  /// Local sockets: the oldest descriptor received and not yet taken (the caller owns it), or
  /// -1. Descriptors never taken are closed with the socket.
  int TakeReceivedFd();
  bool has_received_fds() const { return !received_fds_.empty(); }

 private:
  Result<size_t> ReadSomeRaw(char* p, size_t n, int timeout_ms);
  Status ReadExactRaw(char* p, size_t n, int timeout_ms);
  Status WriteVRaw(iovec* iov, size_t count, int pass_fd);
  Status WriteVTls(const iovec* iov, size_t count);

  int fd_ = -1;
  bool local_ = false;
  std::vector<int> received_fds_;
  std::unique_ptr<tls::FdSession> tls_;
};

/// A socket with a read buffer: small reads (frame and record headers) come from the buffer,
/// large ones go straight into the caller's memory.
class BufferedSocket {
 public:
  explicit BufferedSocket(Socket s, size_t buffer_bytes = 256 << 10) : sock_(std::move(s)), buf_(buffer_bytes) {}
  Socket& socket() { return sock_; }
  /// Reads exactly n bytes; each wait for more bytes is bounded by timeout_ms.
  Status ReadFull(char* p, size_t n, int timeout_ms);
  size_t buffered() const { return end_ - begin_; }

 private:
  Socket sock_;
  std::vector<char> buf_;
  size_t begin_ = 0, end_ = 0;
};

/// Writes one frame (over a local socket, with a duplicate of `pass_fd` attached when >= 0).
Status WriteFrame(Socket& s, wire::FrameType type, std::string_view body, int pass_fd = -1);
inline Status WriteJson(Socket& s, const Json& j) { return WriteFrame(s, wire::FrameType::kJson, DumpJson(j)); }

/// Reads a frame header: waits up to `first_byte_timeout_ms` for it to begin, then
/// `timeout_ms` for the rest. Bad magic/version/type/length: InvalidArgument.
Result<wire::FrameHeader> ReadHeader(BufferedSocket& s, uint32_t max_body, int first_byte_timeout_ms, int timeout_ms);
/// Reads a kJson frame whose body parses as an object; `expect` names it in errors.
Result<Json> ReadJson(BufferedSocket& s, uint32_t max_body, int first_byte_timeout_ms, int timeout_ms);
/// Reads the body of a frame whose header was read, as text.
Result<std::string> ReadBody(BufferedSocket& s, const wire::FrameHeader& h, int timeout_ms);

}  // namespace copse::chan::internal
