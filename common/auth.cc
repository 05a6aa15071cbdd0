#include "common/auth.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <openssl/hmac.h>
#include <openssl/rand.h>

#include "common/json_util.h"

namespace copse::auth {
namespace {

std::string Hex(const unsigned char* p, size_t n) {
  static const char* kHex = "0123456789abcdef";
  std::string s(2 * n, '0');
  for (size_t i = 0; i < n; ++i) {
    s[2 * i] = kHex[p[i] >> 4];
    s[2 * i + 1] = kHex[p[i] & 0xf];
  }
  return s;
}

std::string RandomHex(size_t bytes) {
  std::string buf(bytes, '\0');
  if (RAND_bytes(reinterpret_cast<unsigned char*>(buf.data()), static_cast<int>(bytes)) != 1) {
    // RAND_bytes only fails without an entropy source; /dev/urandom is then the fallback.
    int fd = open("/dev/urandom", O_RDONLY);
    if (fd < 0 || read(fd, buf.data(), bytes) != static_cast<ssize_t>(bytes)) std::abort();
    close(fd);
  }
  return Hex(reinterpret_cast<const unsigned char*>(buf.data()), bytes);
}

std::string Trim(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == '\r' || s.back() == ' ')) s.pop_back();
  return s;
}

}  // namespace

Result<std::string> ReadSecret(const std::filesystem::path& file) {
  struct stat st{};
  if (stat(file.c_str(), &st) != 0) return Status::NotFound("no secret file at " + file.string());
  if (st.st_mode & (S_IRWXG | S_IRWXO)) {
    return Status::PermissionDenied("secret file " + file.string() + " is readable by others; chmod 600 it");
  }
  COPSE_ASSIGN_OR_RETURN(std::string text, ReadFile(file.string()));
  text = Trim(std::move(text));
  if (text.size() < 32) return Status::InvalidArgument("secret file " + file.string() + " is too short");
  return text;
}

Result<std::string> LoadOrCreateSecret(const std::filesystem::path& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return Status::IOError("cannot create state directory " + dir.string() + ": " + ec.message());
  auto path = dir / kSecretFileName;
  if (std::filesystem::exists(path)) return ReadSecret(path);
  std::string secret = RandomHex(32);
  int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL, 0600);
  if (fd < 0) {
    if (errno == EEXIST) return ReadSecret(path);  // another process created it first
    return Status::IOError("cannot create " + path.string());
  }
  std::string line = secret + "\n";
  bool ok = write(fd, line.data(), line.size()) == static_cast<ssize_t>(line.size());
  close(fd);
  if (!ok) return Status::IOError("cannot write " + path.string());
  return secret;
}

std::string NewNonce() { return RandomHex(16); }

std::string Mac(std::string_view secret, std::string_view nonce) {
  unsigned char out[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  HMAC(EVP_sha256(), secret.data(), static_cast<int>(secret.size()), reinterpret_cast<const unsigned char*>(nonce.data()),
       nonce.size(), out, &len);
  return Hex(out, len);
}

bool ConstantTimeEquals(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

}  // namespace copse::auth
