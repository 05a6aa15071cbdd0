#pragma once
// Rendering a job's status for people: per stage a progress bar of done / running / failed,
// elapsed time, the failure, why vertices wait, injected faults and recoveries.
#include <string>

#include "common/json_util.h"

namespace copse::cli {

/// Multi-line text of one job's status (the "job" object the job manager returns).
std::string RenderJobStatus(const Json& job, bool color);
/// The jobs table; `submitted` adds when each was submitted, in local time (`copse jobs`).
std::string RenderJobsTable(const Json& jobs, bool submitted = false);
/// One row per daemon name, its newest registration; `all` adds the superseded ones (a daemon
/// that registered again after its return grace keeps its old, lost row).
std::string RenderDaemonsTable(const Json& daemons, bool all = false);
/// "  output DIR/counts.txt (254 bytes)" per output copied ([{path, bytes}], FetchOutputs).
std::string RenderCopiedOutputs(const Json& outputs);
/// What `copse chaos` did, in a line or two: the job manager's answer to a chaos request.
std::string RenderChaosReply(const Json& done);

}  // namespace copse::cli
