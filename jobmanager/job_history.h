#pragma once
// JobHistory: what the job manager keeps of every job on disk, so that it outlives the job
// manager's restarts and the scheduler forgetting the job (--finished-job-ttl-s), as Spark's
// history server keeps finished applications: `copse jobs` lists them, and `copse status`,
// `copse logs` and `copse trace` answer from here for a job the scheduler no longer holds.
//
// Layout, under the job manager's state directory (mode 0700, files 0600):
//   history/<job>/events.jsonl   appended as the job runs (Scheduler's HistorySink): its event
//                                lines {"l": text, "v": vertex} and each ended attempt's span
//                                {"s": [vertex, version, start_ms, end_ms], "o": outcome,
//                                 "d": daemon, "n": vertex name, "st": stage, "b": lines before}
//   history/<job>/summary.json   its final status, written when it finishes
//   history/<job>/logs/<vertex>.<version>.jsonl   what each attempt printed, as the daemon's
//                                {"stream", "text"} chunks (vertex/attempt_log.h)
// A restarted job manager reads events.jsonl back into the jobs its journal restores, so a
// resumed job's trace and event log cover its whole life. Lines are buffered and written at
// every Flush (each scheduler tick): a crash loses at most a tick of them, never the journal's
// state. Each job keeps at most kMaxEventBytes of events and kMaxVertexLogBytes of vertex logs.
// Finished jobs older than the retention are removed (Prune).
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "common/json_util.h"
#include "common/status.h"
#include "jobmanager/scheduler.h"
#include "jobmanager/trace_export.h"

namespace copse::jm {

class JobHistory final : public HistorySink {
 public:
  static constexpr uint64_t kMaxEventBytes = 256ull << 20;
  static constexpr uint64_t kMaxVertexLogBytes = 256ull << 20;

  /// Opens (creating) `dir`.
  static Result<std::unique_ptr<JobHistory>> Open(std::filesystem::path dir);
  ~JobHistory() override;

  // ---- HistorySink: as the job runs ----------------------------------------------------------
  void JobLine(JobId job, VertexId vertex, const std::string& line) override;
  void JobSpan(JobId job, const HistorySpan& span) override;
  void JobFinished(JobId job, const Json& summary) override;
  /// Writes the buffered events to their files.
  void Flush();

  // ---- vertex logs ---------------------------------------------------------------------------
  /// Appends `chunks` ([{"stream", "text"}], as a daemon sends them) to an attempt's log. Chunks
  /// not of that shape are refused (InvalidArgument); past the job's budget they are dropped,
  /// with a note in the log where that happened.
  Status AppendVertexLog(JobId job, VertexId vertex, uint32_t version, const Json& chunks);
  struct LogRead {
    Json records = Json::array();  // [{"stream", "text"}]
    uint64_t next = 0;             // the offset to ask from next time
  };
  /// An attempt's log from byte `from`, at most about `max_bytes` of it (whole records).
  LogRead ReadVertexLog(JobId job, VertexId vertex, uint32_t version, uint64_t from, size_t max_bytes) const;
  /// The versions of `vertex` that printed something.
  std::vector<uint32_t> LoggedVersions(JobId job, VertexId vertex) const;

  // ---- reading back --------------------------------------------------------------------------
  struct Events {
    std::vector<std::pair<VertexId, std::string>> lines;
    std::vector<HistorySpan> spans;
    std::map<uint32_t, std::pair<std::string, std::string>> names;  // vertex -> (name, stage)
    bool truncated = false;  // it reached kMaxEventBytes
  };
  /// What events.jsonl holds of `job` (empty when nothing); lines that do not parse are skipped.
  Events Load(JobId job) const;
  /// `copse logs JOB [VERTEX]` of a job read back: its event lines (of one vertex, by name),
  /// or null when no attempt of a vertex of that name ended.
  static Json EventLog(const Events& events, const std::string& vertex);
  /// `copse trace JOB` of a job read back, whose final status is `summary`.
  static TraceSnapshot Trace(JobId job, const Events& events, const Json& summary);
  /// The final status of a finished job, when there is one.
  std::optional<Json> Summary(JobId job) const;
  /// The summaries of finished jobs submitted at or after `since_unix_ms`.
  std::vector<Json> Summaries(int64_t since_unix_ms) const;
  /// The jobs that have a directory here.
  std::vector<JobId> Jobs() const;
  /// Removes finished jobs that finished before `before_unix_ms`, except those in `keep`.
  size_t Prune(int64_t before_unix_ms, const std::set<uint64_t>& keep);

 private:
  explicit JobHistory(std::filesystem::path dir) : dir_(std::move(dir)) {}
  std::filesystem::path JobDir(JobId job) const { return dir_ / std::to_string(job.value()); }
  std::filesystem::path VertexLogPath(JobId job, VertexId vertex, uint32_t version) const;
  /// Where `bytes` more of `job`'s events go before the next Flush, or null once its budget
  /// is spent (noted in its events once).
  std::string* Room(JobId job, size_t bytes);

  std::filesystem::path dir_;
  struct Pending {
    std::string text;
    uint64_t written = 0;  // bytes in events.jsonl
    bool known = false;    // written counted from the file
    bool full_noted = false;
  };
  std::map<uint64_t, Pending> events_;
  std::map<uint64_t, uint64_t> vertex_log_bytes_;  // per job, counted from disk on first use
};

}  // namespace copse::jm
