#pragma once
// TLS for the TCP connections of a cluster (control: job manager <-> daemons and clients; data:
// daemon <-> daemon and clients), through OpenSSL.
//
// Trust: a cluster is a set of processes that hold a certificate and key chaining to the
// cluster's CA (by default one self-signed certificate, made by `copse jm --tls` the way it
// makes the secret, which is both every process's certificate and the only CA). Both sides of a
// connection present their certificate and verify the other's (mutual TLS), with TLS 1.3 only.
// Host names are not checked: a cluster's processes move between hosts, and holding the
// cluster's key is what makes one of them. The shared-secret handshake (common/auth.h) still runs,
// inside the TLS session. Local (Unix domain) sockets stay plaintext: they never leave the host
// and network namespace, and clients check who holds them (common/local_peer.h).
//
// On the wire, a TLS server speaks first, in plaintext, with one copse frame: Banner(), an
// {"op":"error"} that a plaintext client reads as the reason it is refused ("this server
// requires TLS…"). A TLS client reads that frame (CheckBanner: a plaintext server's hello
// instead is answered by a clear error) and then starts the handshake.
//
// Two kinds of session:
//  - Session is transport-agnostic (memory BIOs): the caller moves ciphertext between it and the
//    socket, so the same session serves asio's asynchronous connections and a connection handed
//    from a blocking client to them. It is thread-safe: a writer thread may encrypt while the io
//    thread decrypts. Control messages are small; the extra copies do not matter.
//  - FdSession reads and writes a non-blocking socket itself: records are decrypted straight
//    into the caller's memory and encrypted straight from it, for the data plane's bulk
//    transfers (one thread per connection). One thread at a time.
#include <filesystem>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>

#include "common/json_util.h"
#include "common/status.h"

struct ssl_ctx_st;
struct ssl_st;
struct bio_st;

namespace copse::tls {

/// Files of a TLS directory: `cluster.crt` (this process's certificate, PEM), `cluster.key` (its
/// key, mode 0600), and optionally `ca.crt` (the CAs a peer's certificate must chain to; without
/// it, cluster.crt is the only trusted certificate).
constexpr const char* kCertFileName = "cluster.crt";
constexpr const char* kKeyFileName = "cluster.key";
constexpr const char* kCaFileName = "ca.crt";
/// The TLS directory inside a job manager's state directory.
constexpr const char* kStateSubdir = "tls";

/// Makes `dir` with a fresh self-signed cluster certificate (ECDSA P-256, 10 years) and its key,
/// unless it holds one already (an existing pair is kept, so a restart changes nothing).
Status CreateClusterCertificateIfAbsent(const std::filesystem::path& dir);
/// Whether `dir` holds a certificate (a TLS directory's marker).
bool HasCertificate(const std::filesystem::path& dir);

/// A configured SSL_CTX, shared (read-only) by every session of a process.
class Context {
 public:
  /// Loads `dir`'s files; InvalidArgument naming the file and what is wrong with it.
  static Result<std::shared_ptr<const Context>> Load(const std::filesystem::path& dir);
  ~Context();
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;

  const std::filesystem::path& dir() const { return dir_; }
  ssl_ctx_st* native() const { return ctx_; }

 private:
  Context(ssl_ctx_st* ctx, std::filesystem::path dir) : ctx_(ctx), dir_(std::move(dir)) {}
  ssl_ctx_st* ctx_;
  std::filesystem::path dir_;
};

/// One side of one TLS connection.
class Session {
 public:
  enum class Role { kClient, kServer };
  Session(const Context& context, Role role, std::string peer);
  ~Session();
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  /// Client: the first handshake bytes to send. Server: empty.
  Result<std::string> Start();
  /// Takes `n` received bytes. Plaintext they complete is appended to `plain`, and bytes the
  /// session must send back (the handshake's) are returned. Unavailable, naming the peer and
  /// OpenSSL's reason, when they are not TLS the session accepts (a bad certificate, garbage, a
  /// plaintext copse frame).
  Result<std::string> Receive(const char* data, size_t n, std::string& plain);
  /// What the session had to send when Receive failed (the alert telling the peer why): sent
  /// before closing, so that the peer learns the reason rather than a closed connection.
  std::string TakeUnsent();
  /// The records carrying `plain`; only once established(). Unavailable once the session broke.
  Result<std::string> Encrypt(std::string_view plain);
  /// Whether the handshake is over (application data may flow).
  bool established() const;

 private:
  std::string DrainOutput();                          // requires mu_
  Status Failure(int ret, const std::string& doing);  // requires mu_

  mutable std::mutex mu_;
  ssl_st* ssl_;
  bio_st* in_;   // owned by ssl_
  bio_st* out_;  // owned by ssl_
  std::string peer_;
  bool established_ = false;
  std::string first_bytes_;  // the first 4 bytes received, to tell a plaintext copse peer
  std::string unsent_;       // see TakeUnsent
};

/// One side of one TLS connection over the non-blocking socket `fd` (not owned), after the
/// banner. Every call waits at most `timeout_ms` for the socket (negative: for ever); Timeout
/// then, Unavailable when the peer closed, reset or broke the session.
class FdSession {
 public:
  FdSession(const Context& context, Session::Role role, std::string peer, int fd);
  ~FdSession();
  FdSession(const FdSession&) = delete;
  FdSession& operator=(const FdSession&) = delete;

  Status Handshake(int timeout_ms);
  /// Reads 1..n bytes of plaintext.
  Result<size_t> Read(char* p, size_t n, int timeout_ms);
  /// Writes all n bytes (as records of up to 16 KiB).
  Status Write(const char* p, size_t n, int timeout_ms);

 private:
  /// Waits for what SSL_get_error says the call returning `ret` needs; the error otherwise.
  Status WaitFor(int ret, const std::string& doing, int timeout_ms);

  ssl_st* ssl_;
  std::string peer_;
  int fd_;
};

/// The plaintext frame a TLS server sends first (see above).
std::string Banner();
/// The message of a TLS server's banner (Json `first` is the first frame a TLS client read): OK
/// when it is one, else FailedPrecondition saying the server at `peer` speaks plaintext.
Status CheckBanner(const Json& first, const std::string& peer);
/// Whether a plaintext copse client's first frame `first` is a TLS server's banner (it gets the
/// banner's message as its error).
bool IsBanner(const Json& first);

}  // namespace copse::tls
