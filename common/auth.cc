#include "common/auth.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>

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
  struct stat st {};
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
  if (std::filesystem::create_directories(dir, ec) && !ec) {
    std::filesystem::permissions(dir, std::filesystem::perms::owner_all, std::filesystem::perm_options::replace, ec);
  }
  if (ec) return Status::IOError("cannot create state directory " + dir.string() + ": " + ec.message());
  // Whoever can write there can plant a secret of their own (and so take the cluster) or
  // replace the journal: such a directory, or a secret someone else owns, is refused.
  struct stat dir_st {};
  if (stat(dir.c_str(), &dir_st) != 0) return Status::IOError("cannot read state directory " + dir.string());
  if (dir_st.st_mode & S_IWOTH) {
    return Status::PermissionDenied("state directory " + dir.string() + " is writable by every user; chmod o-w it");
  }
  if (dir_st.st_uid != geteuid()) {
    return Status::PermissionDenied("state directory " + dir.string() + " belongs to user " + std::to_string(dir_st.st_uid) +
                                    ", not to this one (" + std::to_string(geteuid()) + "): its owner could replace the secret");
  }
  auto path = dir / kSecretFileName;
  struct stat secret_st {};
  if (lstat(path.c_str(), &secret_st) == 0) {
    if (S_ISLNK(secret_st.st_mode)) return Status::PermissionDenied("secret file " + path.string() + " is a symbolic link");
    if (secret_st.st_uid != geteuid()) {
      return Status::PermissionDenied("secret file " + path.string() + " belongs to user " + std::to_string(secret_st.st_uid) +
                                      ", not to this one (" + std::to_string(geteuid()) + ")");
    }
  }
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

namespace {

bool IsNonce(std::string_view s) {
  return s.size() == 32 &&
         std::all_of(s.begin(), s.end(), [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); });
}

std::string ServerProof(std::string_view secret, std::string_view client_nonce, std::string_view server_nonce) {
  return Mac(secret, "copse-server/" + std::string(client_nonce) + "/" + std::string(server_nonce));
}

}  // namespace

Result<HelloAnswer> AnswerHello(const Json& hello, std::string_view secret, std::string_view role) {
  const std::string nonce = StringMember(hello, "nonce");
  if (StringMember(hello, "op") != "hello" || !IsNonce(nonce)) {
    return Status::InvalidArgument("expected a copse hello with a nonce of 32 hex digits, got " + DumpJson(hello).substr(0, 200));
  }
  HelloAnswer a;
  a.server_nonce = nonce;
  a.client_nonce = NewNonce();
  a.message = {{"op", "auth"}, {"role", role}, {"mac", Mac(secret, nonce)}, {"nonce", a.client_nonce}};
  return a;
}

Status CheckWelcome(const Json& welcome, std::string_view secret, const HelloAnswer& answer) {
  const std::string op = StringMember(welcome, "op");
  if (op == "error") return Status::PermissionDenied("refused: " + StringMember(welcome, "message"));
  if (op != "welcome") return Status::PermissionDenied("expected a welcome, got " + DumpJson(welcome).substr(0, 200));
  auto proof = welcome.find("proof");
  if (proof == welcome.end() || !proof->is_string()) {
    return Status::PermissionDenied(
        "the server did not prove it holds the secret (not the copse server meant, or a build "
        "from before mutual authentication)");
  }
  if (!ConstantTimeEquals(proof->get<std::string>(), ServerProof(secret, answer.client_nonce, answer.server_nonce))) {
    return Status::PermissionDenied("the server's proof is wrong: it does not hold this secret");
  }
  return Status::OK();
}

Json Welcome(const Json& auth, std::string_view secret, std::string_view server_nonce) {
  Json welcome = {{"op", "welcome"}};
  const std::string client_nonce = StringMember(auth, "nonce");
  if (IsNonce(client_nonce)) welcome["proof"] = ServerProof(secret, client_nonce, server_nonce);
  return welcome;
}

bool ConstantTimeEquals(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

}  // namespace copse::auth
