#pragma once
// ClientApi: the answers to what people ask the job manager — job status and history, the
// event log, a vertex's printed log, daemons, outputs, cancel and chaos — made from the
// scheduler and the job history in one place, for the control port's clients (`copse status`,
// `copse logs`, …) and for the HTTP API and dashboard alike, so both say the same thing.
//
// Runs on the job manager's io thread (it reads the scheduler, which has no locks). Every
// answer is a JSON object: the reply's members, with "op" naming its kind, or
// {"op":"error","message":…} naming what was wrong with the request.
#include <cstdint>
#include <optional>
#include <string>

#include "common/json_util.h"
#include "jobmanager/job_history.h"
#include "jobmanager/scheduler.h"
#include "jobmanager/trace_export.h"

namespace copse::jm {

class ClientApi {
 public:
  ClientApi(Scheduler& scheduler, JobHistory& history) : scheduler_(scheduler), history_(history) {}

  /// The reply to a client request of kind `op` ("status", "jobs", "vertex_log", "cancel",
  /// "daemons", "logs", "chaos", "outputs"); nullopt for any other kind (submit, wait and trace
  /// need the connection, and the server answers them).
  std::optional<Json> Answer(const std::string& op, const Json& msg);

  /// A job's status, live or as its history keeps it (with "forgotten": true), or null.
  Json Status(JobId job);
  /// `copse jobs`: the jobs held and those the history keeps, submitted at or after
  /// `since_unix_ms`, by id: the newest `max_jobs` (at most 10,000, what one reply holds).
  Json JobsSince(int64_t since_unix_ms, size_t max_jobs = kMaxJobRows) const;
  static constexpr size_t kMaxJobRows = 10000;
  /// A job's trace, live or from its history, with at most the newest `max_spans` spans.
  Result<TraceSnapshot> Trace(JobId job, size_t max_spans = SIZE_MAX) const;
  /// Vertices of a job, a page at a time (see Scheduler::VertexPage); a forgotten job's from its
  /// history: the vertices that ran, each "completed" or (its job failed or was cancelled)
  /// "waiting", with its newest attempt's outcome.
  Json Vertices(JobId job, const Scheduler::VertexFilter& filter) const;
  /// The progress figures a job's programs reported, over time (see Scheduler::ProgressSeries).
  Json ProgressSeries(JobId job) const;

  /// `status`, with whether the attempt that failed its job printed anything (what `copse
  /// status` points at with `copse logs`).
  Json WithLogHint(Json status);
  /// A job the scheduler has forgotten (--finished-job-ttl-s), as its history keeps it, or null.
  Json ForgottenSummary(JobId job) const;

 private:
  Json VertexLog(const Json& msg);
  Json EventLog(JobId job, const std::string& vertex);
  Json Outputs(JobId job);

  Scheduler& scheduler_;
  JobHistory& history_;
};

/// {"op":"error","message":message}
Json ErrorReply(std::string message);

/// The job a request names ("job": a whole number), or an invalid id.
JobId JobIdFrom(const Json& msg);

}  // namespace copse::jm
