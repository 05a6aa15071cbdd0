#include "tests/child_process.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <doctest/doctest.h>

#include <cstdint>
#include <cstdio>
#include <map>
#include <vector>

extern char** environ;

namespace copse::testing {
namespace {

constexpr int kToParentFd = 3;

std::map<std::string, ChildBody>& Registry() {
  static std::map<std::string, ChildBody> bodies;
  return bodies;
}

bool ReadAll(int fd, void* data, size_t n) {
  auto* p = static_cast<char*>(data);
  while (n > 0) {
    ssize_t got = ::read(fd, p, n);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) return false;
    p += got;
    n -= static_cast<size_t>(got);
  }
  return true;
}

bool WriteAll(int fd, const void* data, size_t n) {
  auto* p = static_cast<const char*>(data);
  while (n > 0) {
    ssize_t put = ::write(fd, p, n);
    if (put < 0 && errno == EINTR) continue;
    if (put <= 0) return false;
    p += put;
    n -= static_cast<size_t>(put);
  }
  return true;
}

bool WriteString(int fd, const std::string& text) {
  uint32_t len = static_cast<uint32_t>(text.size());
  return WriteAll(fd, &len, sizeof len) && WriteAll(fd, text.data(), text.size());
}

bool ReadString(int fd, std::string* text) {
  uint32_t len = 0;
  if (!ReadAll(fd, &len, sizeof len)) return false;
  text->resize(len);
  return ReadAll(fd, text->data(), len);
}

}  // namespace

ChildRegistrar::ChildRegistrar(const char* name, ChildBody body) { Registry()[name] = body; }

int RunChild(const std::string& name) {
  auto it = Registry().find(name);
  if (it == Registry().end()) {
    std::fprintf(stderr, "no test child named '%s'\n", name.c_str());
    return 2;
  }
  return it->second();
}

std::string ReceiveFromParent() {
  std::string text;
  return ReadString(STDIN_FILENO, &text) ? text : std::string();
}

bool SendToParent(const std::string& text) { return WriteString(kToParentFd, text); }

ChildProcess::ChildProcess(const std::string& name) {
  int down[2], up[2];
  REQUIRE(::pipe2(down, O_CLOEXEC) == 0);
  REQUIRE(::pipe2(up, O_CLOEXEC) == 0);
  std::vector<char> self(4096);
  ssize_t len = ::readlink("/proc/self/exe", self.data(), self.size() - 1);
  REQUIRE(len > 0);
  self[static_cast<size_t>(len)] = '\0';
  std::string flag = "--copse-child", child = name;
  char* argv[] = {self.data(), flag.data(), child.data(), nullptr};
  // dup2 clears close-on-exec on the targets, so only fds 0 and 3 reach the child.
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, down[0], STDIN_FILENO);
  posix_spawn_file_actions_adddup2(&actions, up[1], kToParentFd);
  int rc = ::posix_spawn(&pid_, self.data(), &actions, nullptr, argv, environ);
  posix_spawn_file_actions_destroy(&actions);
  ::close(down[0]);
  ::close(up[1]);
  to_child_ = down[1];
  from_child_ = up[0];
  REQUIRE_MESSAGE(rc == 0, "posix_spawn of test child '" << name << "' failed: " << rc);
}

ChildProcess::~ChildProcess() {
  Kill();
  if (to_child_ >= 0) ::close(to_child_);
  if (from_child_ >= 0) ::close(from_child_);
}

void ChildProcess::Send(const std::string& text) { REQUIRE(WriteString(to_child_, text)); }

std::string ChildProcess::Receive() {
  std::string text;
  REQUIRE_MESSAGE(ReadString(from_child_, &text), "test child " << pid_ << " ended without answering");
  return text;
}

// Both act on this child only: once it is reaped, pid_ is -1, which kill() and waitpid() would
// read as "every process" and "any child".
int ChildProcess::Wait() {
  REQUIRE_MESSAGE(pid_ > 0, "test child already reaped");
  int status = 0;
  ::waitpid(pid_, &status, 0);
  pid_ = -1;
  return status;
}

void ChildProcess::Kill() {
  if (pid_ <= 0) return;
  ::kill(pid_, SIGKILL);
  ::waitpid(pid_, nullptr, 0);
  pid_ = -1;
}

}  // namespace copse::testing
