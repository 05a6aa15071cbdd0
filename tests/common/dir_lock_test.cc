// DirLock: one process at a time in a server's directory, and nothing stale after a crash.
#include <doctest/doctest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <string>

#include "common/dir_lock.h"

namespace copse {
namespace {

std::filesystem::path FreshDir(const std::string& name) {
  auto dir = std::filesystem::temp_directory_path() / (name + "-" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

TEST_CASE("DirLock.OneHolderAtATimeNamedInTheRefusal") {
  const auto dir = FreshDir("copse-dir-lock");
  {
    auto first = DirLock::Acquire(dir, "work dir");
    REQUIRE_MESSAGE(first.ok(), first.status().ToString());
    auto second = DirLock::Acquire(dir, "work dir");
    CHECK(second.status().code() == StatusCode::kAlreadyExists);
    CHECK_MESSAGE(second.status().message().find("work dir " + dir.string() + " is in use by another process (pid " +
                                                 std::to_string(::getpid()) + ")") != std::string::npos,
                  second.status().ToString());
  }
  CHECK(DirLock::Acquire(dir, "work dir").ok());  // released with its holder
  std::filesystem::remove_all(dir);
}

TEST_CASE("DirLock.AKilledHoldersLockIsFreeAtOnce" * doctest::timeout(30)) {
  const auto dir = FreshDir("copse-dir-lock-killed");
  int ready[2];
  REQUIRE(::pipe(ready) == 0);
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    auto lock = DirLock::Acquire(dir, "state directory");
    const char byte = lock.ok() ? 1 : 0;
    if (::write(ready[1], &byte, 1) != 1) ::_exit(2);
    ::pause();  // until killed: no destructor runs
    ::_exit(0);
  }
  char byte = 0;
  REQUIRE(::read(ready[0], &byte, 1) == 1);
  REQUIRE(byte == 1);
  auto taken = DirLock::Acquire(dir, "state directory");
  CHECK_MESSAGE(taken.status().message().find("(pid " + std::to_string(child) + ")") != std::string::npos,
                taken.status().ToString());
  ::kill(child, SIGKILL);
  ::waitpid(child, nullptr, 0);
  ::close(ready[0]);
  ::close(ready[1]);
  CHECK(DirLock::Acquire(dir, "state directory").ok());
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace copse
