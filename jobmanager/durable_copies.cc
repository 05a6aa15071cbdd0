#include "jobmanager/durable_copies.h"

#include <filesystem>
#include <system_error>

#include "common/logging.h"

namespace copse::jm {

void DurableCopyFiles::RemoveDurableCopies(JobId job, const std::string& dir) {
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  if (ec) Logger("sched")->warn("job={} cannot remove {}: {}", job.value(), dir, ec.message());
  std::filesystem::remove(std::filesystem::path(dir).parent_path(), ec);  // only when empty
}

}  // namespace copse::jm
