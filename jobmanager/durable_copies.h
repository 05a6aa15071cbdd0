#pragma once
// DurableCopyFiles: the job manager's StorageSink on the local file system. A job's durable
// channel copies (job_spec.h `durable`) live under <job dir>/<durable_dir>/job<J> on storage
// the daemons share; once the job ends (or an earlier job manager's job of the same id is
// replaced) that directory is removed, and its parent once empty. Failures are logged, not
// returned: a copy left behind costs disk, never a job.
#include <string>

#include "jobmanager/scheduler.h"

namespace copse::jm {

class DurableCopyFiles final : public StorageSink {
 public:
  void RemoveDurableCopies(JobId job, const std::string& dir) override;
};

}  // namespace copse::jm
