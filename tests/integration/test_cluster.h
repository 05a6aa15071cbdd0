#pragma once
// A job manager and daemons started as separate `copse` processes on 127.0.0.1, for
// integration tests. Every process is stopped by its pid when the cluster is destroyed.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include <doctest/doctest.h>

#include "cli/jm_client.h"
#include "cli/process_util.h"
#include "common/json_util.h"

namespace copse::testing {

/// COPSE_TEST_TLS=1 (ctest's integration.tls): the job manager runs with --tls, daemons reach it
/// and one another over TCP only (so that every connection is TLS) with the cluster's TLS
/// directory, and clients find that directory in the state directory.
inline bool TlsMode() {
  const char* v = std::getenv("COPSE_TEST_TLS");
  return v && std::string(v) == "1";
}

inline std::string CopseBinary() { return std::string(COPSE_BINARY_DIR) + "/cli/copse"; }

inline pid_t Spawn(std::vector<std::string> args, const std::string& log, const std::string& token_file = "") {
  std::map<std::string, std::string> env = {{"COPSE_DIE_WITH_PARENT", "1"}};
  if (!token_file.empty()) env["COPSE_TOKEN_FILE"] = token_file;
  auto pid = cli::SpawnProcess(CopseBinary(), args, env, log);
  REQUIRE_MESSAGE(pid.ok(), pid.status().ToString());
  return *pid;
}

class TestCluster {
 public:
  explicit TestCluster(int daemons, int cpus = 2, int heartbeat_timeout_ms = 1000, std::vector<std::string> jm_args = {}) {
    char tmpl[] = "/tmp/copse-itest-XXXXXX";
    REQUIRE(mkdtemp(tmpl) != nullptr);
    dir_ = tmpl;
    state_ = dir_ / "jm";
    std::vector<std::string> args = {"jm",
                                     "--listen",
                                     "127.0.0.1:0",
                                     "--state-dir",
                                     state_.string(),
                                     "--heartbeat-timeout-ms",
                                     std::to_string(heartbeat_timeout_ms)};
    args.insert(args.end(), jm_args.begin(), jm_args.end());
    if (TlsMode()) args.push_back("--tls");
    jm_pid_ = Spawn(args, (dir_ / "jm.log").string());
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (!std::filesystem::exists(state_ / "jm.addr")) {
      REQUIRE(std::chrono::steady_clock::now() < deadline);
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    std::string addr = ReadFile((state_ / "jm.addr").string()).value();
    address_.jm = addr.substr(0, addr.find('\n'));
    address_.state_dir = state_.string();
    for (int i = 0; i < daemons; ++i) AddDaemon("d" + std::to_string(i), cpus);
    WaitForDaemons(daemons);
  }

  ~TestCluster() {
    for (pid_t p : pids()) kill(p, SIGKILL);
    for (pid_t p : pids()) waitpid(p, nullptr, 0);
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }

  /// SIGKILLs the job manager (the daemons keep running and try to reconnect).
  void KillJm() {
    kill(jm_pid_, SIGKILL);
    waitpid(jm_pid_, nullptr, 0);
    client_.reset();
  }

  /// Starts a job manager again on the same state directory and, unless `listen` says
  /// otherwise, the same port; clients then use the address it wrote to jm.addr.
  void RestartJm(std::vector<std::string> extra = {}, std::string listen = "") {
    std::filesystem::remove(state_ / "jm.addr");
    std::vector<std::string> args = {"jm", "--listen", listen.empty() ? address_.jm : listen, "--state-dir", state_.string()};
    args.insert(args.end(), extra.begin(), extra.end());
    jm_pid_ = Spawn(args, (dir_ / "jm.log").string());
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (!std::filesystem::exists(state_ / "jm.addr")) {
      REQUIRE(std::chrono::steady_clock::now() < deadline);
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    std::string addr = ReadFile((state_ / "jm.addr").string()).value();
    address_.jm = addr.substr(0, addr.find('\n'));
    client_.reset();
  }

  void AddDaemon(const std::string& name, int cpus, std::vector<std::string> extra = {}) {
    std::vector<std::string> args = {
        "daemon", "--jm", address_.jm, "--name", name, "--cpus", std::to_string(cpus), "--work-dir", (dir_ / name).string()};
    args.insert(args.end(), extra.begin(), extra.end());
    if (TlsMode()) args.insert(args.end(), {"--tls-dir", (state_ / "tls").string(), "--no-local-socket"});
    daemon_pids_.push_back(Spawn(args, (dir_ / (name + ".log")).string(), (state_ / "secret").string()));
  }

  /// Starts a daemon told only the job manager's state directory: it finds the address (jm.addr)
  /// and the secret there.
  void AddDaemonFromStateDir(const std::string& name, int cpus) {
    std::vector<std::string> args = {
        "daemon",     "--state-dir",         state_.string(), "--name", name, "--cpus", std::to_string(cpus),
        "--work-dir", (dir_ / name).string()};
    if (TlsMode()) args.push_back("--no-local-socket");  // the TLS directory it finds in the state dir
    daemon_pids_.push_back(Spawn(args, (dir_ / (name + ".log")).string()));
  }

  void WaitForDaemons(size_t n) {
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (true) {
      auto reply = client().Call({{"op", "daemons"}});
      REQUIRE(reply.ok());
      size_t alive = 0;
      for (const auto& d : (*reply)["daemons"]) alive += d["alive"].get<bool>();
      if (alive >= n) return;
      REQUIRE(std::chrono::steady_clock::now() < deadline);
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }

  net::BlockingClient& client() {
    if (!client_) {
      auto c = cli::ConnectToJm(address_);
      REQUIRE_MESSAGE(c.ok(), c.status().ToString());
      client_ = std::move(*c);
    }
    return *client_;
  }

  /// The TLS context clients of this cluster use (null without TLS).
  std::shared_ptr<const tls::Context> tls() const {
    auto loaded = cli::LoadClientTls(address_);
    REQUIRE_MESSAGE(loaded.ok(), loaded.status().ToString());
    return *loaded;
  }

  /// A new connection to the job manager over TCP, authenticated with `secret` as `role`.
  Result<std::unique_ptr<net::BlockingClient>> Connect(const std::string& secret, const std::string& role) const {
    return net::BlockingClient::Connect("127.0.0.1", jm_port(), secret, role, std::chrono::seconds(10), tls().get());
  }

  /// Writes `job` to a file in `dir` (for relative paths) and submits it; returns the job id.
  uint64_t Submit(const Json& job, const std::filesystem::path& job_dir) {
    auto reply = client().Call({{"op", "submit"}, {"job", job}, {"job_dir", job_dir.string()}});
    REQUIRE_MESSAGE(reply.ok(), reply.status().ToString());
    return (*reply)["job"].get<uint64_t>();
  }
  uint64_t Submit(const Json& job) { return Submit(job, dir_); }

  /// Polls until the job leaves "running" (bounded); returns its final status.
  Json Wait(uint64_t job, std::chrono::seconds limit = std::chrono::seconds(120)) {
    auto deadline = std::chrono::steady_clock::now() + limit;
    while (true) {
      auto reply = client().Call({{"op", "status"}, {"job", job}});
      REQUIRE(reply.ok());
      if ((*reply)["job"]["state"] != "running") return (*reply)["job"];
      REQUIRE_MESSAGE(std::chrono::steady_clock::now() < deadline, (*reply)["job"].dump());
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }

  /// The bytes of one declared output of a completed job.
  std::string Output(uint64_t job, const std::string& path);

  std::vector<pid_t> pids() const {
    std::vector<pid_t> all = daemon_pids_;
    all.push_back(jm_pid_);
    return all;
  }
  const std::filesystem::path& dir() const { return dir_; }
  const cli::JmAddressOptions& address() const { return address_; }
  std::string secret() const { return ReadFile((state_ / "secret").string()).value().substr(0, 64); }
  uint16_t jm_port() const { return static_cast<uint16_t>(std::stoi(address_.jm.substr(address_.jm.rfind(':') + 1))); }

 private:
  std::filesystem::path dir_, state_;
  pid_t jm_pid_ = 0;
  std::vector<pid_t> daemon_pids_;
  cli::JmAddressOptions address_;
  std::unique_ptr<net::BlockingClient> client_;
};

}  // namespace copse::testing
