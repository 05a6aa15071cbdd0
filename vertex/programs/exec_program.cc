// `exec`: runs params.argv as a child process, for user programs in any language.
//
// Contract (docs/job-format.md): every input port k is materialized as the file
// $COPSE_INPUT_k; the child writes output port k to the file $COPSE_OUTPUT_k. With
// "stdout": true (the default when the vertex has outputs) the child's standard output becomes
// output 0 instead of the file. With "stdin": true input 0 is fed to its standard input.
// "{input0}", "{output1}", "{scratch}" … in argv are replaced by those paths. A non-zero exit
// status fails the attempt with the tail of standard error. Cancellation kills the child's
// process group. Where the kernel allows it the child runs in a PID namespace of its own
// (StartChild), so it cannot signal its daemon.
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/statvfs.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <algorithm>
#include <atomic>
#include <memory>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <thread>

#include "common/text_util.h"
#include "vertex/attempt_log.h"
#include "vertex/program_registry.h"

namespace copse::vertex {
namespace {

constexpr size_t kChunk = 1 << 20;

Status WriteInputFile(VertexContext& ctx, size_t port, const std::filesystem::path& path) {
  std::ofstream out(path, std::ios::binary);
  if (!out) return Status::IOError("cannot create " + path.string());
  while (true) {
    COPSE_ASSIGN_OR_RETURN(auto msg, ctx.input(port).Next());
    if (!msg) break;
    out.write(msg->data(), static_cast<std::streamsize>(msg->size()));
  }
  out.close();
  if (!out) return Status::IOError("error writing " + path.string());
  return Status::OK();
}

Status StreamFileToOutput(const std::filesystem::path& path, chan::ChannelWriter& out) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::OK();  // the child wrote nothing to this port
  std::string buf(kChunk, '\0');
  while (in) {
    in.read(buf.data(), static_cast<std::streamsize>(buf.size()));
    std::streamsize n = in.gcount();
    if (n > 0) COPSE_RETURN_NOT_OK(out.Write(chan::Buffer(buf.substr(0, static_cast<size_t>(n)))));
  }
  return Status::OK();
}

/// `fd` moved to 3 or above: a daemon started with 0, 1 or 2 closed gets those numbers from
/// open() or pipe(), and the child's dup2 onto the standard descriptors would overwrite them
/// (or, onto the same number, leave them close-on-exec).
int AboveStandard(int fd) {
  if (fd < 0 || fd > 2) return fd;
  const int moved = ::fcntl(fd, F_DUPFD_CLOEXEC, 3);
  const int saved = errno;
  ::close(fd);
  errno = saved;
  return moved;
}

/// The child's standard input, output and error, opened by the parent. Standard error, and
/// standard output when it is not output 0, are pipes the parent drains into the attempt's log
/// as the child writes (ChildStreams).
struct ChildFiles {
  int in = -1, out = -1, err = -1;
  int out_read = -1, err_read = -1;  // the parent's ends of the pipes (-1: a file)
  ~ChildFiles() {
    Close();
    for (int* fd : {&out_read, &err_read}) {
      if (*fd >= 0) ::close(*fd);
    }
  }
  /// `out_path` empty: standard output is a pipe too.
  Status Open(const std::filesystem::path& in_path, const std::filesystem::path& out_path) {
    in = AboveStandard(::open(in_path.c_str(), O_RDONLY | O_CLOEXEC));
    if (in < 0) return Status::IOError("cannot open " + in_path.string() + ": " + std::strerror(errno));
    if (!out_path.empty()) {
      out = AboveStandard(::open(out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600));
      if (out < 0) return Status::IOError("cannot create " + out_path.string() + ": " + std::strerror(errno));
    } else {
      COPSE_RETURN_NOT_OK(Pipe(out_read, out));
    }
    return Pipe(err_read, err);
  }
  void Close() {
    for (int* fd : {&in, &out, &err}) {
      if (*fd >= 0) ::close(*fd);
      *fd = -1;
    }
  }

