#include "common/tls.h"

#include <fcntl.h>
#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/rand.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "common/wire.h"

namespace copse::tls {

namespace {

/// OpenSSL's queued errors as one line (and the queue emptied).
std::string OpenSslErrors() {
  std::string text;
  while (unsigned long e = ERR_get_error()) {
    char buf[256];
    ERR_error_string_n(e, buf, sizeof(buf));
    const char* reason = ERR_reason_error_string(e);
    if (!text.empty()) text += "; ";
    text += reason ? reason : buf;
  }
  return text.empty() ? "unknown TLS error" : text;
}

/// Writes `write(file)` to path with `mode`, through a temporary file renamed into place.
template <class Write>
Status WritePem(const std::filesystem::path& path, mode_t mode, Write write) {
  const std::string tmp = path.string() + ".tmp";
  ::unlink(tmp.c_str());  // a leftover keeps its mode; a planted link must not be followed
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, mode);
  if (fd < 0) return Status::IOError("cannot create " + tmp + ": " + std::strerror(errno));
  FILE* file = ::fdopen(fd, "w");
  if (!file) {
    ::close(fd);
    return Status::IOError("cannot write " + tmp);
  }
  const bool written = write(file) == 1;
  const bool closed = std::fclose(file) == 0;
  if (!written || !closed) return Status::IOError("cannot write " + tmp + ": " + OpenSslErrors());
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) return Status::IOError("cannot rename " + tmp + ": " + ec.message());
  return Status::OK();
}

}  // namespace

bool HasCertificate(const std::filesystem::path& dir) {
  std::error_code ec;
  return std::filesystem::exists(dir / kCertFileName, ec);
}

Status CreateClusterCertificateIfAbsent(const std::filesystem::path& dir) {
  if (HasCertificate(dir)) return Status::OK();
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return Status::IOError("cannot create " + dir.string() + ": " + ec.message());
  std::unique_ptr<EVP_PKEY, decltype(&EVP_PKEY_free)> key(EVP_EC_gen("P-256"), EVP_PKEY_free);
  std::unique_ptr<X509, decltype(&X509_free)> cert(X509_new(), X509_free);
  if (!key || !cert) return Status::Internal("cannot make a key: " + OpenSslErrors());
  unsigned char serial[16];
  if (RAND_bytes(serial, sizeof(serial)) != 1) return Status::Internal("no random bytes: " + OpenSslErrors());
  serial[0] &= 0x7f;  // a positive serial number
  std::unique_ptr<BIGNUM, decltype(&BN_free)> bn(BN_bin2bn(serial, sizeof(serial), nullptr), BN_free);
  X509_set_version(cert.get(), 2);
  BN_to_ASN1_INTEGER(bn.get(), X509_get_serialNumber(cert.get()));
  X509_gmtime_adj(X509_getm_notBefore(cert.get()), -3600);  // clocks of a cluster differ a little
  X509_gmtime_adj(X509_getm_notAfter(cert.get()), 10L * 365 * 24 * 3600);
  X509_set_pubkey(cert.get(), key.get());
  X509_NAME* name = X509_get_subject_name(cert.get());
  X509_NAME_add_entry_by_txt(name, "O", MBSTRING_ASC, reinterpret_cast<const unsigned char*>("copse"), -1, -1, 0);
  X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC, reinterpret_cast<const unsigned char*>("copse cluster"), -1, -1, 0);
  X509_set_issuer_name(cert.get(), name);
  X509V3_CTX v3;
  X509V3_set_ctx_nodb(&v3);
  X509V3_set_ctx(&v3, cert.get(), cert.get(), nullptr, nullptr, 0);
  for (auto [nid, value] :
       {std::pair{NID_basic_constraints, "critical,CA:TRUE"}, std::pair{NID_key_usage, "critical,digitalSignature,keyCertSign"},
        std::pair{NID_subject_key_identifier, "hash"}}) {
    X509_EXTENSION* ext = X509V3_EXT_conf_nid(nullptr, &v3, nid, value);
    if (!ext) return Status::Internal("cannot make a certificate extension: " + OpenSslErrors());
    X509_add_ext(cert.get(), ext, -1);
    X509_EXTENSION_free(ext);
  }
  if (X509_sign(cert.get(), key.get(), EVP_sha256()) == 0) return Status::Internal("cannot sign: " + OpenSslErrors());
  // The key first: a directory with a certificate is taken as complete.
  COPSE_RETURN_NOT_OK(WritePem(dir / kKeyFileName, 0600, [&](FILE* f) {
    return PEM_write_PrivateKey(f, key.get(), nullptr, nullptr, 0, nullptr, nullptr);
  }));
  return WritePem(dir / kCertFileName, 0644, [&](FILE* f) { return PEM_write_X509(f, cert.get()); });
}

