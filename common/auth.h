#pragma once
// Shared-secret authentication. The job manager creates a random secret at first start (a
// 0600 file in its state directory); daemons and clients prove they hold it by answering a
// challenge with HMAC-SHA256(secret, nonce). The secret never crosses the wire.
//
// Handshake on every connection (server speaks first):
//   server -> {"op":"hello","nonce":N,"version":1}
//   client -> {"op":"auth","role":"daemon"|"client"|"peer","mac":HMAC(secret,N)}
//   server -> {"op":"welcome"} or {"op":"error","message":…} and closes
#include <filesystem>
#include <string>
#include <string_view>

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

}  // namespace copse::auth
