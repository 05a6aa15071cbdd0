#pragma once
// Scheduler: the job manager's core state machine. Single-threaded and free of network I/O
// and of the host's clocks and files: it reads the injected Clock (monotonic and wall), and
// what it writes goes through sinks (daemons, journal, history, storage). The server
// (jm_server.h) feeds it events (daemon registered/lost, job submitted/cancelled, attempts
// finished, clock ticks) and it emits messages to daemons through a DaemonSink. Tests drive
// it directly with a fake sink and a ManualClock.
//
// Per vertex: waiting -> ready -> running -> completed, or back to waiting/ready when an
// attempt fails (retried with a new version up to max_attempts), when its daemon is lost, or
// when an output it produced is lost while still needed (lineage: producers are re-run,
// recursively upstream, as far as inputs are gone). A job fails once a vertex exhausts its
// attempts, or once one was running on its daemon when that daemon was lost, no fault injected,
// max_daemon_losses times; it completes when every vertex completed.
//
// Messages to one daemon are batched: Flush() sends at most one "run" message per daemon with
// every task placed since the previous flush.
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <set>
#include <tuple>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/clock.h"
#include "common/ids.h"
#include "common/json_util.h"
#include "common/metrics.h"
#include "jobmanager/gang_needs.h"
#include "jobmanager/gang_placement.h"
#include "jobmanager/job_graph.h"
#include "jobmanager/job_parser.h"
#include "jobmanager/journal.h"
#include "jobmanager/placement.h"
#include "jobmanager/trace_export.h"
#include "protocol/checks.h"
#include "protocol/daemon.pb.h"
#include "protocol/journal.pb.h"
#include "protocol/keys.h"

namespace copse::jm {

enum class VertexState : uint8_t { kWaiting, kReady, kRunning, kCompleted };
enum class JobState : uint8_t { kRunning, kCompleted, kFailed, kCancelled };
/// Why an attempt failed; decides whether it is charged and where it runs next (the protocol's).
using protocol::FailureClass;
using protocol::FailureClassName;

std::string_view VertexStateName(VertexState s);
std::string_view JobStateName(JobState s);

struct DaemonSpec {
  std::string name;
  double cpus = 1;
  int gpus = 0;
  int64_t memory_mb = 0;
  int64_t gpu_memory_mb = 0;                  // of each GPU (the smallest); 0: not reported
  std::map<std::string, std::string> labels;  // host=…, rack=…
  std::string data_host;                      // where its outputs are served
  uint16_t data_port = 0;
  protocol::StreamEndpoints stream_endpoints;  // where live channels reach it
  std::string control = "tcp";                 // its job manager connection: "tcp" or "local socket"
};

/// Where the scheduler's messages to daemons go.
class DaemonSink {
 public:
  virtual ~DaemonSink() = default;
  virtual void SendToDaemon(DaemonId daemon, const protocol::JmToDaemon& message) = 0;
};

/// One ended attempt as a job's history keeps it (job_history.h): enough to draw its trace and
/// its event log without the job's graph.
struct HistorySpan {
  uint32_t vertex = 0, version = 0;
  double start_ms = 0, end_ms = 0;  // in the job's elapsed time
  std::string outcome, daemon, vertex_name, stage;
  size_t log_lines_before_end = 0;  // where its end falls among the job's event lines
};

/// Where a job's history goes as it runs (job_history.h): its event lines, its ended
/// attempts, the points of its progress series (ProgressSeries), and its final status when it
/// finishes.
class HistorySink {
 public:
  virtual ~HistorySink() = default;
  virtual void JobLine(JobId job, VertexId vertex, const std::string& line) = 0;
  virtual void JobSpan(JobId job, const HistorySpan& span) = 0;
  virtual void JobProgress(JobId /*job*/, const Json& /*point*/) {}
  virtual void JobFinished(JobId job, const Json& summary) = 0;
};

/// The file work the scheduler asks for and never does itself (durable_copies.h does it).
class StorageSink {
 public:
  virtual ~StorageSink() = default;
  /// Job `job`'s durable channel copies, all under `dir`, are needed no more: remove them, and
  /// their parent directory once it is empty.
  virtual void RemoveDurableCopies(JobId job, const std::string& dir) = 0;
};

/// Result of one attempt, as a daemon reports it.
struct AttemptReport {
  JobId job;
  VertexId vertex;
  uint32_t version = 0;
  bool ok = false;
  FailureClass failure = protocol::FAILURE_PROGRAM_ERROR;
  std::string error;
  int lost_input_port = -1;               // with kInputLost: which input could not be read
  bool lost_input_unreachable = false;    // ... because its daemon could not be reached (not damaged or missing)
  uint32_t lost_input_version = 0;        // ... the producer's version it read (0: not said)
  std::vector<uint64_t> output_bytes;     // per output port
  std::vector<uint64_t> output_messages;  // per output port; 0 lets consumers skip the fetch
  double duration_ms = 0;
  Json progress;  // the program's progress figures (an object), or null
  /// A program error the program says repeats on every attempt (InvalidArgument, NotFound:
  /// vertex/program.h): the job fails without retrying it.
  bool deterministic = false;