 private:
  static Status Pipe(int& read_end, int& write_end) {
    int fds[2];
    if (::pipe2(fds, O_CLOEXEC) != 0) return Status::IOError(std::string("cannot make a pipe: ") + std::strerror(errno));
    read_end = AboveStandard(fds[0]);
    write_end = AboveStandard(fds[1]);
    if (read_end < 0 || write_end < 0) return Status::IOError(std::string("cannot make a pipe: ") + std::strerror(errno));
    ::fcntl(read_end, F_SETFL, O_NONBLOCK);
    return Status::OK();
  }
};

/// Drains the child's standard error (and output, when piped) into its attempt's log, keeping
/// the newest bytes of standard error for the failure message.
class ChildStreams {
 public:
  static constexpr size_t kStderrTail = 2000;
  ChildStreams(const ChildFiles& files, AttemptLog* log) : log_(log) {
    if (files.err_read >= 0) streams_.push_back({files.err_read, "stderr", false});
    if (files.out_read >= 0) streams_.push_back({files.out_read, "stdout", false});
  }
  /// Waits up to `wait` for output, and takes what is there now. Never waits for an end: a
  /// background process the child left may hold the pipes open. A stream the child closed is
  /// dropped (poll would report its hang-up at once, for ever); with none left it just waits.
  void Drain(std::chrono::milliseconds wait) {
    std::erase_if(streams_, [](const Stream& s) { return s.closed; });
    if (streams_.empty()) {
      std::this_thread::sleep_for(wait);
      return;
    }
    pollfd fds[2];
    for (size_t i = 0; i < streams_.size(); ++i) fds[i] = {streams_[i].fd, POLLIN, 0};
    if (::poll(fds, static_cast<nfds_t>(streams_.size()), static_cast<int>(wait.count())) <= 0) return;
    for (auto& s : streams_) {
      char buf[16384];
      for (int reads = 0; reads < 64; ++reads) {
        const ssize_t n = ::read(s.fd, buf, sizeof buf);
        if (n == 0) s.closed = true;
        if (n <= 0) break;
        const std::string_view text(buf, static_cast<size_t>(n));
        if (log_) log_->Append(s.name, text);
        if (std::string_view(s.name) == "stderr") {
          stderr_tail_.append(text);
          if (stderr_tail_.size() > 2 * kStderrTail) stderr_tail_.erase(0, stderr_tail_.size() - kStderrTail);
        }
      }
    }
  }
  std::string StderrTail() const {
    return stderr_tail_.size() > kStderrTail ? "…" + stderr_tail_.substr(stderr_tail_.size() - kStderrTail) : stderr_tail_;
  }

 private:
  struct Stream {
    int fd;
    const char* name;
    bool closed = false;  // the child closed its end (the fd itself is ChildFiles')
  };
  AttemptLog* log_;
  std::vector<Stream> streams_;
  std::string stderr_tail_;
};

/// What the child does between its start and exec; read-only, prepared by the parent.
struct ChildSetup {
  int in, out, err;
  rlim_t memory_limit;  // 0: none
  const char* cwd;
  char* const* argv;
  char* const* envp;
  int status_fd = -1;  // in a PID namespace: where its init writes the program's wait status
};

/// Makes the child's standard descriptors the prepared files.
void UseStandardFiles(const ChildSetup& c) {
  dup2(c.in, 0);
  dup2(c.out, 1);
  dup2(c.err, 2);
}

/// Sets the child up and execs the program: only async-signal-safe calls. Its standard
/// descriptors are in place already (UseStandardFiles).
[[noreturn]] void SetUpAndExec(const ChildSetup& c) {
  // The daemon's worker threads block SIGINT and SIGTERM (its signal thread stops it), and a
  // blocked mask survives exec: the program gets the defaults.
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, nullptr);
  // An ignored SIGPIPE survives exec too, and the daemon ignores it (its HTTP server does):
  // a program writing into a closed pipe ends as it would from a shell.
  signal(SIGPIPE, SIG_DFL);
  if (c.memory_limit > 0) {
    const rlimit limit{c.memory_limit, c.memory_limit};
    if (setrlimit(RLIMIT_AS, &limit) != 0) _exit(126);
  }
  if (chdir(c.cwd) != 0) _exit(126);
  execvpe(c.argv[0], c.argv, c.envp);
  // Why, in the words of strerror (which is not async-signal-safe, so not called here).
  const int err = errno;
  const char* why = err == ENOENT    ? "no such file (a name without '/' is looked up on PATH; ./NAME is one in the "
                                       "job directory), or its #! interpreter is missing"
                    : err == EACCES  ? "permission denied (not executable?)"
                    : err == ENOEXEC ? "not an executable format"
                    : err == ENOTDIR ? "a component of the path is not a directory"
                                     : "exec failed";
  const char head[] = "exec failed: cannot run ";
  (void)!write(2, head, sizeof(head) - 1);
  (void)!write(2, c.argv[0], strlen(c.argv[0]));
  (void)!write(2, ": ", 2);
  (void)!write(2, why, strlen(why));
  (void)!write(2, "\n", 1);
  _exit(127);
}

