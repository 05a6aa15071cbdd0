#pragma once
// A job manager and named daemons as `copse` processes on 127.0.0.1 for the soak and recovery
// benchmarks, with a supervisor that plays systemd's Restart=always: a thread notices a dead
// daemon pid (waitpid WNOHANG) and starts a new `copse daemon` with the same name, work dir and
// labels (the job manager accepts it once the old one is marked lost; a daemon refused because
// the loss was not yet processed exits and is started again). Every process is stopped by its
// pid on destruction. Used by bench/soak_bench.cc and bench/recovery_bench.cc.
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "cli/jm_client.h"
#include "cli/process_util.h"
#include "common/json_util.h"

extern char** environ;

namespace copse::soak {

using Clock = std::chrono::steady_clock;

/// Thrown on a setup or bench failure; main catches it, so every cluster's destructor stops
/// its processes on the way out.
struct Failure : std::runtime_error {
  using std::runtime_error::runtime_error;
};
[[noreturn]] inline void Die(const std::string& why) { throw Failure(why); }

/// Starts `copse args…` (cli::SpawnProcess: safe from the supervisor thread), stdout and
/// stderr appended to `log`; it dies with this process.
inline pid_t SpawnCopse(std::vector<std::string> args, const std::string& log, const std::string& token_file = "") {
  std::map<std::string, std::string> env = {{"COPSE_DIE_WITH_PARENT", "1"}};
  if (!token_file.empty()) env["COPSE_TOKEN_FILE"] = token_file;
  auto pid = cli::SpawnProcess(std::string(COPSE_BINARY_DIR) + "/cli/copse", args, env, log);
  if (!pid.ok()) Die(pid.status().ToString());
  return *pid;
}

struct DaemonConfig {
  std::string name;
  int cpus = 2;
  std::vector<std::string> labels;  // "host=h0", …
};

class SupervisedCluster {
 public:
  SupervisedCluster(std::vector<DaemonConfig> daemons, std::vector<std::string> jm_args = {}, bool respawn = true)
      : respawn_(respawn) {
    char tmpl[] = "/tmp/copse-soak-XXXXXX";
    if (!mkdtemp(tmpl)) Die("mkdtemp failed");
    dir_ = tmpl;
    state_ = dir_ / "jm";
    std::vector<std::string> args = {"jm", "--listen", "127.0.0.1:0", "--state-dir", state_.string()};
    args.insert(args.end(), jm_args.begin(), jm_args.end());
    jm_pid_ = SpawnCopse(args, (dir_ / "jm.log").string());
    auto deadline = Clock::now() + std::chrono::seconds(30);
    while (!std::filesystem::exists(state_ / "jm.addr")) {
      if (Clock::now() > deadline) Die("the job manager did not start; see " + (dir_ / "jm.log").string());
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    std::string addr = ReadFile((state_ / "jm.addr").string()).value();
    address_.jm = addr.substr(0, addr.find('\n'));
    address_.state_dir = state_.string();
    for (auto& d : daemons) {
      Slot s;
      s.config = d;
      slots_.push_back(std::move(s));
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (auto& s : slots_) Start(s);
    }
    supervisor_ = std::thread([this] { Supervise(); });
    WaitForAlive(slots_.size());
  }

  ~SupervisedCluster() {
    stop_ = true;
    supervisor_.join();
    for (auto& s : slots_) {
      if (s.pid > 0) kill(s.pid, SIGKILL);
    }
    kill(jm_pid_, SIGKILL);
    for (auto& s : slots_) {
      if (s.pid > 0) waitpid(s.pid, nullptr, 0);
    }
    waitpid(jm_pid_, nullptr, 0);
    if (!keep_ && std::uncaught_exceptions() == 0) {
      std::error_code ec;
      std::filesystem::remove_all(dir_, ec);
    } else {
      std::fprintf(stderr, "kept the cluster's logs and state under %s\n", dir_.c_str());
    }
  }

  net::BlockingClient& client() {
    if (!client_) {
      auto c = cli::ConnectToJm(address_);
      if (!c.ok()) Die("connect: " + c.status().ToString());
      client_ = std::move(*c);
    }
    return *client_;
  }

  /// Waits (bounded) until at least n daemons are registered and alive; false on timeout.
  bool WaitForAlive(size_t n, std::chrono::seconds limit = std::chrono::seconds(30)) {
    auto deadline = Clock::now() + limit;
    while (AliveDaemons() < n) {
      if (Clock::now() > deadline) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return true;
  }

  size_t AliveDaemons() {
    auto reply = client().Call({{"op", "daemons"}});
    if (!reply.ok()) Die("daemons: " + reply.status().ToString());
    size_t alive = 0;
    for (const auto& d : (*reply)["daemons"]) alive += d["alive"].get<bool>();
    return alive;
  }

  /// SIGKILLs the daemon named `name` by its pid; returns when the kill was sent.
  void KillDaemon(const std::string& name) {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& s : slots_) {
      if (s.config.name == name && s.pid > 0) kill(s.pid, SIGKILL);
    }
  }

  /// Starts again a daemon that KillDaemon (or a fault) SIGKILLed, in a cluster without
  /// supervision: reaps it if the supervisor has not yet, then starts it.
  void RestartDaemon(const std::string& name) {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& s : slots_) {
      if (s.config.name != name) continue;
      if (s.pid > 0) {
        waitpid(s.pid, nullptr, 0);
        ++deaths_;
        s.pid = 0;
      }
      Start(s);
    }
  }