  /// A daemon's report (decoded and checked by the codec) as the scheduler reads it.
  static AttemptReport From(const protocol::AttemptReport& a);
};

struct SchedulerOptions {
  /// How long finished jobs stay queryable before they (and their kept outputs) are forgotten.
  Duration finished_job_ttl = std::chrono::hours(1);
  /// Placement policy by name ("locality" or "load") and how long a ready vertex may wait for
  /// a slot on the daemon that holds its inputs before it runs elsewhere.
  std::string placement = "locality";
  Duration locality_wait = std::chrono::milliseconds(100);
  /// A running attempt gets a duplicate on another daemon once it has run `straggler_factor`
  /// times its stage's median completed time and at least `straggler_min`, and at least
  /// `straggler_fraction` of the stage completed. 0 turns duplicates off.
  double straggler_factor = 4.0;
  Duration straggler_min = std::chrono::seconds(2);
  double straggler_fraction = 0.5;
  /// Chained dispatch: a vertex whose unfinished predecessors are all running (started, or
  /// chained themselves behind started ones: at most two tasks deep) is sent at once to
  /// the daemon its affinity pins it to (unpinned: the predecessors' one daemon, when all it
  /// reads is there), to start the moment they have succeeded, without a report -> job manager
  /// -> run round trip (a pipeline stage's chain, a data-parallel step). Predecessors on that
  /// daemon are waited for there, and it may take their slots; at most one on another daemon
  /// (one it reads data from: the previous pipeline stage) is seen succeeding by its outputs
  /// arriving, fetched as they are written (vertex/input_prefetcher.h).
  bool chain_dispatch = true;
  /// After a restart, how long daemons named in the journal have to come back before their
  /// outputs count as lost.
  Duration recovery_grace = std::chrono::seconds(3);
  /// How long a lost daemon's file outputs are held for it to come back under its name (a
  /// service manager restarting it on the same work dir, whose store keeps them) before they
  /// count as lost; consumers that need them wait meanwhile. Its memory outputs and running
  /// attempts are lost at once. Zero: file outputs are lost at once too. A file output a
  /// consumer could not connect to on a daemon that still looks alive is held for as long,
  /// once per version of it (the daemon's loss is most likely on its way).
  Duration daemon_return_grace = std::chrono::seconds(1);
};

/// What a (re-)registering daemon still holds: (job, vertex, version, port) of each output.
using OutputInventory = std::set<std::tuple<uint64_t, uint32_t, uint32_t, uint32_t>>;

class Scheduler {
 public:
  Scheduler(DaemonSink& sink, const Clock& clock, SchedulerOptions options = {});
  ~Scheduler();