/// Process 1 of the child's PID namespace: runs the program as process 2 (so that it has the
/// ordinary signal semantics process 1 lacks: a script may signal itself), reaps whatever
/// else ends there, and when the program ends passes its wait status to the daemon and exits,
/// which ends everything left in the namespace.
[[noreturn]] void NamespaceInit(const ChildSetup& c) {
  setpgid(0, 0);  // the daemon's cancel kills the group: this process and the program
  // A copy of the daemon's descriptor table, which this process never execs to shed: keep the
  // program's files and the status pipe (as 3), close the rest (the work dir's lock, the
  // daemon's sockets) so that they never outlive the daemon in this process.
  UseStandardFiles(c);
  if (dup2(c.status_fd, 3) != 3) _exit(126);
  ::syscall(SYS_close_range, 4u, ~0u, 0u);
  const int status_fd = 3;
  // The raw system call, not fork(): this process is a copy of a multi-threaded daemon made
  // by clone, and fork()'s atfork handlers would wait on locks (the allocator's) that another
  // thread of the daemon held at that moment, for ever.
  const pid_t program = static_cast<pid_t>(::syscall(SYS_clone, SIGCHLD, nullptr, nullptr, nullptr, nullptr));
  if (program < 0) _exit(126);
  if (program == 0) {
    close(status_fd);
    SetUpAndExec(c);
  }
  while (true) {
    int status = 0;
    const pid_t ended = waitpid(-1, &status, 0);
    if (ended == program) {
      (void)!write(status_fd, &status, sizeof status);
      _exit(0);
    }
    if (ended < 0 && errno != EINTR) _exit(126);
  }
}

/// A started child: its pid, and in a PID namespace the pipe its init reports the program's
/// wait status on (else -1).
struct StartedChild {
  pid_t pid = -1;
  int status_pipe = -1;
};

/// Starts the child in a PID namespace of its own where the kernel allows it (root, or
/// CAP_SYS_ADMIN): it sees neither its daemon nor anything else of this host's processes, so it
/// cannot stop or kill them (`kill -STOP $PPID` froze one daemon after another), and whatever
/// it leaves running ends with it. Elsewhere, an ordinary child in a process group of its own.
StartedChild StartChild(ChildSetup setup) {
  static std::atomic<bool> namespaces_refused{false};
  if (!namespaces_refused.load(std::memory_order_relaxed)) {
    // Non-blocking: the status is in the pipe once the init is reaped, and a killed init wrote
    // none (another thread's init, cloned meanwhile, may hold a copy of the write end).
    int status_pipe[2];
    if (::pipe2(status_pipe, O_CLOEXEC | O_NONBLOCK) != 0) return {};
    status_pipe[1] = AboveStandard(status_pipe[1]);
    if (status_pipe[1] < 0) {
      ::close(status_pipe[0]);
      return {};
    }
    setup.status_fd = status_pipe[1];
    constexpr size_t kStackBytes = 256 << 10;  // the init's own copy of this process's memory
    std::unique_ptr<char[]> stack(new char[kStackBytes]);
    auto entry = [](void* arg) -> int { NamespaceInit(*static_cast<const ChildSetup*>(arg)); };
    const pid_t pid = ::clone(entry, stack.get() + kStackBytes, CLONE_NEWPID | SIGCHLD, &setup);
    const int saved = errno;
    ::close(status_pipe[1]);
    if (pid >= 0) return {pid, status_pipe[0]};
    ::close(status_pipe[0]);
    if (saved != EPERM && saved != EINVAL && saved != ENOSPC && saved != EUSERS) {
      errno = saved;
      return {};
    }
    namespaces_refused = true;
  }
  setup.status_fd = -1;
  const pid_t pid = fork();
  if (pid == 0) {
    setpgid(0, 0);
    UseStandardFiles(setup);
    SetUpAndExec(setup);
  }
  return {pid, -1};
}