Result<std::shared_ptr<const Context>> Context::Load(const std::filesystem::path& dir) {
  const auto cert = dir / kCertFileName, key = dir / kKeyFileName, ca = dir / kCaFileName;
  std::error_code ec;
  for (const auto& file : {cert, key}) {
    if (!std::filesystem::exists(file, ec))
      return Status::NotFound("TLS directory " + dir.string() + " has no " + file.filename().string());
  }
  struct stat st {};
  if (::stat(key.c_str(), &st) == 0 && (st.st_mode & 077) != 0)
    return Status::PermissionDenied(key.string() + " is readable by others than its owner (chmod 600 it)");
  for (const auto& file : {cert, key}) {
    if (::access(file.c_str(), R_OK) != 0)
      return Status::PermissionDenied("cannot read " + file.string() + ": " + std::strerror(errno));
  }
  SSL_CTX* ctx = SSL_CTX_new(TLS_method());
  if (!ctx) return Status::Internal("cannot make a TLS context: " + OpenSslErrors());
  std::shared_ptr<const Context> made(new Context(ctx, dir));
  SSL_CTX_set_min_proto_version(ctx, TLS1_3_VERSION);
  // AES-128-GCM first: as safe for this use, and about a third faster than AES-256 on bulk
  // output fetches (docs/benchmarks.md).
  SSL_CTX_set_ciphersuites(ctx, "TLS_AES_128_GCM_SHA256:TLS_AES_256_GCM_SHA384:TLS_CHACHA20_POLY1305_SHA256");
  SSL_CTX_set_num_tickets(ctx, 0);  // no resumption: nothing but the handshake crosses before data
  SSL_CTX_set_session_cache_mode(ctx, SSL_SESS_CACHE_OFF);
  SSL_CTX_set_mode(ctx, SSL_MODE_RELEASE_BUFFERS);
  if (SSL_CTX_use_certificate_chain_file(ctx, cert.c_str()) != 1)
    return Status::InvalidArgument(cert.string() + ": not a PEM certificate: " + OpenSslErrors());
  if (SSL_CTX_use_PrivateKey_file(ctx, key.c_str(), SSL_FILETYPE_PEM) != 1 || SSL_CTX_check_private_key(ctx) != 1) {
    const bool mismatch = ERR_GET_REASON(ERR_peek_last_error()) == X509_R_KEY_VALUES_MISMATCH;
    return Status::InvalidArgument(key.string() + (mismatch ? " is not the key of " + cert.string() : ": not a PEM private key") +
                                   ": " + OpenSslErrors());
  }
  const auto trusted = std::filesystem::exists(ca, ec) ? ca : cert;
  if (SSL_CTX_load_verify_locations(ctx, trusted.c_str(), nullptr) != 1)
    return Status::InvalidArgument(trusted.string() + ": cannot load it as the cluster's CA: " + OpenSslErrors());
  SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, nullptr);
  // A trusted certificate is an anchor even when it is not self-signed (a cluster.crt issued by
  // another CA, given without ca.crt: the one certificate trusted).
  X509_STORE_set_flags(SSL_CTX_get_cert_store(ctx), X509_V_FLAG_PARTIAL_CHAIN);
  return made;
}

