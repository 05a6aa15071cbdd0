#pragma once
// RunDirectory: where a command that starts a local cluster (`copse run`, `copse plan`) keeps
// its files — the directory --keep names (made when missing, never removed), or a new one under
// /tmp that is removed with this object unless Keep() was called first.
#include <filesystem>
#include <memory>
#include <string>

#include "common/status.h"

namespace copse::cli {

class RunDirectory {
 public:
  /// `keep` (made absolute) when not empty, else a new /tmp/`prefix`-XXXXXX. InvalidArgument
  /// naming --keep when it cannot be made a directory.
  static Result<std::unique_ptr<RunDirectory>> Make(const std::string& keep, const std::string& prefix);
  ~RunDirectory();
  RunDirectory(const RunDirectory&) = delete;
  RunDirectory& operator=(const RunDirectory&) = delete;

  const std::filesystem::path& path() const { return path_; }
  /// Whether it goes with this object.
  bool temporary() const { return temporary_; }
  /// Leaves it in place (its logs, for a person to read).
  void Keep() { temporary_ = false; }

 private:
  RunDirectory(std::filesystem::path path, bool temporary) : path_(std::move(path)), temporary_(temporary) {}
  std::filesystem::path path_;
  bool temporary_;
};

}  // namespace copse::cli
