#pragma once
// The client side of a job's trace (jobmanager/trace_streamer.h): the job manager sends it in
// parts, which are written out or handed on as they arrive.
#include <cstdint>
#include <functional>
#include <ostream>

#include "common/framed_connection.h"
#include "common/json_util.h"

namespace copse::cli {

/// Asks for job `job`'s trace and calls `on_event` with each of its events in order; returns
/// the members that close it (displayTimeUnit, otherData). The job manager's error (no such
/// job) comes back as FailedPrecondition.
Result<Json> ReceiveTrace(net::BlockingClient& client, uint64_t job, const std::function<void(const Json& event)>& on_event);

/// Writes job `job`'s trace to `out` as one Chrome/Perfetto trace-event JSON document, event by
/// event as they arrive (a job of a million attempts makes some 200 MB of it).
Status WriteTrace(net::BlockingClient& client, uint64_t job, std::ostream& out);

/// WriteTrace into the file at `path`; a trace that fails half way is removed rather than left
/// looking like one. IOError names the path when it cannot be written.
Status WriteTraceFile(net::BlockingClient& client, uint64_t job, const std::string& path);

}  // namespace copse::cli
