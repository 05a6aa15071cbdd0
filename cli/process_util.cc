#include "cli/process_util.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <thread>

#include "common/thread_name.h"

namespace copse::cli {

namespace {

/// Written to (one byte) by the handler of SIGINT and SIGTERM; read by the signal thread.
int g_stop_pipe[2] = {-1, -1};

extern "C" void OnStopSignal(int) {
  const int saved = errno;
  const char byte = 1;
  [[maybe_unused]] const ssize_t n = ::write(g_stop_pipe[1], &byte, 1);  // async-signal-safe
  errno = saved;
}

}  // namespace

void StopOnSignals(std::function<void()> stop) {
  // A handler, not only sigwait on a blocked set: threads that libraries start before main (the
  // BLAS pool) have every signal unblocked, and the kernel hands a process-directed SIGTERM to
  // any thread that does not block it, where its default action ended the process at once: no
  // orderly stop, and a job manager lost the history of jobs that had just finished. With a
  // handler installed, whichever thread takes the signal only wakes the signal thread.
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  // Still blocked here and in the threads started after this: their system calls are not
  // interrupted by it.
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  if (g_stop_pipe[0] < 0 && ::pipe2(g_stop_pipe, O_CLOEXEC) != 0) {
    g_stop_pipe[0] = g_stop_pipe[1] = -1;
  }
  if (g_stop_pipe[0] >= 0) {
    struct sigaction sa {};
    sa.sa_handler = OnStopSignal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    sigaction(SIGINT, &sa, nullptr);
    sigaction(SIGTERM, &sa, nullptr);
  }
  std::thread([set, stop = std::move(stop)] {
    SetThreadName("copse-signals");
    if (g_stop_pipe[0] >= 0) {
      pthread_sigmask(SIG_UNBLOCK, &set, nullptr);  // this thread may take them too
      char byte;
      while (::read(g_stop_pipe[0], &byte, 1) < 0 && errno == EINTR) {
      }
    } else {  // no pipe: the signals as a blocked set, as well as that can go
      int sig = 0;
      sigwait(&set, &sig);
    }
    stop();
  }).detach();
}

Result<pid_t> SpawnProcess(const std::string& exe, const std::vector<std::string>& args,
                           const std::map<std::string, std::string>& env, const std::string& log_file) {
  std::vector<std::string> argv_s = {exe};
  argv_s.insert(argv_s.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& a : argv_s) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::vector<std::string> env_s;
  for (char** e = environ; *e; ++e) {
    std::string kv = *e;
    if (!env.count(kv.substr(0, kv.find('=')))) env_s.push_back(kv);
  }
  for (const auto& [k, v] : env) env_s.push_back(k + "=" + v);
  std::vector<char*> envp;
  for (auto& e : env_s) envp.push_back(e.data());
  envp.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&fa, 1, log_file.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
  posix_spawn_file_actions_adddup2(&fa, 1, 2);
  // The child starts with no signals blocked, whatever this thread has blocked.
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  sigset_t none;
  sigemptyset(&none);
  posix_spawnattr_setsigmask(&attr, &none);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK);
  pid_t pid = 0;
  int rc = posix_spawn(&pid, exe.c_str(), &fa, &attr, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&fa);
  posix_spawnattr_destroy(&attr);
  if (rc != 0) return Status::Internal("cannot start " + exe + ": " + std::strerror(rc));
  return pid;
}

Result<pid_t> SpawnSelf(const std::vector<std::string>& args, std::map<std::string, std::string> env,
                        const std::string& log_file) {
  char exe[4096];
  ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
  if (n <= 0) return Status::Internal("cannot find the copse binary (/proc/self/exe)");
  exe[n] = '\0';
  env["COPSE_DIE_WITH_PARENT"] = "1";  // never outlive `copse run`
  return SpawnProcess(exe, args, env, log_file);
}

bool ChildExited(pid_t pid) {
  int status = 0;
  return waitpid(pid, &status, WNOHANG) == pid;
}

void StopChildren(const std::vector<pid_t>& pids, int grace_ms) {
  for (pid_t p : pids) kill(p, SIGTERM);
  auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(grace_ms);
  std::vector<pid_t> left = pids;
  while (!left.empty() && std::chrono::steady_clock::now() < deadline) {
    std::erase_if(left, [](pid_t p) { return ChildExited(p) || kill(p, 0) != 0; });
    if (!left.empty()) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  for (pid_t p : left) {
    kill(p, SIGKILL);
    waitpid(p, nullptr, 0);
  }
}

}  // namespace copse::cli
