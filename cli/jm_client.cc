#include "cli/jm_client.h"

#include <cstdlib>

#include "common/auth.h"
#include "common/json_util.h"

namespace copse::cli {

std::filesystem::path DefaultStateDir() {
  if (const char* env = std::getenv("COPSE_STATE_DIR")) return env;
  const char* home = std::getenv("HOME");
  return std::filesystem::path(home ? home : "/tmp") / ".local/state/copse/jm";
}

void AddJmAddressFlags(CLI::App* cmd, JmAddressOptions& opts) {
  cmd->add_option("--jm", opts.jm, "job manager HOST:PORT (default: $COPSE_JM, else the state directory's jm.addr)")
      ->check([](const std::string& value) {      // a malformed flag is a usage error (exit 2)
        if (value.empty()) return std::string();  // as if not given: $COPSE_JM, else jm.addr
        auto parsed = net::ParseHostPort(value, "--jm");
        if (parsed.ok()) return std::string();
        const std::string& why = parsed.status().message();
        return why.rfind("--jm: ", 0) == 0 ? why.substr(6) : why;  // CLI11 names the option itself
      });
  cmd->add_option("--state-dir", opts.state_dir,
                  "the job manager's state directory (default: $COPSE_STATE_DIR or ~/.local/state/copse/jm)");
  cmd->add_option("--token-file", opts.secret_file,
                  "the cluster's secret file (default: $COPSE_TOKEN_FILE, else the state directory's secret)");
  cmd->add_option("--tls-dir", opts.tls_dir,
                  "the cluster's TLS directory: cluster.crt, cluster.key[, ca.crt] (default: $COPSE_TLS_DIR, else the "
                  "state directory's tls/ when the job manager runs TLS)");
}

Result<std::shared_ptr<const tls::Context>> LoadClientTls(const JmAddressOptions& opts) {
  if (!opts.tls_dir.empty()) return tls::Context::Load(opts.tls_dir);
  if (const char* env = std::getenv("COPSE_TLS_DIR"); env && *env) {
    auto loaded = tls::Context::Load(env);
    if (!loaded.ok()) return loaded.status().WithContext("COPSE_TLS_DIR");
    return loaded;
  }
  const auto dir = (opts.state_dir.empty() ? DefaultStateDir() : std::filesystem::path(opts.state_dir)) / tls::kStateSubdir;
  if (!tls::HasCertificate(dir)) return std::shared_ptr<const tls::Context>();
  return tls::Context::Load(dir);
}

Result<std::string> LoadClientSecret(const JmAddressOptions& opts) {
  if (!opts.secret_file.empty()) return auth::ReadSecret(opts.secret_file);
  if (const char* file = std::getenv("COPSE_TOKEN_FILE")) return auth::ReadSecret(file);
  auto dir = opts.state_dir.empty() ? DefaultStateDir() : std::filesystem::path(opts.state_dir);
  auto secret = auth::ReadSecret(dir / auth::kSecretFileName);
  if (!secret.ok())
    return secret.status().WithContext("pass --token-file, or set COPSE_TOKEN_FILE or --state-dir to the job manager's");
  return secret;
}

Result<JmAddressSource> FindJmAddress(const JmAddressOptions& opts) {
  if (!opts.jm.empty()) return JmAddressSource{opts.jm, "--jm"};
  if (const char* env = std::getenv("COPSE_JM"); env && *env) return JmAddressSource{env, "COPSE_JM"};
  auto dir = opts.state_dir.empty() ? DefaultStateDir() : std::filesystem::path(opts.state_dir);
  auto file = dir / "jm.addr";
  auto text = ReadFile(file.string());
  if (!text.ok())
    return Status::NotFound("no job manager address: pass --jm HOST:PORT, set COPSE_JM, or start `copse jm` with --state-dir " +
                            dir.string());
  std::string address = std::move(*text);
  while (!address.empty() && (address.back() == '\n' || address.back() == ' ')) address.pop_back();
  return JmAddressSource{std::move(address), file.string(), true};
}

Result<std::pair<std::string, uint16_t>> JmEndpoint(const JmAddressOptions& opts) {
  COPSE_ASSIGN_OR_RETURN(auto found, FindJmAddress(opts));
  return net::ParseHostPort(found.address, found.source);
}

Result<std::unique_ptr<net::BlockingClient>> ConnectToJm(const JmAddressOptions& opts) {
  COPSE_ASSIGN_OR_RETURN(auto hp, JmEndpoint(opts));
  COPSE_ASSIGN_OR_RETURN(std::string secret, LoadClientSecret(opts));
  COPSE_ASSIGN_OR_RETURN(auto tls, LoadClientTls(opts));
  return net::BlockingClient::Connect(hp.first, hp.second, secret, "client", std::chrono::seconds(10), tls.get());
}

}  // namespace copse::cli
