#pragma once
// Who listens on a local socket. Names in Linux's abstract namespace (the job manager's and
// the data servers' local sockets) have no file permissions: any user may bind one first.
#include <string>

#include "common/status.h"

namespace copse::net {

/// Whether the process listening at the other end of local socket `fd` (named `name`) runs as
/// this process's user or as root: only such a process could read the secret file. Any user
/// may bind an abstract-namespace name first, and such a listener could relay the mutual
/// handshake to the real server over TCP and then speak for it (nothing after the handshake is
/// MACed). PermissionDenied naming its uid otherwise; callers then use TCP.
Status CheckLocalPeer(int fd, const std::string& name);

}  // namespace copse::net
