#pragma once
// Process helpers for the CLI: stopping servers on SIGINT/SIGTERM, and starting/stopping the
// child processes of `copse run` by their ids.
#include <functional>
#include <map>
#include <string>
#include <sys/types.h>
#include <vector>

#include "common/status.h"

namespace copse::cli {

/// Calls `stop` from a dedicated thread when SIGINT or SIGTERM arrives, whichever thread the
/// kernel hands it to (a handler wakes that thread; threads libraries started before main take
/// the signal too). Blocks both in this thread and the threads it starts later, so that their
/// system calls are not interrupted: call before starting worker threads.
void StopOnSignals(std::function<void()> stop);

/// Starts `exe args…` with this process's environment plus `env`, its standard output and
/// error appended to `log_file` (posix_spawn: safe from any thread of a multi-threaded
/// process). A copse child with COPSE_DIE_WITH_PARENT set dies with its parent.
Result<pid_t> SpawnProcess(const std::string& exe, const std::vector<std::string>& args,
                           const std::map<std::string, std::string>& env, const std::string& log_file);

/// Starts this copse binary with `args` as a child that dies with its parent.
Result<pid_t> SpawnSelf(const std::vector<std::string>& args, std::map<std::string, std::string> env,
                        const std::string& log_file);

/// SIGTERM, then SIGKILL after `grace_ms`; reaps the children.
void StopChildren(const std::vector<pid_t>& pids, int grace_ms);

/// True when the child has exited (reaps it).
bool ChildExited(pid_t pid);

}  // namespace copse::cli
