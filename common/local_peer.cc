#include "common/local_peer.h"

#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace copse::net {

Status CheckLocalPeer(int fd, const std::string& name) {
  ucred peer{};
  socklen_t len = sizeof peer;
  if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &peer, &len) != 0) {
    return Status::PermissionDenied("cannot tell who listens on local socket \"" + name + "\": " + std::strerror(errno));
  }
  if (peer.uid == ::geteuid() || peer.uid == 0) return Status::OK();
  return Status::PermissionDenied("local socket \"" + name + "\" is held by uid " + std::to_string(peer.uid) + " (pid " +
                                  std::to_string(peer.pid) + "), not by this user or root");
}

}  // namespace copse::net
