// Who holds a local socket: this user (or root) is trusted, anyone else is not.
#include "common/local_peer.h"

#include <signal.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <string>

#include <doctest/doctest.h>

namespace copse::net {
namespace {

TEST_CASE("LocalPeer.ThisUsersPeerIsTrusted") {
  int fds[2];
  REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM, 0, fds) == 0);
  CHECK(CheckLocalPeer(fds[0], "pair").ok());
  ::close(fds[0]);
  ::close(fds[1]);
}

TEST_CASE("LocalPeer.AnotherUsersListenerIsNot" * doctest::timeout(10)) {
  if (::geteuid() != 0) {
    MESSAGE("skipped: only root can start a listener as another user here");
    return;
  }
  // A child, as nobody, binds an abstract name first: what a squatter on the job manager's
  // local socket name would do.
  const std::string name = "copse-test-squatter/" + std::to_string(::getpid());
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path + 1, name.data(), name.size());
  const socklen_t len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
  int ready[2];
  REQUIRE(::pipe(ready) == 0);
  pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    int s = ::socket(AF_UNIX, SOCK_STREAM, 0);
    if (::setgid(65534) != 0 || ::setuid(65534) != 0 || ::bind(s, reinterpret_cast<sockaddr*>(&addr), len) != 0 ||
        ::listen(s, 4) != 0) {
      ::_exit(1);
    }
    (void)!::write(ready[1], "r", 1);
    for (;;) ::pause();
  }
  char byte = 0;
  REQUIRE(::read(ready[0], &byte, 1) == 1);
  int c = ::socket(AF_UNIX, SOCK_STREAM, 0);
  REQUIRE(::connect(c, reinterpret_cast<sockaddr*>(&addr), len) == 0);
  Status st = CheckLocalPeer(c, name);
  ::close(c);
  ::kill(child, SIGKILL);
  ::waitpid(child, nullptr, 0);
  ::close(ready[0]);
  ::close(ready[1]);
  CHECK(st.code() == StatusCode::kPermissionDenied);
  CHECK_MESSAGE(st.message().find("is held by uid 65534") != std::string::npos, st.ToString());
}

}  // namespace
}  // namespace copse::net
