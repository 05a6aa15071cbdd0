#include "cli/run_directory.h"

#include <stdlib.h>

namespace copse::cli {

Result<std::unique_ptr<RunDirectory>> RunDirectory::Make(const std::string& keep, const std::string& prefix) {
  if (keep.empty()) {
    std::string tmpl = "/tmp/" + prefix + "-XXXXXX";
    if (!::mkdtemp(tmpl.data())) return Status::IOError("cannot create a temporary directory under /tmp");
    return std::unique_ptr<RunDirectory>(new RunDirectory(tmpl, true));
  }
  std::error_code ec;
  std::filesystem::path dir = std::filesystem::absolute(keep, ec);
  if (!ec) std::filesystem::create_directories(dir, ec);
  if (ec) return Status::InvalidArgument("--keep " + keep + ": cannot make it a directory: " + ec.message());
  return std::unique_ptr<RunDirectory>(new RunDirectory(std::move(dir), false));
}

RunDirectory::~RunDirectory() {
  std::error_code ignored;
  if (temporary_) std::filesystem::remove_all(path_, ignored);
}

}  // namespace copse::cli