Context::~Context() { SSL_CTX_free(ctx_); }

Session::Session(const Context& context, Role role, std::string peer) : ssl_(SSL_new(context.native())), peer_(std::move(peer)) {
  in_ = BIO_new(BIO_s_mem());
  out_ = BIO_new(BIO_s_mem());
  BIO_set_mem_eof_return(in_, -1);  // an empty input is "more to come", not end of stream
  SSL_set_bio(ssl_, in_, out_);
  if (role == Role::kClient) {
    SSL_set_connect_state(ssl_);
  } else {
    SSL_set_accept_state(ssl_);
  }
}

Session::~Session() { SSL_free(ssl_); }

std::string Session::DrainOutput() {
  std::string out;
  const size_t pending = BIO_ctrl_pending(out_);
  if (pending == 0) return out;
  out.resize(pending);
  const int n = BIO_read(out_, out.data(), static_cast<int>(pending));
  out.resize(n > 0 ? static_cast<size_t>(n) : 0);
  return out;
}

namespace {

/// Why the call on `ssl` that returned `ret` failed, as Unavailable naming the peer.
Status SslFailure(SSL* ssl, int ret, const std::string& doing, const std::string& peer) {
  const int err = SSL_get_error(ssl, ret);
  std::string why;
  if (err == SSL_ERROR_ZERO_RETURN || (err == SSL_ERROR_SYSCALL && ERR_peek_error() == 0 && errno == 0) ||
      (err == SSL_ERROR_SSL && ERR_GET_REASON(ERR_peek_error()) == SSL_R_UNEXPECTED_EOF_WHILE_READING)) {
    ERR_clear_error();
    why = "the peer closed the connection";
  } else if (err == SSL_ERROR_SYSCALL && ERR_peek_error() == 0) {
    why = std::strerror(errno);
  } else {
    why = err == SSL_ERROR_SSL || err == SSL_ERROR_SYSCALL ? OpenSslErrors() : "error " + std::to_string(err);
  }
  const long verify = SSL_get_verify_result(ssl);
  if (verify != X509_V_OK) why += " (" + std::string(X509_verify_cert_error_string(verify)) + ")";
  return Status::Unavailable("TLS " + doing + " with " + peer + " failed: " + why);
}

}  // namespace

Status Session::Failure(int ret, const std::string& doing) { return SslFailure(ssl_, ret, doing, peer_); }

namespace {

// A BIO over a socket descriptor that never blocks and never raises SIGPIPE (OpenSSL's own
// socket BIO writes with write(2)): the descriptor keeps its blocking mode for the code that
// shares it, and FdSession polls when a call would block.
int FdOf(BIO* b) { return static_cast<int>(reinterpret_cast<intptr_t>(BIO_get_data(b))); }

int FdBioWrite(BIO* b, const char* data, size_t n, size_t* written) {
  BIO_clear_retry_flags(b);
  const ssize_t w = ::send(FdOf(b), data, n, MSG_NOSIGNAL | MSG_DONTWAIT);
  if (w >= 0) {
    *written = static_cast<size_t>(w);
    return 1;
  }
  if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) BIO_set_retry_write(b);
  return 0;
}

int FdBioRead(BIO* b, char* data, size_t n, size_t* read) {
  BIO_clear_retry_flags(b);
  const ssize_t r = ::recv(FdOf(b), data, n, MSG_DONTWAIT);
  if (r > 0) {
    *read = static_cast<size_t>(r);
    return 1;
  }
  if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) BIO_set_retry_read(b);
  return 0;
}

long FdBioCtrl(BIO*, int cmd, long, void*) { return cmd == BIO_CTRL_FLUSH ? 1 : 0; }