/// The program's wait status: its init's word for it in a PID namespace, else `status`.
int ProgramStatus(int status, int status_pipe) {
  if (status_pipe < 0) return status;
  int program = 0;
  const bool told = ::read(status_pipe, &program, sizeof program) == static_cast<ssize_t>(sizeof program);
  ::close(status_pipe);
  return told ? program : status;
}

/// Whether the file system holding `dir` has no room left for an unprivileged writer.
bool DiskFull(const std::filesystem::path& dir) {
  struct statvfs fs {};
  return ::statvfs(dir.c_str(), &fs) == 0 && fs.f_bavail == 0;
}

class ExecProgram final : public VertexProgram {
 public:
  Status CheckParams(const Json& params) const override {
    const Json* argv = params.contains("argv") ? &params["argv"] : nullptr;
    if (!argv || !argv->is_array() || argv->empty() ||
        !std::all_of(argv->begin(), argv->end(), [](const Json& a) { return a.is_string(); })) {
      return Status::InvalidArgument("params.argv (a non-empty array of strings) is required");
    }
    for (const char* flag : {"stdout", "stdin"}) {
      if (params.contains(flag) && !params[flag].is_boolean()) {
        return Status::InvalidArgument(std::string("params.") + flag + " must be true or false");
      }
    }
    if (params.contains("no_retry_exit_codes")) {
      const Json& codes = params["no_retry_exit_codes"];
      if (!codes.is_array() || !std::all_of(codes.begin(), codes.end(), [](const Json& c) {
            return c.is_number_integer() && c.get<int64_t>() >= 1 && c.get<int64_t>() <= 255;
          })) {
        return Status::InvalidArgument("params.no_retry_exit_codes must be an array of exit codes, 1 to 255, got " +
                                       DumpJson(codes));
      }
    }
    return Status::OK();
  }

  /// Whether exit `code` is one the job says repeats on every attempt.
  static bool NoRetry(const Json& params, int code) {
    const auto it = params.find("no_retry_exit_codes");
    return it != params.end() && std::any_of(it->begin(), it->end(), [&](const Json& c) { return c == code; });
  }

