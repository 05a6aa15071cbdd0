#pragma once
// How client verbs find and talk to the job manager: address from --jm, $COPSE_JM or the
// state directory's jm.addr; secret from $COPSE_TOKEN_FILE or the state directory's secret; TLS
// (common/tls.h) from --tls-dir, $COPSE_TLS_DIR or the state directory's tls/ folder.
// (An embedded cluster names its own secret file, which the user's environment cannot override.)
#include <filesystem>
#include <memory>
#include <string>

#include <CLI/CLI.hpp>

#include "common/framed_connection.h"

namespace copse::cli {

struct JmAddressOptions {
  std::string jm;         // HOST:PORT
  std::string state_dir;  // the job manager's state directory
  /// The secret file to present, before $COPSE_TOKEN_FILE (--token-file; an embedded cluster's own).
  std::string secret_file;
  /// The cluster's TLS directory (--tls-dir), before $COPSE_TLS_DIR and STATE_DIR/tls.
  std::string tls_dir;
};

/// Default state directory of `copse jm`: $COPSE_STATE_DIR or ~/.local/state/copse/jm.
std::filesystem::path DefaultStateDir();
/// Adds --jm, --state-dir, --token-file and --tls-dir to a client subcommand.
void AddJmAddressFlags(CLI::App* cmd, JmAddressOptions& opts);
/// Where the job manager's address was found, and what it says.
struct JmAddressSource {
  std::string address;          // HOST:PORT as written there
  std::string source;           // "--jm", "COPSE_JM", or the jm.addr file's path
  bool from_state_dir = false;  // the job manager rewrites it when it starts again
};
/// The job manager's address: --jm, else $COPSE_JM, else the state directory's jm.addr;
/// NotFound when none is there.
Result<JmAddressSource> FindJmAddress(const JmAddressOptions& opts);
/// FindJmAddress, parsed; a malformed address is an error that names its source.
Result<std::pair<std::string, uint16_t>> JmEndpoint(const JmAddressOptions& opts);
/// Connects and authenticates as a client.
Result<std::unique_ptr<net::BlockingClient>> ConnectToJm(const JmAddressOptions& opts);
/// The secret a client or daemon presents.
Result<std::string> LoadClientSecret(const JmAddressOptions& opts);
/// The TLS context a client or daemon connects with: --tls-dir, else $COPSE_TLS_DIR, else the
/// state directory's tls/ when it holds a certificate; null (plaintext) when none is given.
Result<std::shared_ptr<const tls::Context>> LoadClientTls(const JmAddressOptions& opts);

}  // namespace copse::cli
