#pragma once
// DirLock: one process at a time in a directory that holds a server's state (a job manager's
// state directory, a daemon's work directory). Two job managers on one journal would each
// rewrite it and lose the other's jobs; two daemons on one work directory delete each other's
// outputs. An flock(2) on DIR/.lock, taken without waiting and held while the object lives:
// the kernel drops it when the process dies, however it dies, so a crash leaves nothing stale
// to clean up. The holder writes its pid in the file for the next one's error message.
#include <filesystem>
#include <string>

#include "common/status.h"

namespace copse {

class DirLock {
 public:
  /// Locks `dir` (which must exist); AlreadyExists naming the holder's pid when another process
  /// (or another DirLock of this one) holds it. `what` names the directory's role in errors
  /// ("state directory").
  static Result<DirLock> Acquire(const std::filesystem::path& dir, const std::string& what);

  DirLock(DirLock&& other) noexcept : fd_(other.fd_) { other.fd_ = -1; }
  DirLock& operator=(DirLock&& other) noexcept;
  DirLock(const DirLock&) = delete;
  DirLock& operator=(const DirLock&) = delete;
  ~DirLock();

 private:
  explicit DirLock(int fd) : fd_(fd) {}
  int fd_ = -1;
};

}  // namespace copse
