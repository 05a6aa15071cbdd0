#include "common/dir_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace copse {

Result<DirLock> DirLock::Acquire(const std::filesystem::path& dir, const std::string& what) {
  const std::filesystem::path path = dir / ".lock";
  // O_CLOEXEC: a vertex the daemon starts must not inherit (and so keep) the lock.
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (fd < 0) return Status::IOError("cannot open " + path.string() + ": " + std::strerror(errno));
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    char holder[32] = {0};
    const ssize_t n = ::pread(fd, holder, sizeof(holder) - 1, 0);
    ::close(fd);
    if (err != EWOULDBLOCK) return Status::IOError("cannot lock " + path.string() + ": " + std::strerror(err));
    std::string pid(holder, n > 0 ? static_cast<size_t>(n) : 0);
    while (!pid.empty() && (pid.back() == '\n' || pid.back() == ' ')) pid.pop_back();
    return Status::AlreadyExists(what + " " + dir.string() + " is in use by another process" +
                                 (pid.empty() ? "" : " (pid " + pid + ")") + "; give each its own");
  }
  const std::string pid = std::to_string(::getpid()) + "\n";
  // Only for the next one's message: the lock holds whether or not this write does.
  if (::ftruncate(fd, 0) == 0) {
    const ssize_t written = ::pwrite(fd, pid.data(), pid.size(), 0);
    (void)written;
  }
  return DirLock(fd);
}

DirLock& DirLock::operator=(DirLock&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = other.fd_;
    other.fd_ = -1;
  }
  return *this;
}

DirLock::~DirLock() {
  if (fd_ >= 0) ::close(fd_);  // closing the last descriptor drops the flock
}

}  // namespace copse