  // ---- daemons -------------------------------------------------------------------------------
  /// A daemon joined; AlreadyExists when a live daemon has the same name. A daemon awaited
  /// under that name (named by the journal after a restart, or lost within its return grace)
  /// gets its old id back, and completed vertices whose outputs it no longer holds (per
  /// `inventory`) run again. Listed outputs no job needs are released before its first task.
  Result<DaemonId> AddDaemon(DaemonSpec spec, const OutputInventory& inventory = {});
  /// A daemon is gone (connection dropped or heartbeats missed): its running attempts fail
  /// (not charged), and the outputs stored on it are lost and re-created if still needed; its
  /// file outputs only once it has not come back within `daemon_return_grace`. A loss no
  /// injected fault explains counts against each running attempt's stage `max_daemon_losses`;
  /// the job fails when one reaches it.
  void DaemonLost(DaemonId daemon, const std::string& why);
  /// How long after a kill or cut is sent a loss of that daemon counts as its doing.
  static constexpr Duration kInjectedLossWindow = std::chrono::seconds(10);

  // ---- recovery -------------------------------------------------------------------------------
  /// Journal records go here from now on (null: none).
  void set_journal(JournalSink* journal) { journal_ = journal; }
  /// Rebuilds jobs from a journal replay: accepted jobs, completed vertices (their outputs held
  /// by daemons known by name until they re-register), regenerations and finished jobs.
  /// Returns how many jobs were restored. Records that are malformed, no longer load or
  /// contradict the ones before them (a second record of one job, an end in no known state, a
  /// completion of a vertex the job lacks) are skipped, each with a log line and a line in
  /// `skipped` (when given), so that the job manager keeps the journal as it was for a person.
  size_t Restore(const std::vector<protocol::JournalRecord>& records, const ProgramCatalog& catalog,
                 std::vector<std::string>* skipped = nullptr);
  /// Who removes durable channel copies (null: nobody; they stay on disk).
  void set_storage(StorageSink* storage) { storage_ = storage; }
  /// Where jobs' histories go from now on (null: nowhere).
  void set_history(HistorySink* history) { history_ = history; }
  /// Puts back a restored job's event lines and ended attempts from before the restart (its
  /// history), ahead of what the restore logged; attempts still running then are lost.
  /// `progress`: the points of its progress series from before the restart (its loss curve).
  void RestoreHistory(JobId job, std::vector<std::pair<VertexId, std::string>> lines, std::vector<HistorySpan> spans,
                      std::vector<Json> progress = {});
  /// A finished job's final status as its history keeps it (nothing for a running job).
  std::optional<Json> FinalSummary(JobId job) const;
  /// The running and remembered jobs' ids.
  std::vector<uint64_t> JobIds() const;
  /// Starts the restored daemons' `recovery_grace` again from now. The job manager calls it
  /// once it listens, so that a slow start (a long journal's replay and compaction) does not
  /// spend the time the daemons have to reach it.
  void StartRecoveryGrace();
  /// Job ids run below this (protocol/checks.h: what a journal may name).
  static constexpr uint64_t kMaxJobId = protocol::kLargestJobId + 1;
  /// Records from which Restore rebuilds what this scheduler knows now: per remembered job its
  /// submission, its completed vertices and, once finished, its end; then the newest job id
  /// handed out, so a restarted job manager never hands one out twice. What the journal is
  /// compacted to (Journal::Rewrite).
  std::vector<protocol::JournalRecord> Snapshot() const;
  /// How many records Snapshot() would return, without building them.
  size_t SnapshotRecords() const;
  /// The journal record saying how many restarts this journal has seen (Restore counts one
  /// more): whoever owns the journal appends it after Restore, before any new attempt's record,
  /// and Snapshot carries it.
  protocol::JournalRecord RestartRecord() const;