int FdBioCreate(BIO* b) {
  BIO_set_init(b, 1);
  return 1;
}

const BIO_METHOD* FdBioMethod() {
  static BIO_METHOD* method = [] {
    BIO_METHOD* m = BIO_meth_new(BIO_get_new_index() | BIO_TYPE_SOURCE_SINK | BIO_TYPE_DESCRIPTOR, "copse socket");
    BIO_meth_set_write_ex(m, FdBioWrite);
    BIO_meth_set_read_ex(m, FdBioRead);
    BIO_meth_set_ctrl(m, FdBioCtrl);
    BIO_meth_set_create(m, FdBioCreate);
    return m;
  }();
  return method;
}

}  // namespace

FdSession::FdSession(const Context& context, Session::Role role, std::string peer, int fd)
    : ssl_(SSL_new(context.native())), peer_(std::move(peer)), fd_(fd) {
  BIO* bio = BIO_new(FdBioMethod());
  BIO_set_data(bio, reinterpret_cast<void*>(static_cast<intptr_t>(fd)));
  SSL_set_bio(ssl_, bio, bio);                        // one reference, taken by ssl_ for both directions
  SSL_set_mode(ssl_, SSL_MODE_ENABLE_PARTIAL_WRITE);  // a write returns what went out; Write loops
  if (role == Session::Role::kClient) {
    SSL_set_connect_state(ssl_);
  } else {
    SSL_set_accept_state(ssl_);
  }
}

FdSession::~FdSession() { SSL_free(ssl_); }

Status FdSession::WaitFor(int ret, const std::string& doing, int timeout_ms) {
  const int err = SSL_get_error(ssl_, ret);
  short events;
  if (err == SSL_ERROR_WANT_READ) {
    events = POLLIN;
  } else if (err == SSL_ERROR_WANT_WRITE) {
    events = POLLOUT;
  } else {
    return SslFailure(ssl_, ret, doing, peer_);
  }
  pollfd p{fd_, events, 0};
  for (;;) {
    const int n = ::poll(&p, 1, timeout_ms);
    if (n > 0) return Status::OK();
    if (n == 0) return Status::Timeout("no data from " + peer_ + " within " + std::to_string(timeout_ms) + " ms");
    if (errno != EINTR) return Status::Unavailable(std::string("poll: ") + std::strerror(errno));
  }
}

Status FdSession::Handshake(int timeout_ms) {
  for (;;) {
    ERR_clear_error();
    errno = 0;
    const int ret = SSL_do_handshake(ssl_);
    if (ret == 1) return Status::OK();
    COPSE_RETURN_NOT_OK(WaitFor(ret, "handshake", timeout_ms));
  }
}

Result<size_t> FdSession::Read(char* p, size_t n, int timeout_ms) {
  const int want = static_cast<int>(std::min<size_t>(n, 1 << 30));
  for (;;) {
    ERR_clear_error();
    errno = 0;
    const int got = SSL_read(ssl_, p, want);
    if (got > 0) return static_cast<size_t>(got);
    COPSE_RETURN_NOT_OK(WaitFor(got, "read", timeout_ms));
  }
}

Status FdSession::Write(const char* p, size_t n, int timeout_ms) {
  while (n > 0) {
    ERR_clear_error();
    errno = 0;
    const int put = SSL_write(ssl_, p, static_cast<int>(std::min<size_t>(n, 1 << 30)));
    if (put > 0) {
      p += put;
      n -= static_cast<size_t>(put);
      continue;
    }
    COPSE_RETURN_NOT_OK(WaitFor(put, "write", timeout_ms));
  }
  return Status::OK();
}

Result<std::string> Session::Start() {
  std::lock_guard<std::mutex> lock(mu_);
  ERR_clear_error();  // SSL_get_error reads the thread's queue: another session's errors must not count
  if (!SSL_is_server(ssl_)) {
    const int ret = SSL_do_handshake(ssl_);
    if (ret != 1 && SSL_get_error(ssl_, ret) != SSL_ERROR_WANT_READ) return Failure(ret, "handshake");
  }
  return DrainOutput();
}

