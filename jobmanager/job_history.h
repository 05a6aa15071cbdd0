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
// every Flush (each tick of the job manager): a crash loses at most a tick of them, never the journal's
// state. Each job keeps at most kMaxEventBytes of events and kMaxVertexLogBytes of vertex logs,
// and nothing more is written while the file system has less than 256 MiB (or 1 %) free.
// Finished jobs older than the retention are removed (Prune), and so are directories of jobs
// that never finished here (a journal record skipped at a restart) once that old. Files are
// data from disk: whatever does not parse is skipped, never thrown. Used on the job manager's
// io thread only.
#include <chrono>
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
#include "protocol/daemon.pb.h"

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
  void JobProgress(JobId job, const Json& point) override;
  void JobFinished(JobId job, const Json& summary) override;
  /// Writes the buffered events, and the summaries of the jobs that finished since, to their
  /// files. The job manager calls it every tick (50 ms), not on the path of each reply: a crash
  /// loses at most a tick of lines, and a summary lost so is written again at the restart.
  void Flush();

  // ---- vertex logs ---------------------------------------------------------------------------
  /// Appends `chunks` (a daemon's VertexLog) to an attempt's log; past the job's budget they
  /// are dropped, with a note in the log where that happened.
  Status AppendVertexLog(JobId job, VertexId vertex, uint32_t version,
                         const google::protobuf::RepeatedPtrField<protocol::LogChunk>& chunks);
  struct LogRead {
    Json records = Json::array();  // [{"stream", "text"}]
    uint64_t next = 0;             // the offset to ask from next time
  };
  /// An attempt's log from byte `from`, at most about `max_bytes` of it (whole records).
  LogRead ReadVertexLog(JobId job, VertexId vertex, uint32_t version, uint64_t from, size_t max_bytes) const;
  /// The versions of `vertex` that printed something.
  std::vector<uint32_t> LoggedVersions(JobId job, VertexId vertex);

  // ---- reading back --------------------------------------------------------------------------
  struct Events {
    std::vector<std::pair<VertexId, std::string>> lines;
    std::vector<HistorySpan> spans;
    std::map<uint32_t, std::pair<std::string, std::string>> names;  // vertex -> (name, stage)
    std::vector<Json> progress;                                     // the progress series' points
    bool truncated = false;                                         // it reached kMaxEventBytes
  };
  /// What events.jsonl holds of `job` (empty when nothing); lines that do not parse are
  /// skipped. The last job loaded is kept, for a client asking again.
  std::shared_ptr<const Events> Load(JobId job) const;
  /// `copse logs JOB [VERTEX]` of a job read back: its event lines (of one vertex, by name),
  /// or null when no attempt of a vertex of that name ended.
  static Json EventLog(const Events& events, const std::string& vertex);
  /// `copse trace JOB` of a job read back, whose final status is `summary`.
  static TraceSnapshot Trace(JobId job, const Events& events, const Json& summary);
  /// The final status of a finished job (null when there is none), without its progress series.
  /// Valid until the next JobFinished or Prune.
  const Json* Summary(JobId job) const;
  /// The summaries of finished jobs submitted at or after `since_unix_ms` (as Summary's), the
  /// newest `max_jobs` of them (by id), oldest first.
  std::vector<const Json*> Summaries(int64_t since_unix_ms, size_t max_jobs = SIZE_MAX) const;
  /// The progress figures a finished job's programs reported over time (its summary's
  /// "progress_series", kept apart from it on disk: the summaries stay small in memory); an
  /// empty array when none.
  Json ProgressSeries(JobId job) const;
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
  void WriteSummary(JobId job);
  /// Whether the file system holding the history has room to spare: below kMinFreeBytes (or
  /// 1 %) the history stops growing, so that it never takes the room the journal needs.
  /// Checked at most once a second.
  bool DiskHasRoom();
  /// The vertex log index of `job` (which attempts printed, and how much in all), read from
  /// its directory on first use.
  struct VertexLogs {
    std::map<uint32_t, std::set<uint32_t>> versions;  // vertex -> versions with a log
    uint64_t bytes = 0;
    bool full_noted = false;
  };
  VertexLogs& VertexLogsOf(JobId job);

  static constexpr uint64_t kMinFreeBytes = 256ull << 20;
  std::filesystem::path dir_;
  struct Pending {
    std::string text;
    uint64_t written = 0;  // bytes in events.jsonl
    bool known = false;    // written counted from the file
    bool full_noted = false;
  };
  std::map<uint64_t, Pending> events_;  // of jobs that have not finished (or wrote since)
  std::map<uint64_t, VertexLogs> vertex_logs_;
  std::map<uint64_t, Json> summaries_;           // every finished job's, read at Open
  std::map<uint64_t, Json> unwritten_progress_;  // progress series until WriteSummary
  std::set<uint64_t> unwritten_summaries_;       // finished since the last Flush
  /// The jobs loaded last (a few: dashboards looking at forgotten jobs ask again and again).
  mutable std::vector<std::pair<uint64_t, std::shared_ptr<const Events>>> loaded_;
  static constexpr size_t kLoadedJobs = 4;
  std::chrono::steady_clock::time_point disk_checked_{};
  bool disk_has_room_ = true;
};

}  // namespace copse::jm