  // ---- jobs ----------------------------------------------------------------------------------
  /// Accepts a validated graph. `job_dir` is where relative paths in params resolve.
  JobId Submit(std::shared_ptr<const JobGraph> graph, std::string job_dir);
  /// Why `graph` cannot run on this cluster, for refusing it before any vertex runs ("" when it
  /// may): a stage whose vertices need GPUs of more memory (resources.gpu_memory_mb) than every
  /// live daemon with that many GPUs reports. A cluster with no such daemon, or one that does not
  /// know its GPUs' memory, may still hold it: the job waits, saying why.
  std::string WhyItCannotFit(const JobGraph& graph) const;
  /// Ids up to `id` are taken (a job's history names it, though the journal may not): Submit
  /// hands out ids above it.
  void ReserveJobIds(uint64_t id) {
    if (id < kMaxJobId) next_job_ = std::max(next_job_, id + 1);
  }
  /// Whether Submit may hand out another id below kMaxJobId (only a damaged journal uses them up).
  bool JobIdsLeft() const { return next_job_ < kMaxJobId; }
  Status Cancel(JobId job);
  void OnAttemptFinished(const AttemptReport& report);
  /// `copse chaos`: {"action": "kill"|"cut", "daemon", "ms"} acts on a daemon now;
  /// {"action": "fail"|"delay"|"corrupt"|"drop", "job", "vertex", "attempts", "ms"} arms a fault
  /// like the job file's; {"action": "random", "seed", "interval_ms", "duration_ms", "kinds",
  /// "cut_ms"} injects seeded random faults every interval; {"action": "stop"} ends that.
  /// Every fault shows in the running jobs' summaries.
  Result<Json> Chaos(const Json& request);
  /// Timeouts, time-triggered faults, forgetting old jobs; releases the outputs held since the
  /// last tick at the next Flush. Call periodically.
  void Tick();
  /// Sends every message placed since the last flush, except releases of small consumed
  /// outputs: those wait for the next Tick, until a daemon's queued releases free
  /// kReleaseBatchBytes or name kReleaseBatchKeys outputs. Nothing waits on a release; sending
  /// one per completion cost the daemon a wakeup and the job manager a send per vertex. Large
  /// outputs still go at once: memory held for a tick is memory the allocator must fault in
  /// afresh (DP-2 ran 0.82x when its 3 MiB gradients waited).
  void Flush();

  // ---- queries -------------------------------------------------------------------------------
  bool HasJob(JobId job) const;
  /// Whether `job` is here with its history: its event lines, attempts and progress series
  /// (what Logs, Trace, Attempt and ProgressSeries answer from). False for a finished job
  /// restored without RestoreHistory: the job manager leaves those in the history files, to
  /// be read when asked for, so that a restart does not read back every finished job's life.
  bool HistoryInMemory(JobId job) const;
  /// Whether `version` of v was sent to a daemon (it is at most the newest sent).
  bool HasAttempt(JobId job, VertexId v, uint32_t version) const;
  /// Attempt `attempt` of `vertex` (0: its newest), for `copse logs JOB VERTEX`: {"vertex": its
  /// id, "name", "attempt", "running", "daemon" (once placed), "outcome" (once ended)}; NotFound
  /// naming the job, vertex or attempt that is not there.
  Result<Json> Attempt(JobId job, const std::string& vertex, uint32_t attempt) const;
  std::optional<JobState> StateOf(JobId job) const;
  /// Full status of one job (stages with progress, failure, waiting reasons, faults, recoveries).
  Json JobStatus(JobId job) const;
  /// One line per job.
  Json JobsTable() const;
  Json DaemonsTable() const;
  /// Event log of a job (state transitions, errors), optionally of one vertex; null when the
  /// job, or the vertex named, does not exist.
  Json Logs(JobId job, const std::string& vertex) const;
  /// NCCL bootstrap: rank 0's daemon created `id` for `group`; the other members' daemons get it.
  void RelayNcclId(const std::string& group, const std::string& id, DaemonId from);
  /// Daemon `from` finished the copy a Mirror asked of it (scheduler_mirrors.cc).
  void OnMirrored(const protocol::Mirrored& done, DaemonId from);
  /// What the job's trace shows (trace_export.h formats it): a copy of its attempts' spans,
  /// taken in tens of milliseconds for a million, so that formatting happens off this thread.
  /// `max_spans`: only the newest that many (the dashboard's timeline of a big job).
  Result<TraceSnapshot> Trace(JobId job, size_t max_spans = SIZE_MAX) const;
  /// Where each declared output of a completed job is: [{path, host, port, key}].
  Result<Json> OutputLocations(JobId job) const;
  /// Which vertices VertexPage lists: those of `stage` (every stage when empty), in `state`
  /// (any when empty; a VertexStateName), from the `offset`-th match, at most `limit`.
  struct VertexFilter {
    std::string stage, state;
    size_t offset = 0, limit = 100;
  };
  /// A page of a job's vertices, for the dashboard (never every vertex of a big job at once):
  /// {"total": matches, "offset", "vertices": [{name, stage, replica, state, version, daemon,
  /// failed_attempts, reason (why a ready or waiting one has not started)}]}; null: no such job.
  Json VertexPage(JobId job, const VertexFilter& filter) const;
  /// The progress figures the job's programs reported over time (a training job's loss curve):
  /// [{"elapsed_s", and each numeric figure}], at most kMaxProgressPoints of them spread over
  /// the whole run; null: no such job.
  Json ProgressSeries(JobId job) const;
  static constexpr size_t kMaxProgressPoints = 2048;
  /// The scheduler's counters and gauges in the Prometheus text format (common/metrics.h).
  void WriteMetrics(metrics::MetricsWriter& out) const;