Result<std::string> Session::Receive(const char* data, size_t n, std::string& plain) {
  std::lock_guard<std::mutex> lock(mu_);
  ERR_clear_error();
  uint32_t magic = 0;
  if (first_bytes_.size() < sizeof magic) {  // a copse frame where a ClientHello should be: a plaintext peer
    first_bytes_.append(data, std::min(n, sizeof magic - first_bytes_.size()));
    if (first_bytes_.size() == sizeof magic) std::memcpy(&magic, first_bytes_.data(), sizeof magic);
    if (magic == wire::kMagic)
      return Status::Unavailable(peer_ + " speaks plaintext copse, not TLS: give it the cluster's TLS directory (--tls-dir)");
  }
  if (n > 0 && BIO_write(in_, data, static_cast<int>(n)) != static_cast<int>(n))
    return Status::Internal("TLS: cannot buffer received bytes");
  if (!established_) {
    const int ret = SSL_do_handshake(ssl_);
    if (ret == 1) {
      established_ = true;
    } else if (SSL_get_error(ssl_, ret) != SSL_ERROR_WANT_READ) {
      Status failed = Failure(ret, "handshake");
      unsent_ = DrainOutput();
      return failed;
    }
  }
  if (established_) {
    char buf[16 << 10];
    while (true) {
      const int got = SSL_read(ssl_, buf, sizeof(buf));
      if (got > 0) {
        plain.append(buf, static_cast<size_t>(got));
        continue;
      }
      const int err = SSL_get_error(ssl_, got);
      if (err == SSL_ERROR_WANT_READ) break;
      if (err == SSL_ERROR_ZERO_RETURN) return Status::Unavailable(peer_ + " closed the TLS session");
      Status failed = Failure(got, "read");
      unsent_ = DrainOutput();
      return failed;
    }
  }
  return DrainOutput();
}

std::string Session::TakeUnsent() {
  std::lock_guard<std::mutex> lock(mu_);
  return std::move(unsent_);
}

Result<std::string> Session::Encrypt(std::string_view plain) {
  std::lock_guard<std::mutex> lock(mu_);
  ERR_clear_error();
  // With a memory BIO a write takes everything: the records are only buffered.
  size_t done = 0;
  while (done < plain.size()) {
    const int chunk = static_cast<int>(std::min<size_t>(plain.size() - done, 1 << 30));
    const int n = SSL_write(ssl_, plain.data() + done, chunk);
    if (n <= 0) return Failure(n, "write");
    done += static_cast<size_t>(n);
  }
  return DrainOutput();
}

bool Session::established() const {
  std::lock_guard<std::mutex> lock(mu_);
  return established_;
}

namespace {
constexpr const char* kBannerMessage =
    "this copse server requires TLS: give this client the cluster's TLS directory (--tls-dir, COPSE_TLS_DIR, or the job "
    "manager's state directory with its tls/ folder)";
}

std::string Banner() {
  return wire::EncodeFrame(wire::FrameType::kJson, DumpJson(Json{{"op", "error"}, {"tls", 1}, {"message", kBannerMessage}}));
}

bool IsBanner(const Json& first) { return first.is_object() && StringMember(first, "op") == "error" && first.contains("tls"); }

Status CheckBanner(const Json& first, const std::string& peer) {
  if (IsBanner(first)) return Status::OK();
  if (StringMember(first, "op") == "hello")
    return Status::FailedPrecondition(peer +
                                      " speaks plaintext: it was started without TLS (drop this client's TLS settings, or "
                                      "restart it with --tls)");
  return Status::FailedPrecondition(peer + " did not greet like a TLS copse server");
}

}  // namespace copse::tls