  Status Run(VertexContext& ctx) override {
    COPSE_RETURN_NOT_OK(CheckParams(ctx.params ? *ctx.params : Json::object()).WithContext(ctx.name));
    bool use_stdout = ctx.param<bool>("stdout", ctx.num_outputs() > 0);
    bool use_stdin = ctx.param<bool>("stdin", false);
    COPSE_ASSIGN_OR_RETURN(const std::filesystem::path dir, ctx.MakeScratchDir());
    std::vector<std::pair<std::string, std::string>> vars;  // placeholder -> path
    std::vector<std::string> env;
    for (size_t k = 0; k < ctx.num_inputs(); ++k) {
      auto path = dir / ("input-" + std::to_string(k));
      COPSE_RETURN_NOT_OK(WriteInputFile(ctx, k, path));
      vars.emplace_back("{input" + std::to_string(k) + "}", path.string());
      env.push_back("COPSE_INPUT_" + std::to_string(k) + "=" + path.string());
    }
    for (size_t k = 0; k < ctx.num_outputs(); ++k) {
      auto path = dir / ("output-" + std::to_string(k));
      vars.emplace_back("{output" + std::to_string(k) + "}", path.string());
      env.push_back("COPSE_OUTPUT_" + std::to_string(k) + "=" + path.string());
    }
    vars.emplace_back("{scratch}", dir.string());
    env.push_back("COPSE_NUM_INPUTS=" + std::to_string(ctx.num_inputs()));
    env.push_back("COPSE_NUM_OUTPUTS=" + std::to_string(ctx.num_outputs()));
    env.push_back("COPSE_VERTEX=" + ctx.name);
    env.push_back("COPSE_REPLICA=" + std::to_string(ctx.replica));
    env.push_back("COPSE_VERSION=" + std::to_string(ctx.version));

    std::vector<std::string> argv;
    for (const auto& a : (*ctx.params)["argv"]) {
      if (!a.is_string()) return Status::InvalidArgument(ctx.name + ": params.argv must hold only strings");
      std::string s = a.get<std::string>();
      for (const auto& [from, to] : vars) s = ReplaceAll(std::move(s), from, to);
      argv.push_back(std::move(s));
    }
    auto stdout_path = dir / "stdout";
    auto stdin_path = use_stdin && ctx.num_inputs() > 0 ? dir / "input-0" : std::filesystem::path("/dev/null");

    std::vector<char*> cargv;
    for (auto& a : argv) cargv.push_back(a.data());
    cargv.push_back(nullptr);
    std::vector<std::string> full_env;
    for (char** e = environ; *e; ++e) full_env.emplace_back(*e);
    for (auto& e : env) full_env.push_back(e);
    std::vector<char*> cenv;
    for (auto& e : full_env) cenv.push_back(e.data());
    cenv.push_back(nullptr);
    std::string cwd = ctx.job_dir.empty() ? dir.string() : ctx.job_dir.string();
    // Opened here, where a failure (a full disk, a missing directory) can be told with its
    // reason, not in the child, which could only exit.
    ChildFiles files;
    COPSE_RETURN_NOT_OK(files.Open(stdin_path, use_stdout ? stdout_path : std::filesystem::path()).WithContext(ctx.name));
    ChildStreams streams(files, ctx.attempt_log);
    // The stage's own memory limit bounds the child's address space (a program that reserves
    // far more than it touches needs a larger resources.memory_mb).
    const rlim_t memory_limit =
        ctx.memory_declared && ctx.memory_limit_bytes > 0 ? static_cast<rlim_t>(ctx.memory_limit_bytes) : 0;

    ChildSetup setup{files.in, files.out, files.err, memory_limit, cwd.c_str(), cargv.data(), cenv.data()};
    const StartedChild child = StartChild(setup);
    const pid_t pid = child.pid;
    if (pid < 0) return Status::Internal(ctx.name + ": cannot start a child process: " + std::strerror(errno));
    files.Close();
    int status = 0;
    while (true) {
      pid_t r = waitpid(pid, &status, WNOHANG);
      if (r == pid) break;
      if (r < 0 && errno != EINTR) {
        ProgramStatus(status, child.status_pipe);  // closes it
        return Status::Internal(ctx.name + ": waitpid failed");
      }
      if (ctx.cancelled()) {
        kill(-pid, SIGKILL);
        kill(pid, SIGKILL);  // before it made its group, too: the init's end ends its namespace
        waitpid(pid, &status, 0);
        ProgramStatus(status, child.status_pipe);  // closes it
        return Status::Cancelled(ctx.name + " cancelled");
      }
      streams.Drain(std::chrono::milliseconds(2));  // its output, or 2 ms
    }
    streams.Drain(std::chrono::milliseconds(0));  // what it wrote last
    status = ProgramStatus(status, child.status_pipe);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      std::string how = WIFEXITED(status) ? "exited with status " + std::to_string(WEXITSTATUS(status))
                                          : "was killed by signal " + std::to_string(WTERMSIG(status));
      if (DiskFull(dir)) how += " (the disk holding " + dir.string() + " is full)";
      if (memory_limit > 0 && WIFSIGNALED(status)) {
        how += " (its address space is limited to its resources.memory_mb, " + std::to_string(memory_limit >> 20) + " MB)";
      }
      // Exit codes the job lists as deterministic fail the job at once (program.h).
      const bool no_retry = WIFEXITED(status) && NoRetry(*ctx.params, WEXITSTATUS(status));
      if (no_retry) how += ", one of params.no_retry_exit_codes";
      std::string err = streams.StderrTail();
      while (!err.empty() && (err.back() == '\n' || err.back() == '\r')) err.pop_back();
      if (err.empty()) err = "(nothing)";
      const std::string message = ctx.name + ": " + argv[0] + " " + how + "; stderr: " + err;
      if (no_retry) return Status::InvalidArgument(message);
      return Status::Internal(message);
    }
    for (size_t k = 0; k < ctx.num_outputs(); ++k) {
      auto path = (k == 0 && use_stdout) ? stdout_path : dir / ("output-" + std::to_string(k));
      COPSE_RETURN_NOT_OK(StreamFileToOutput(path, ctx.output(k)));
    }
    return ctx.CloseOutputs();
  }
};

}  // namespace

void RegisterExecProgram(ProgramRegistry& registry) {
  (void)registry.Register("exec", [] { return std::make_unique<ExecProgram>(); });
}

}  // namespace copse::vertex