 private:
  struct Job;
  struct Daemon;
  struct Run;

  Job& NewJob(JobId id, std::shared_ptr<const JobGraph> graph, std::string job_dir);
  static std::vector<uint32_t> Priorities(const JobGraph& g);
  DaemonId PlaceholderDaemon(const std::string& name);
  static protocol::JournalRecord JobRecord(const Job& job);
  protocol::JournalRecord DoneRecord(const Job& job, VertexId v) const;
  static protocol::JournalRecord RegenRecord(const Job& job, VertexId v);
  static protocol::JournalRecord EndRecord(const Job& job);
  void Journal(const protocol::JournalRecord& record) {
    if (journal_) journal_->Record(record);
  }
  /// A finished job's final status, as its history keeps it.
  Json Summary(const Job& job) const;
  Job* FindJob(JobId id);
  const Job* FindJob(JobId id) const;
  void MakeReady(Job& job, VertexId v);
  void Schedule();
  bool TryPlace(Job& job, VertexId v);
  /// Whether any live daemon has a free cpu or gpu (else placing anything is pointless).
  bool AnySlotFree() const;
  /// Ranks and peer ranks for the nccl channels of a gang member's task.
  void AddNcclInfo(Job& job, VertexId v, uint32_t version, protocol::Task& task);
  /// A daemon's label `key` ("" when it has none), valid while its spec is.
  static std::string_view LabelOf(const Daemon& d, const std::string& key);
  /// Places every member of a gang at once, or none.
  bool TryPlaceGang(Job& job, GangId gang);
  /// Where the gang's members would go on the live daemons, with what is free on them now, or
  /// (`idle`) with all they have: a gang that fits no idle daemon set waits for the cluster
  /// to change, not for slots to free.
  GangPlacement PlaceGangOn(const Job& job, GangId gang, bool idle) const;
  /// Why ready vertex v has not been placed, for the job's status; a gang's reason is worked
  /// out once per call, kept in `gang_reasons` by gang.
  std::string WhyNotPlaced(const Job& job, VertexId v, std::map<uint32_t, std::string>& gang_reasons) const;
  /// Whether `stage`'s affinity group, pinned to `d` beside `pins`, leaves room there for the
  /// gangs it joins (always, for a stage without one): GangNeeds::PinFits.
  bool PinFits(const Job& job, const StageSpec& stage, const Daemon& d, const std::map<std::string, DaemonId>& pins) const;
  /// Cancels a gang's running members and sends every member back to waiting.
  void ResetGang(Job& job, GangId gang, VertexId cause, const std::string& why);
  /// Sends attempt max(version, dup_version)+1 of v to d; a duplicate runs beside the current one.
  /// With `after` (chained dispatch), d starts it once those vertices' current attempts have all
  /// succeeded (each on d, or — at most one — elsewhere, seen by its outputs arriving).
  void Dispatch(Job& job, VertexId v, Daemon& d, bool duplicate, const std::vector<VertexId>& after = {});
  /// Chained dispatch of waiting vertex u (see SchedulerOptions::chain_dispatch), if it applies.
  void TryChain(Job& job, VertexId u);
  /// Chains the waiting successors of v whose unfinished predecessors all run.
  void ChainSuccessors(Job& job, VertexId v);
  /// After a predecessor of chained task u ended: chains what waits on u, or on the tasks
  /// chained after u, now that they wait one task less deep.
  void ChainBehind(Job& job, VertexId u);
  /// How many held tasks deep v waits: 0 once it has started (or when not chained).
  int ChainDepth(const Job& job, VertexId v) const;
  /// A chained attempt that never started (its predecessor failed): back to waiting, neither
  /// charged nor counted as a recovery; chained again at once when `rechain` and it applies.
  void Unchain(Job& job, VertexId u, bool rechain, std::string_view why = "the vertex it was chained after did not succeed");
  /// The attempts chained after v's current one on daemons other than v's: v will not deliver
  /// (it failed, or a duplicate won), and they learn it from no one else. Cancelled there and
  /// unchained.
  void WithdrawRemoteChains(Job& job, VertexId v);
  /// Stragglers: running attempts far slower than their completed stage peers get a duplicate.
  void LaunchDuplicates(Job& job);
  /// A report from a vertex with two attempts running; true when it needs nothing more.
  bool ResolveDuplicate(Job& job, VertexId v, const AttemptReport& report);
  void FreeSlot(Job& job, VertexId v, DaemonId daemon);
  /// Ends the trace span of an attempt; `ran_ms` >= 0 is how long its daemon says it ran.
  void CloseSpan(Job& job, VertexId v, uint32_t version, const std::string& outcome, double ran_ms = -1);
  void Complete(Job& job, VertexId v, const AttemptReport& report);
  /// Keeps the newest progress figures a completed attempt reported (see VertexContext::progress).
  void NoteProgress(Job& job, const Json& figures);
  /// `deterministic`: the program said the error repeats on every attempt, so a charged failure
  /// fails the job at once instead of retrying up to max_attempts.
  void Fail(Job& job, VertexId v, FailureClass cls, const std::string& error, bool charge, bool deterministic = false);
  void FinishJob(Job& job, JobState state, const std::string& reason);
  /// Adds one entry to the job's recoveries: what re-runs and why.
  void RecordRecovery(Job& job, VertexId v, uint32_t version, std::string_view reason, const std::string& detail, bool charged);
  /// Frees a running vertex's slots (its duplicate's too) and closes its open trace spans with
  /// `outcome` (spans a report closed already keep theirs).
  void ReleaseSlots(Job& job, VertexId v, std::string_view outcome = "stopped");
  /// Marks v's outputs lost and schedules it again; consumers that were waiting on nothing
  /// else go back to waiting.
  void Regenerate(Job& job, VertexId v, const std::string& why);
  void RecomputePending(Job& job);
  /// Garbage collection: outputs of v's producers whose consumers have all completed are
  /// dropped from their daemons (never a declared job output). Should one be needed again,
  /// RecomputePending re-runs its producer.
  void ReleaseConsumedInputs(Job& job, VertexId v);
  /// Settling: a completed vertex is settled once no fault can make it run again, because each
  /// of its consumers reads a durable copy of its output or is settled itself (ordering edges
  /// carry nothing); lineage then never needs its outputs again, so its retained ports
  /// (job_spec.h `retain`, kept for recovery) are dropped too. Walks from v up through its
  /// producers. Without durable channels a vertex settles only once everything downstream of
  /// it completed, down to outputs no job output reads; with a checkpoint every K steps a
  /// pipeline's retained cross-stage tensors are held about K steps instead of the whole job.
  /// Only walked for jobs that retain something.
  void Settle(Job& job, VertexId v);
  /// Whether output `port` of completed vertex v (run r) was dropped from its daemon: a
  /// retained port once v settled, any other once its consumers completed.
  static bool OutputReleased(const JobGraph& g, VertexId v, const Run& r, int port);
  /// Adds output `port` of v's current version to its daemon's next "release" message (and to
  /// its mirror's, for a mirrored port).
  void QueueRelease(Job& job, VertexId v, size_t port);
  /// The same for one daemon: `d`'s copy of that output.
  void QueueReleaseOn(DaemonId d, Job& job, VertexId v, size_t port);