  /// How many daemon processes died (killed or exited) and were started again.
  int deaths() const { return deaths_.load(); }
  int respawns() const { return respawns_.load(); }
  void set_keep(bool keep) { keep_ = keep; }
  const std::filesystem::path& dir() const { return dir_; }
  const std::filesystem::path& state_dir() const { return state_; }
  pid_t jm_pid() const { return jm_pid_; }
  const cli::JmAddressOptions& client_address() const { return address_; }
  std::string secret() const { return ReadFile((state_ / "secret").string()).value().substr(0, 64); }

 private:
  struct Slot {
    DaemonConfig config;
    pid_t pid = 0;
    Clock::time_point started{};
    Clock::time_point died{};
  };

  void Start(Slot& s) {
    std::vector<std::string> args = {"daemon",
                                     "--jm",
                                     address_.jm,
                                     "--name",
                                     s.config.name,
                                     "--cpus",
                                     std::to_string(s.config.cpus),
                                     "--work-dir",
                                     (dir_ / s.config.name).string()};
    for (const auto& l : s.config.labels) {
      args.push_back("--label");
      args.push_back(l);
    }
    s.pid = SpawnCopse(args, (dir_ / (s.config.name + ".log")).string(), (state_ / "secret").string());
    s.started = Clock::now();
  }

  void Supervise() {
    while (!stop_) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        auto now = Clock::now();
        for (auto& s : slots_) {
          if (s.pid > 0) {
            int status = 0;
            if (waitpid(s.pid, &status, WNOHANG) == s.pid) {
              ++deaths_;
              s.pid = 0;
              s.died = now;
            }
          }
          // A daemon that died right after starting was most likely refused (its old self not
          // yet marked lost): back off a little before the next try.
          if (s.pid == 0 && respawn_ && !stop_) {
            bool quick_death = s.died - s.started < std::chrono::milliseconds(500);
            if (!quick_death || now - s.died > std::chrono::milliseconds(100)) {
              try {
                Start(s);
                ++respawns_;
              } catch (const Failure& e) {
                std::fprintf(stderr, "supervisor: %s\n", e.what());
              }
            }
          }
        }
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
  }

  std::filesystem::path dir_, state_;
  pid_t jm_pid_ = 0;
  cli::JmAddressOptions address_;
  std::unique_ptr<net::BlockingClient> client_;
  std::vector<Slot> slots_;
  std::mutex mu_;
  std::thread supervisor_;
  std::atomic<bool> stop_{false};
  std::atomic<int> deaths_{0}, respawns_{0};
  bool respawn_ = true;
  bool keep_ = false;
};

}  // namespace copse::soak
