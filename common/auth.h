#pragma once
// Shared-secret authentication. The job manager creates a random secret at first start (a
// 0600 file in its state directory); daemons and clients prove they hold it by answering a
// challenge with HMAC-SHA256(secret, nonce). The secret never crosses the wire.
//
// Handshake on every connection (server speaks first), mutual: each side proves it holds the
// secret on a nonce the other chose.
//   server -> {"op":"hello","nonce":N,"version":1}
//   client -> {"op":"auth","role":"daemon"|"client"|"peer","mac":HMAC(secret,N),"nonce":C}
//   server -> {"op":"welcome","proof":HMAC(secret,"copse-server/"+C+"/"+N)}
//             or {"op":"error","message":…} and closes
// Without the proof a daemon would run whatever tasks anything listening where it connects
// sends it (the job manager's local socket is a name in the abstract namespace, which any
// local user can bind first), and a reader would take any bytes as a peer's output. A client
// answers only hellos whose nonce NewNonce could have made, so a server cannot have it MAC a
// string of the server's choosing, such as the proof another client expects. What this does
// not stop is a man in the middle relaying both handshakes: the traffic after them is neither
// encrypted nor MACed (that takes TLS or CurveZMQ). On one host, where relaying costs a local
// squatter nothing, clients also check who holds a local socket (common/local_peer.h).
#include <filesystem>
#include <string>
#include <string_view>

#include "common/json_util.h"
#include "common/status.h"

namespace copse::auth {

constexpr const char* kSecretFileName = "secret";

/// Reads `dir`/secret, creating it (0600, 32 random bytes hex) when absent.
Result<std::string> LoadOrCreateSecret(const std::filesystem::path& dir);
/// Reads a secret file; PermissionDenied when it is readable by others than its owner.
Result<std::string> ReadSecret(const std::filesystem::path& file);
/// 16 random bytes, hex.
std::string NewNonce();
/// HMAC-SHA256(secret, nonce), hex.
std::string Mac(std::string_view secret, std::string_view nonce);
/// Compares in time independent of where the strings differ.
bool ConstantTimeEquals(std::string_view a, std::string_view b);

/// A client's answer to a server's hello, and what it needs to check the welcome.
struct HelloAnswer {
  Json message;              // the "auth" message to send
  std::string server_nonce;  // the hello's
  std::string client_nonce;  // ours, which the server's proof must cover
};
/// The client's side, step 1. InvalidArgument when `hello` is no hello with a nonce NewNonce
/// could have made.
Result<HelloAnswer> AnswerHello(const Json& hello, std::string_view secret, std::string_view role);
/// The client's side, step 2: OK only for a welcome carrying the right proof; PermissionDenied,
/// naming what was wrong, otherwise (an "error" reply's message included).
Status CheckWelcome(const Json& welcome, std::string_view secret, const HelloAnswer& answer);
/// The server's side, once `auth`'s MAC checked out: the welcome, with the proof over the
/// client's nonce when it sent one (clients of builds before mutual authentication send none).
Json Welcome(const Json& auth, std::string_view secret, std::string_view server_nonce);

}  // namespace copse::auth