  // Mirrored channels (job_spec.h kMirrored; scheduler_mirrors.cc). A completed vertex whose
  // mirrored port holds data is copied into another live daemon's memory (StartMirror); the
  // copy is whole once that daemon says so (OnMirrored). When the producer's daemon is lost,
  // a whole copy becomes where the output is (PromoteMirror) instead of the producer re-running.
  // A copy dies with its daemon, is dropped with the output (QueueRelease, the job's gc), and
  // when the producer runs again (DropMirror).
  /// v's mirrored output port, if it has one.
  static std::optional<size_t> MirroredPort(const JobGraph& g, VertexId v);
  void StartMirror(Job& job, VertexId v);
  /// Whether v's outputs now live in its mirror (a whole copy on a live daemon that holds every
  /// port still read; released ones count as read again), `why` the primary is gone (for the
  /// job's log).
  bool PromoteMirror(Job& job, VertexId v, const std::string& why);
  /// Whether v's copy must outlive v's release: a vertex downstream of v, up to the nearest
  /// mirrored ones, has not completed, or one of those mirrored ones has no whole copy yet —
  /// recovery might then have to run from v's copy.
  bool MirrorGuards(const Job& job, VertexId v) const;
  /// The release of v's mirrored port: the primary (once its copy is made: a fetch needs it),
  /// and the copy unless it still guards (then kept in job.guarding).
  void ReleaseMirrored(Job& job, VertexId v, size_t port);
  /// Drops the kept copies that guard nothing more (each Tick, and when a copy is whole).
  void ReviewGuards(Job& job);
  /// Forgets v's copy, releasing it where its daemon lives.
  void DropMirror(Job& job, VertexId v);
  /// Forgets every copy daemon d held (it was lost).
  void ForgetMirrorsOn(DaemonId d);
  /// Whether v's outputs are still needed: a consumer has not completed, or a job output reads
  /// it. `count_durable` false: consumers of durable ports do not count (their copies serve).
  bool OutputNeeded(const Job& job, VertexId v, bool count_durable = true) const;
  /// Whether v reads a stored, non-empty output held for its daemon (awaited, or a file output
  /// found unreachable while its daemon still looked alive; no durable copy): it is neither
  /// placed nor chained until that daemon is back or given up, or that hold is over.
  bool ReadsAHeldOutput(const Job& job, VertexId v) const;
  /// Whether every output port of v is stored as a file (which outlives its daemon's process).
  static bool OutputsInFiles(const JobGraph& g, VertexId v);
  /// A daemon registered again under its name after an earlier registration of it was given up
  /// (its return grace over, or not back within the recovery grace after a restart): the
  /// outputs it lists of completed vertices still placed on that earlier registration — a
  /// finished job's declared outputs, a running job's outputs not re-run meanwhile — are its
  /// again, instead of being released as stale. Only whole outputs (every port still read).
  void AdoptOutputs(const Daemon& d, const OutputInventory& inventory);
  /// Whether `inventory` lists every port of completed vertex v that the job manager reads from
  /// its daemon: a running job's unreleased ports, a finished job's declared ones.
  bool HoldsWhatIsRead(const Job& job, VertexId v, const OutputInventory& inventory) const;
  /// Queues, to go before d's first task, the release of the outputs in `inventory` that no job
  /// reads from d (jobs forgotten, vertices re-run elsewhere or released meanwhile).
  void ReleaseStale(const Daemon& d, const OutputInventory& inventory);
  /// The durable copy of output `port` of version `version` of v.
  std::string DurablePath(const Job& job, VertexId v, uint32_t version, int port) const;
  /// Deletes the job's durable directory (and the durable root when it is left empty).
  void RemoveDurableCopies(const Job& job);
  /// A kill or cut is being sent to d: its loss within the next moments is the fault's doing
  /// and not counted against the attempts running there.
  void ExpectInjectedLoss(Daemon& d);
  void CheckFaults(Job& job);
  /// The job file's faults armed for this attempt of v (a failure, a delay), set on its task.
  void ArmInjectedFaults(Job& job, VertexId v, uint32_t version, protocol::Task& task);
  void RandomChaosStep();
  void Log(Job& job, VertexId v, std::string text);
  double ElapsedMs(const Job& job) const;

