#pragma once
// The scheduler's private state (what it knows of each daemon, each vertex's run, each job)
// and the helpers its parts share. Included only by the files that implement Scheduler, one
// concern each:
//   scheduler.cc            jobs: submission, readiness, attempt reports, chained dispatch,
//                           output lifetimes, failures and lineage (re-running lost outputs)
//   scheduler_daemons.cc    daemons joining, lost and coming back
//   scheduler_journal.cc    restoring from the journal; snapshots for its compaction
//   scheduler_placement.cc  placing ready vertices and gangs, dispatching, flushing to daemons
//   scheduler_clock.cc      the clock: timeouts, stragglers, return graces, forgetting jobs
//   scheduler_chaos.cc      injected faults: copse chaos, the random monkey, the job file's
//   scheduler_queries.cc    what the CLI is shown: status, tables, logs, output locations
#include <algorithm>
#include <chrono>
#include <memory>
#include <queue>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "common/logging.h"
#include "jobmanager/scheduler.h"

namespace copse::jm {

std::shared_ptr<spdlog::logger> SchedLog();

/// The most lines a job's log keeps, and `copse logs` answers with (a reply must stay well
/// within one control message).
inline constexpr size_t kMaxLogLines = 20000;
/// The most attempt spans a job's trace keeps.
inline constexpr size_t kMaxSpans = 1'000'000;

/// The memory daemon `spec` offers vertices: what it declared, or unaccounted when it declared
/// none (or more than is ever accounted).
inline int64_t MemoryOf(const DaemonSpec& spec) {
  return spec.memory_mb > 0 ? std::min(spec.memory_mb, kUnaccountedMemoryMb) : kUnaccountedMemoryMb;
}

/// The memory of each of daemon `spec`'s GPUs: what it reported, or unaccounted when it
/// reported none (a daemon that could not tell, or has no GPUs).
inline int64_t GpuMemoryOf(const DaemonSpec& spec) {
  return spec.gpu_memory_mb > 0 ? std::min(spec.gpu_memory_mb, kUnaccountedMemoryMb) : kUnaccountedMemoryMb;
}

/// How an output port is stored: as its first channel's kind; a port no channel reads (a
/// declared job output) is a file.
inline ChannelKind PortKind(const JobGraph& g, const std::vector<ChannelId>& port) {
  return port.empty() ? ChannelKind::kFile : g.channel(port.front()).kind;
}

/// Calls fn for every vertex that reads v's outputs (not live ones) or is ordered after it; a
/// vertex with several such edges is visited once per edge.
template <typename Fn>
void ForEachSuccessor(const JobGraph& g, VertexId v, Fn&& fn) {
  for (const auto& port : g.vertex(v).outputs) {
    for (ChannelId ch : port) {
      if (!IsLive(g.channel(ch).kind)) fn(g.channel(ch).to);
    }
  }
  for (ChannelId ch : g.vertex(v).order_out) fn(g.channel(ch).to);
}

struct Scheduler::Daemon {
  DaemonId id;
  DaemonSpec spec;
  bool alive = true;
  // Named by the journal and not re-registered since the restart, or lost with file outputs
  // held for its return: not placed on, its outputs' consumers wait, until awaiting_until.
  bool awaiting = false;
  TimePoint awaiting_until{};
  std::string awaiting_why;  // what DaemonLost says when it does not come back in time
  TimePoint returned_at{};   // when it last came back awaited (a new process, maybe at the same address)
  // A kill or cut was injected (chaos, a job's fault): a loss until then is explained by it and
  // not counted against the attempts running there (max_daemon_losses).
  TimePoint loss_injected_until{};
  double free_cpus = 0;
  int free_gpus = 0;
  int64_t free_memory_mb = 0;
  size_t running = 0;
  Json Address() const { return {{"host", spec.data_host}, {"port", spec.data_port}}; }
};

struct Scheduler::Run {
  VertexState state = VertexState::kWaiting;
  uint32_t version = 0;      // of the current or last attempt; 0 before the first
  uint32_t dup_version = 0;  // a straggler's duplicate attempt running beside it (0: none)
  DaemonId dup_daemon;
  TimePoint dup_started{};
  int charged = 0;        // failed attempts that count against max_attempts
  int daemon_losses = 0;  // its daemon lost, no fault injected, while it ran (max_daemon_losses)
  // (input port, input_lost failures) since it last completed, per input that was lost (not charged).
  std::vector<std::pair<int, int>> inputs_lost;
  uint32_t pending = 0;  // predecessors not completed
  DaemonId daemon;       // running there, or holding the outputs
  std::vector<uint64_t> output_bytes;
  std::vector<uint64_t> output_messages;
  bool released = false;           // outputs garbage-collected (retained ports excepted): every consumer had completed
  bool retained_released = false;  // its retained ports too: it settled (Settle)
  TimePoint ready_since{};
  TimePoint started{};
  // A consumer could not connect to its file output while its daemon still looked alive (the
  // report won the race with the connection's close, or the daemon is cut off from its peers):
  // held as if the daemon were awaited until then, once per completed version.
  TimePoint unreachable_hold_until{};
  // Dispatched chained: waits on its daemon for these predecessors' current attempts to
  // succeed (at most one of them elsewhere); empty once it has started, and once it completed
  // (it may, before the report of a predecessor elsewhere arrives).
  std::vector<VertexId> chained_after;
  double duration_ms = 0;
  std::string last_error;
  // Set to `version` when that completed version's outputs were counted lost with its daemon
  // (given up): should that daemon come back under its name holding them before the vertex
  // runs again, they are its outputs again (Scheduler::AdoptOutputs).
  uint32_t lost_with_daemon_version = 0;
  // A mirrored output's copy of this version in another daemon's memory (scheduler_mirrors.cc):
  // being made there (mirror_ready false), or whole (true). Invalid: no copy.
  DaemonId mirror;
  bool mirror_ready = false;
  bool release_after_mirror = false;    // released while its copy was being made: OnMirrored releases it
  uint64_t moved = 0;                   // Scheduler::mirror_moves_ when its output last moved to its mirror
  uint64_t dispatched_after_moves = 0;  // mirror_moves_ when its current attempt was sent (with its inputs' places)
};

struct Scheduler::Job {
  JobId id;
  std::shared_ptr<const JobGraph> graph;
  std::string job_dir;
  /// Where this job's `durable` channels keep their copies (empty when it has none).
  std::string durable_dir;
  JobState state = JobState::kRunning;
  std::string failure;
  /// The vertex and attempt of its last charged failure (the one that failed it, if it failed).
  std::pair<std::string, uint32_t> failed_attempt;
  std::vector<Run> runs;
  /// Ready vertices, smallest priority first (see Priorities).
  std::priority_queue<std::pair<uint32_t, uint32_t>, std::vector<std::pair<uint32_t, uint32_t>>, std::greater<>> ready;
  std::vector<uint32_t> priority;  // per vertex; empty until a vertex first becomes ready (MakeReady)
  std::set<uint32_t> running;
  size_t completed = 0;
  size_t completions = 0;  // every successful attempt, for fault triggers
  TimePoint started{}, finished{};
  /// When it was submitted, on the wall clock: the journal carries it across a job manager
  /// restart (the injected Clock starts anew), so a job's elapsed time does not restart.
  int64_t submitted_unix_ms = 0;
  /// Restored while running: which of its faults had fired is not known (not journaled);
  /// carried through its end record, so a later restart knows it too.
  bool faults_before_restart_unknown = false;
  /// The job file's faults (by pointer) that fired before the restart it was restored from.
  std::set<std::string> fired_before_restore;
  std::map<std::string, DaemonId> affinity;
  std::vector<FaultSpec> faults;  // the job file's, then whatever `copse chaos` adds
  std::vector<char> fault_fired;
  Json faults_log = Json::array();  // every fault injected so far, for the summary
  Json recoveries = Json::array();
  struct LogLine {
    VertexId vertex;  // invalid: the job's own line
    std::string text;
  };
  std::vector<LogLine> log;            // at most kMaxLogLines
  std::vector<uint32_t> gang_version;  // per gang: the version of its current attempt
  /// Per gang, after a search found no placement: until capacity frees or a pin goes, a new
  /// search could only fail again; and searches of a big gang are spaced by their cost.
  struct GangWait {
    uint64_t epoch = 0;  // capacity_epoch_ + 1 of the failed search (0: none)
    TimePoint retry_after{};
  };
  std::vector<GangWait> gang_waits;
  std::optional<GangNeeds> gang_needs;  // what gangs need where their affinity groups are pinned
  std::set<std::string> pin_waits;      // affinity groups logged as waiting for a daemon to fit
  /// One span per attempt, for `copse trace`: vertex, version, daemon, start/end ms, outcome.
  struct Span {
    uint32_t vertex, version;
    DaemonId daemon;
    double start_ms, end_ms = -1;
    std::string outcome;
    size_t log_lines_before_end = 0;  // where its end falls in `log` (Logs() merges the two)
  };
  std::vector<Span> spans;
  std::map<std::pair<uint32_t, uint32_t>, size_t> open_spans;  // (vertex, version) -> index
  std::vector<std::vector<double>> stage_seconds;              // per stage: wall time of completed attempts
  std::vector<char> declared;                                  // per vertex: a job output reads it, so it is never released
  std::vector<uint32_t> declared_vertices;                     // those vertices, once each
  std::vector<char> settled;                                   // per vertex: no fault can make it run again (Settle)
  bool retains = false;                                        // a stage retains outputs: only then is settling worth its walk
  bool mirrors = false;                                        // it has mirrored channels (scheduler_mirrors.cc)
  size_t mirrors_used = 0;                                     // outputs its mirrors served after their daemon was lost
  std::set<uint32_t> guarding;                                 // released vertices whose copies MirrorGuards keeps
  uint64_t local_input_bytes = 0, remote_input_bytes = 0;      // what placement achieved
  /// The newest progress figures a program reported (by "step" when they carry one), and when
  /// the first and newest "images" (or "tokens") counts arrived, for a live images/s (tokens/s).
  Json progress;
  /// Its results, reported once as final figures (a training job's test accuracy): shown in
  /// its progress whatever step comes after.
  Json results = Json::object();
  double first_images = -1, first_images_ms = 0, last_images = 0, last_images_ms = 0;
  /// The figures reported over time (ProgressSeries): every `progress_stride`-th report,
  /// the stride doubling (and every other point going) whenever kMaxProgressPoints are kept.
  std::vector<Json> progress_points;
  uint64_t progress_reports = 0, progress_stride = 1;
  std::string rate_unit = "images";  // what first_/last_images count: "images", or "tokens" (text)
  /// Its event lines, attempts (trace) and progress series are here: false for a job restored
  /// from the journal until RestoreHistory puts its history back. A finished job's stays in
  /// its history files, read when asked for (HistoryInMemory).
  bool history_in_memory = true;

  const JobGraph& g() const { return *graph; }

  /// The pointers (`/faults/0`) of the job file's faults that have fired, `chaos` among them
  /// when copse chaos injected some.
  std::set<std::string> FiredFaultSources() const {
    std::set<std::string> fired = fired_before_restore;
    for (const Json& f : faults_log) {
      if (auto source = f.find("source"); source != f.end() && source->is_string()) fired.insert(source->get<std::string>());
    }
    return fired;
  }
};

}  // namespace copse::jm