  DaemonSink& sink_;
  const Clock& clock_;
  SchedulerOptions options_;
  std::vector<std::unique_ptr<Daemon>> daemons_;
  std::map<JobId, std::unique_ptr<Job>> jobs_;
  uint64_t next_job_ = 1;
  /// How many times jobs were restored from this journal; restart R hands out attempt versions
  /// from R x kVersionsPerRestart on (uint32 versions: at most kMaxRestarts restarts apart).
  uint32_t restarts_ = 0;
  static constexpr uint32_t kVersionsPerRestart = 1'000'000;
  static constexpr uint32_t kMaxRestarts = 4000;
  /// Counts every event that can let a gang fit where it did not: a slot freed, a daemon
  /// joined or back, a daemon lost (its affinity pins go with it).
  uint64_t capacity_epoch_ = 0;
  std::unique_ptr<PlacementPolicy> policy_;
  JournalSink* journal_ = nullptr;
  HistorySink* history_ = nullptr;
  StorageSink* storage_ = nullptr;
  struct RandomChaos {
    std::mt19937_64 rng;
    Duration interval{};
    TimePoint until{}, next{};
    std::vector<std::string> kinds;
    int64_t cut_ms = 1000;
  };
  std::optional<RandomChaos> chaos_;
  /// What /metrics counts since this scheduler started (WriteMetrics adds the gauges).
  struct Counters {
    uint64_t jobs_submitted = 0;
    std::map<std::string, uint64_t> jobs_finished;  // by final state
    uint64_t attempts_dispatched = 0, duplicates_dispatched = 0, attempts_completed = 0;
    std::map<std::string, uint64_t> attempts_failed;  // by failure class
    std::map<std::string, uint64_t> recoveries;       // by reason
    uint64_t input_bytes_local = 0, input_bytes_remote = 0;
    /// Seconds from ready to dispatched, of the vertices that were ready (those sent ahead to
    /// wait on a daemon for their predecessors are dispatched before they are ready: not counted).
    /// 10 µs to 168 s.
    metrics::Histogram scheduling_latency_s{metrics::Histogram::Exponential(1e-5, 4, 13)};
  };
  Counters counters_;
  std::map<std::string, std::set<DaemonId>> nccl_groups_;  // group -> daemons awaiting its id
  std::map<DaemonId, protocol::JmToDaemon> outbox_;        // per daemon: a Run of the tasks placed since the last flush
  /// Per (re-)registered daemon: {"op":"release"} of the outputs it listed that no job needs,
  /// sent before any task (a new attempt could otherwise meet a stale output of its key).
  std::map<DaemonId, protocol::JmToDaemon> stale_outbox_;
  /// Outputs moved to their mirrors so far (PromoteMirror): an attempt sent before a move read
  /// the old place.
  uint64_t mirror_moves_ = 0;
  struct PendingReleases {
    protocol::JmToDaemon msg;  // a Release
    uint64_t bytes = 0;        // what dropping them frees
  };
  std::map<DaemonId, PendingReleases> release_outbox_;  // per daemon
  bool releases_due_ = false;                           // a Tick since the last releases went out
  static constexpr size_t kReleaseBatchKeys = 256;
  static constexpr uint64_t kReleaseBatchBytes = 1 << 20;
};

}  // namespace copse::jm
