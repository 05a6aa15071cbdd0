#include "jobmanager/scheduler.h"

#include <algorithm>
#include <filesystem>
#include <limits>
#include <numeric>
#include <queue>
#include <stdexcept>
#include <string_view>

#include <fmt/format.h>

#include "common/logging.h"
#include "common/text_util.h"
#include "jobmanager/job_loader.h"

namespace copse::jm {
namespace {

constexpr size_t kMaxLogLines = 20000;
constexpr size_t kMaxSpans = 1'000'000;
const std::string kHostLabel = "host";
const std::string kRackLabel = "rack";
constexpr size_t kMaxBlockedScan = 64;  // ready vertices tried per job per pass when slots are short
constexpr uint32_t kMaxChainedAfter = 8;  // unfinished input edges a vertex may be chained after
// How deep chained tasks may wait behind a started one: a task chained after one that is itself
// still held waits at depth 2. Two keeps the next task on its daemon one whole task ahead of
// the job manager's round trip, without chaining a whole schedule ahead.
constexpr int kMaxChainDepth = 2;
// A consumer that cannot read one of its inputs this many times before it completes (the
// producer re-run each time, so the loss is persistent: an unreadable disk, a writer that fails
// verification) fails the job instead of regenerating forever, like Spark's
// stage.maxConsecutiveAttempts.
constexpr int kMaxInputLosses = 8;

/// How an output port is stored: as its first channel's kind; a port no channel reads (a
/// declared job output) is a file.
ChannelKind PortKind(const JobGraph& g, const std::vector<ChannelId>& port) {
  return port.empty() ? ChannelKind::kFile : g.channel(port.front()).kind;
}

std::shared_ptr<spdlog::logger> SchedLog() {
  static auto log = Logger("sched");
  return log;
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

std::string NameList(const JobGraph& g, const std::vector<VertexId>& vertices) {
  std::string out;
  for (VertexId v : vertices) out += (out.empty() ? "" : ", ") + g.vertex(v).name;
  return out;
}

}  // namespace

std::string_view VertexStateName(VertexState s) {
  switch (s) {
    case VertexState::kWaiting: return "waiting";
    case VertexState::kReady: return "ready";
    case VertexState::kRunning: return "running";
    case VertexState::kCompleted: return "completed";
  }
  return "?";
}

std::string_view JobStateName(JobState s) {
  switch (s) {
    case JobState::kRunning: return "running";
    case JobState::kCompleted: return "completed";
    case JobState::kFailed: return "failed";
    case JobState::kCancelled: return "cancelled";
  }
  return "?";
}

std::string_view FailureClassName(FailureClass c) {
  switch (c) {
    case FailureClass::kProgramError: return "program_error";
    case FailureClass::kDaemonLost: return "daemon_lost";
    case FailureClass::kInputLost: return "input_lost";
    case FailureClass::kTimeout: return "timeout";
    case FailureClass::kCancelled: return "cancelled";
  }
  return "?";
}

std::optional<FailureClass> ParseFailureClass(std::string_view name) {
  for (auto c : {FailureClass::kProgramError, FailureClass::kDaemonLost, FailureClass::kInputLost,
                 FailureClass::kTimeout, FailureClass::kCancelled}) {
    if (FailureClassName(c) == name) return c;
  }
  return std::nullopt;
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
  TimePoint returned_at{};  // when it last came back awaited (a new process, maybe at the same address)
  // A kill or cut was injected (chaos, a job's fault): a loss until then is explained by it and
  // not counted against the attempts running there (max_daemon_losses).
  TimePoint loss_injected_until{};
  double free_cpus = 0;
  int free_gpus = 0;
  size_t running = 0;
  Json Address() const { return {{"host", spec.data_host}, {"port", spec.data_port}}; }
};

struct Scheduler::Run {
  VertexState state = VertexState::kWaiting;
  uint32_t version = 0;  // of the current or last attempt; 0 before the first
  uint32_t dup_version = 0;  // a straggler's duplicate attempt running beside it (0: none)
  DaemonId dup_daemon;
  TimePoint dup_started{};
  int charged = 0;       // failed attempts that count against max_attempts
  int daemon_losses = 0;  // its daemon lost, no fault injected, while it ran (max_daemon_losses)
  // (input port, input_lost failures) since it last completed, per input that was lost (not charged).
  std::vector<std::pair<int, int>> inputs_lost;
  uint32_t pending = 0;  // predecessors not completed
  DaemonId daemon;       // running there, or holding the outputs
  std::vector<uint64_t> output_bytes;
  std::vector<uint64_t> output_messages;
  bool released = false;  // outputs garbage-collected (retained ports excepted): every consumer had completed
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
};

struct Scheduler::Job {
  JobId id;
  std::shared_ptr<const JobGraph> graph;
  std::string job_dir;
  /// Where this job's `durable` channels keep their copies (empty when it has none).
  std::string durable_dir;
  JobState state = JobState::kRunning;
  std::string failure;
  std::vector<Run> runs;
  /// Ready vertices, smallest priority first (see Priorities).
  std::priority_queue<std::pair<uint32_t, uint32_t>, std::vector<std::pair<uint32_t, uint32_t>>, std::greater<>> ready;
  std::vector<uint32_t> priority;  // per vertex
  std::set<uint32_t> running;
  size_t completed = 0;
  size_t completions = 0;  // every successful attempt, for fault triggers
  TimePoint started{}, finished{};
  std::map<std::string, DaemonId> affinity;
  std::vector<FaultSpec> faults;  // the job file's, then whatever `copse chaos` adds
  std::vector<char> fault_fired;
  Json faults_log = Json::array();  // every fault injected so far, for the summary
  Json recoveries = Json::array();
  std::vector<std::pair<VertexId, std::string>> log;
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
  };
  std::vector<Span> spans;
  std::map<std::pair<uint32_t, uint32_t>, size_t> open_spans;  // (vertex, version) -> index
  std::vector<std::vector<double>> stage_seconds;  // per stage: wall time of completed attempts
  std::vector<char> declared;  // per vertex: a job output reads it, so it is never released
  std::vector<char> settled;   // per vertex: no fault can make it run again (Settle)
  bool retains = false;        // a stage retains outputs: only then is settling worth its walk
  uint64_t local_input_bytes = 0, remote_input_bytes = 0;  // what placement achieved
  /// The newest progress figures a program reported (by "step" when they carry one), and when
  /// the first and newest "images" counts arrived, for a live images/s.
  Json progress;
  double first_images = -1, first_images_ms = 0, last_images = 0, last_images_ms = 0;

  const JobGraph& g() const { return *graph; }
};

Scheduler::Scheduler(DaemonSink& sink, const Clock& clock, SchedulerOptions options)
    : sink_(sink), clock_(clock), options_(options),
      policy_(MakePlacementPolicy(options_.placement, options_.locality_wait)) {
  if (!policy_) policy_ = std::make_unique<LocalityPolicy>(options_.locality_wait);
}
Scheduler::~Scheduler() = default;

Scheduler::Job* Scheduler::FindJob(JobId id) {
  auto it = jobs_.find(id);
  return it == jobs_.end() ? nullptr : it->second.get();
}
const Scheduler::Job* Scheduler::FindJob(JobId id) const {
  auto it = jobs_.find(id);
  return it == jobs_.end() ? nullptr : it->second.get();
}

double Scheduler::ElapsedMs(const Job& job) const {
  TimePoint end = job.state == JobState::kRunning ? clock_.Now() : job.finished;
  return std::chrono::duration<double, std::milli>(end - job.started).count();
}

void Scheduler::Log(Job& job, VertexId v, std::string text) {
  char stamp[32];
  std::snprintf(stamp, sizeof(stamp), "%10.3fs ", ElapsedMs(job) / 1000.0);
  std::string line = stamp + (v.valid() ? job.g().vertex(v).name + " " : std::string()) + text;
  SchedLog()->info("job={} {}", job.id.value(), line);
  if (job.log.size() < kMaxLogLines) job.log.emplace_back(v, std::move(line));
}

// ---- daemons ---------------------------------------------------------------------------------

Result<DaemonId> Scheduler::AddDaemon(DaemonSpec spec, const OutputInventory& inventory) {
  for (const auto& d : daemons_) {
    if (d->alive && d->spec.name == spec.name) {
      return Status::AlreadyExists("a live daemon is already named \"" + spec.name + "\"");
    }
  }
  for (auto& d : daemons_) {
    if (!d->awaiting || d->spec.name != spec.name) continue;
    // Back after a job manager restart: the same id, and the outputs it still holds.
    d->awaiting = false;
    d->alive = true;
    d->returned_at = clock_.Now();
    d->loss_injected_until = {};
    d->free_cpus = spec.cpus;
    d->free_gpus = spec.gpus;
    d->spec = std::move(spec);
    ++capacity_epoch_;
    SchedLog()->info("daemon {} is back with {} outputs", d->spec.name, inventory.size());
    for (auto& [job_id, job_ptr] : jobs_) {
      Job& job = *job_ptr;
      if (job.state != JobState::kRunning) continue;
      // Consumers first, as in DaemonLost: a producer of one regenerated here is needed again.
      const auto& order = job.g().topological_order();
      for (auto v = order.rbegin(); v != order.rend(); ++v) {
        Run& r = job.runs[v->value()];
        if (r.daemon == d->id) r.unreachable_hold_until = {};  // held for this return, which came
        if (r.state != VertexState::kCompleted || r.daemon != d->id || !OutputNeeded(job, *v, /*count_durable=*/false)) continue;
        for (size_t port = 0; port < r.output_messages.size(); ++port) {
          if (r.output_messages[port] == 0) continue;
          if (!inventory.count({job.id.value(), v->value(), r.version, static_cast<uint32_t>(port)})) {
            Regenerate(job, *v, "daemon " + d->spec.name + " came back without it");
            break;
          }
        }
      }
      RecomputePending(job);
    }
    ReleaseStale(*d, inventory);
    Schedule();
    return d->id;
  }
  auto d = std::make_unique<Daemon>();
  d->id = DaemonId(static_cast<uint32_t>(daemons_.size()));
  d->free_cpus = spec.cpus;
  d->free_gpus = spec.gpus;
  d->spec = std::move(spec);
  ++capacity_epoch_;
  DaemonId id = d->id;
  SchedLog()->info("daemon {} joined: {} cpus, {} gpus, data at {}:{}", d->spec.name, d->spec.cpus, d->spec.gpus,
                   d->spec.data_host, d->spec.data_port);
  ReleaseStale(*d, inventory);
  daemons_.push_back(std::move(d));
  Schedule();
  return id;
}

void Scheduler::ReleaseStale(const Daemon& d, const OutputInventory& inventory) {
  Json keys = Json::array();
  for (const auto& [job_id, vertex, version, port] : inventory) {
    auto it = jobs_.find(JobId(job_id));
    if (it != jobs_.end() && vertex < it->second->runs.size()) {
      const Job& job = *it->second;
      const Run& r = job.runs[vertex];
      // A job that ended while the daemon was away sent it no gc: keep only a completed job's
      // declared outputs, which clients still copy.
      const bool job_reads = job.state == JobState::kRunning || (job.state == JobState::kCompleted && job.declared[vertex]);
      if (job_reads && r.state == VertexState::kCompleted && r.daemon == d.id && r.version == version &&
          port < r.output_messages.size() && !OutputReleased(job.g(), VertexId(vertex), r, static_cast<int>(port))) {
        continue;  // still what the job manager reads from there
      }
    }
    keys.push_back({{"job", job_id}, {"vertex", vertex}, {"version", version}, {"port", port}});
  }
  if (keys.empty()) return;
  SchedLog()->info("daemon {}: releasing {} listed outputs no job needs", d.spec.name, keys.size());
  stale_outbox_[d.id] = {{"op", "release"}, {"keys", std::move(keys)}};
}

void Scheduler::DaemonLost(DaemonId id, const std::string& why) {
  if (id.value() >= daemons_.size()) return;
  Daemon& d = *daemons_[id.value()];
  if (!d.alive && !d.awaiting) return;
  // Only a daemon that was registered had attempts running; an injected kill or cut explains
  // its loss, anything else (a crash, the OOM killer, a vertex killing its parent) may be the
  // doing of what ran there, and counts against each attempt's max_daemon_losses.
  const bool unexplained = d.alive && clock_.Now() > d.loss_injected_until;
  // A daemon lost while registered may come back on the same work dir with its file outputs;
  // one already awaited (its grace over, or never back after a restart) does not.
  const bool hold_files = d.alive && options_.daemon_return_grace > Duration::zero();
  d.alive = false;
  d.awaiting = hold_files;
  if (hold_files) {
    d.awaiting_until = clock_.Now() + options_.daemon_return_grace;
    d.awaiting_why = "did not come back within its return grace, after: " + why;
  }
  d.free_cpus = 0;
  d.free_gpus = 0;
  ++capacity_epoch_;  // its jobs' affinity pins to it go
  d.running = 0;  // every attempt there died with it, duplicates whose other attempt carries on included
  SchedLog()->warn("daemon {} lost: {}{}", d.spec.name, why, hold_files ? " (its file outputs are held for its return)" : "");
  outbox_.erase(id);
  stale_outbox_.erase(id);
  release_outbox_.erase(id);
  for (auto& [job_id, job_ptr] : jobs_) {
    Job& job = *job_ptr;
    if (job.state != JobState::kRunning) continue;
    for (auto it = job.affinity.begin(); it != job.affinity.end();) {
      it = it->second == id ? job.affinity.erase(it) : std::next(it);
    }
    const JobGraph& g = job.g();
    // Attempts running there failed through no fault of their own.
    std::vector<uint32_t> running(job.running.begin(), job.running.end());
    for (uint32_t v : running) {
      Run& r = job.runs[v];
      const bool ran_here = r.daemon == id || (r.dup_version && r.dup_daemon == id);
      if (!ran_here) continue;
      const int allowed = g.stage_of(VertexId(v)).max_daemon_losses;
      // Every attempt running there counts, as in Dask: which one crashed it is not known.
      if (unexplained && ++r.daemon_losses >= allowed) {
        FinishJob(job, JobState::kFailed,
                  "vertex " + g.vertex(VertexId(v)).name + " reached max_daemon_losses " + std::to_string(allowed) +
                      ": its daemon was lost with no fault injected while it ran (does it, or what runs beside it, "
                      "crash its daemon?); the last, " + d.spec.name + ": " + why);
        break;
      }
      if (r.dup_version) {
        // One of two attempts died with the daemon; the other one carries on.
        if (r.daemon == id) {
          r.version = r.dup_version;
          r.daemon = r.dup_daemon;
          r.started = r.dup_started;
        }
        r.dup_version = 0;
        Log(job, VertexId(v), "one attempt lost with daemon " + d.spec.name + "; version " + std::to_string(r.version) + " carries on");
        continue;
      }
      std::string error = "daemon " + d.spec.name + " lost: " + why;
      if (unexplained) {
        error += " (" + std::to_string(r.daemon_losses) + " of " + std::to_string(allowed) + " such losses allowed)";
      }
      Fail(job, VertexId(v), FailureClass::kDaemonLost, error, false);
    }
    if (job.state != JobState::kRunning) continue;
    // Outputs stored there are gone: regenerate those still needed, consumers first so that a
    // producer whose consumer is being regenerated is seen as needed too (lineage).
    const auto& order = g.topological_order();
    for (auto it = order.rbegin(); it != order.rend(); ++it) {
      VertexId v = *it;
      Run& r = job.runs[v.value()];
      if (r.state != VertexState::kCompleted || r.daemon != id || r.released) continue;
      if (hold_files && OutputsInFiles(g, v)) continue;  // until it is back, or its grace is over
      // Durable channels have their copies: lineage stops at them (a checkpoint).
      if (OutputNeeded(job, v, /*count_durable=*/false)) Regenerate(job, v, "its outputs were on lost daemon " + d.spec.name);
    }
    RecomputePending(job);
  }
  Schedule();
}

// ---- recovery --------------------------------------------------------------------------------

DaemonId Scheduler::PlaceholderDaemon(const std::string& name) {
  for (const auto& d : daemons_) {
    if (d->awaiting && d->spec.name == name) return d->id;
  }
  auto d = std::make_unique<Daemon>();
  d->id = DaemonId(static_cast<uint32_t>(daemons_.size()));
  d->spec.name = name;
  d->spec.cpus = 0;  // unknown until it registers: the listing shows no slots and no addresses
  d->spec.control.clear();
  d->alive = false;
  d->awaiting = true;
  d->awaiting_why = "did not come back after the job manager restarted";
  DaemonId id = d->id;
  daemons_.push_back(std::move(d));
  return id;
}

size_t Scheduler::Restore(const std::vector<Json>& records, const ProgramCatalog& catalog) {
  JournalSink* journal = journal_;
  journal_ = nullptr;  // replaying must not append what it reads
  size_t restored = 0;
  for (const auto& rec : records) {
    try {
      const std::string t = rec.at("t");
      JobId id(rec.at("job").get<uint64_t>());
      if (id.value() == 0 || id.value() >= kMaxJobId) {
        SchedLog()->error("journal: skipping a record of job {}: job ids run from 1 to 2^53", id.value());
        continue;
      }
      next_job_ = std::max(next_job_, id.value() + 1);
      if (t == "ids") continue;  // next_job_ covers it
      if (t == "job") {
        JobLoad load = LoadJobJson(rec.at("doc"), "journal", catalog);
        if (!load.ok()) {
          SchedLog()->error("journal: job {} no longer loads, skipped: {}", id.value(), load.status().message());
          continue;
        }
        Job& job = NewJob(id, load.graph, rec.value("job_dir", std::string()));
        Log(job, VertexId::Invalid(), "restored from the journal after a job manager restart");
        ++restored;
        continue;
      }
      Job* job = FindJob(id);
      if (!job) continue;
      if (t == "done") {
        // Every field is read before the run changes: a record damaged half-way must leave no
        // completed vertex without a daemon behind it.
        const Json& ver = rec.at("ver");
        if (!ver.is_number_unsigned() || ver.get<uint64_t>() > std::numeric_limits<uint32_t>::max())
          throw std::invalid_argument("\"ver\" is not an attempt version");
        VertexId v(rec.at("v").get<uint32_t>());
        const uint32_t version = ver.get<uint32_t>();
        const std::string daemon = rec.at("daemon").get<std::string>();
        auto bytes = rec.at("bytes").get<std::vector<uint64_t>>();
        auto messages = rec.at("msgs").get<std::vector<uint64_t>>();
        if (v.value() >= job->runs.size()) continue;
        Run& r = job->runs[v.value()];
        if (r.state != VertexState::kCompleted) ++job->completed;
        r.state = VertexState::kCompleted;
        r.version = version;
        r.daemon = PlaceholderDaemon(daemon);
        r.output_bytes = std::move(bytes);
        r.output_messages = std::move(messages);
        ++job->completions;
      } else if (t == "regen") {
        Run& r = job->runs.at(rec.at("v").get<uint32_t>());
        if (r.state == VertexState::kCompleted) {
          r.state = VertexState::kWaiting;
          --job->completed;
        }
      } else if (t == "end") {
        job->state = rec.at("state") == "completed" ? JobState::kCompleted
                     : rec.at("state") == "failed"  ? JobState::kFailed
                                                    : JobState::kCancelled;
        job->failure = rec.value("failure", std::string());
        job->finished = clock_.Now();
      }
    } catch (const std::exception& e) {
      SchedLog()->error("journal: skipping a malformed record: {}", e.what());
    }
  }
  StartRecoveryGrace();
  for (auto& [id, job] : jobs_) {
    if (job->state != JobState::kRunning) continue;
    // Attempts the old job manager started are unknown: new versions start above them so no
    // new attempt reuses an old output key.
    for (auto& r : job->runs) {
      if (r.state != VertexState::kCompleted) r.version += 1000;
    }
    std::fill(job->fault_fired.begin(), job->fault_fired.end(), 1);  // injected faults fired already
    RecomputePending(*job);
  }
  journal_ = journal;
  Schedule();
  return restored;
}

void Scheduler::StartRecoveryGrace() {
  const TimePoint until = clock_.Now() + options_.recovery_grace;
  for (auto& d : daemons_) {
    if (d->awaiting) d->awaiting_until = until;
  }
}

Json Scheduler::JobRecord(const Job& job) {
  return {{"t", "job"}, {"job", job.id.value()}, {"doc", job.g().spec().source}, {"job_dir", job.job_dir}};
}

Json Scheduler::DoneRecord(const Job& job, VertexId v) const {
  const Run& r = job.runs[v.value()];
  return {{"t", "done"},         {"job", job.id.value()},
          {"v", v.value()},      {"ver", r.version},
          {"daemon", daemons_[r.daemon.value()]->spec.name},
          {"bytes", r.output_bytes}, {"msgs", r.output_messages}};
}

Json Scheduler::EndRecord(const Job& job) {
  return {{"t", "end"}, {"job", job.id.value()}, {"state", JobStateName(job.state)}, {"failure", job.failure}};
}

std::vector<Json> Scheduler::Snapshot() const {
  std::vector<Json> records;
  for (const auto& [id, job] : jobs_) {
    records.push_back(JobRecord(*job));
    for (uint32_t v = 0; v < job->runs.size(); ++v) {
      if (job->runs[v].state == VertexState::kCompleted) records.push_back(DoneRecord(*job, VertexId(v)));
    }
    if (job->state != JobState::kRunning) records.push_back(EndRecord(*job));
  }
  if (next_job_ > 1) records.push_back({{"t", "ids"}, {"job", next_job_ - 1}});
  return records;
}

size_t Scheduler::SnapshotRecords() const {
  size_t n = next_job_ > 1 ? 1 : 0;
  for (const auto& [id, job] : jobs_) n += 1 + job->completed + (job->state != JobState::kRunning ? 1 : 0);
  return n;
}

// ---- jobs ------------------------------------------------------------------------------------

std::vector<uint32_t> Scheduler::Priorities(const JobGraph& g) {
  // Depth first, as Dask orders tasks: number vertices in the post-order of a DFS from each
  // sink through its inputs in port order. A subtree's vertices get consecutive numbers, so a
  // consumer becomes the most urgent ready vertex as soon as its inputs exist: outputs are
  // consumed (and released) early, fewer are held at any time, and a lost daemon takes fewer
  // unconsumed outputs with it.
  size_t n = g.vertices().size();
  std::vector<uint32_t> prio(n, UINT32_MAX);
  std::vector<char> has_consumer(n, 0);
  for (const auto& ch : g.channels()) has_consumer[ch.from.value()] = 1;
  uint32_t next = 0;
  std::vector<std::pair<uint32_t, size_t>> stack;  // (vertex, next predecessor index)
  auto preds = [&](uint32_t v, size_t i) -> std::optional<uint32_t> {
    const VertexNode& node = g.vertex(VertexId(v));
    if (i < node.inputs.size()) return g.channel(node.inputs[i]).from.value();
    i -= node.inputs.size();
    if (i < node.order_in.size()) return g.channel(node.order_in[i]).from.value();
    return std::nullopt;
  };
  std::vector<char> entered(n, 0);
  auto visit = [&](uint32_t root) {
    if (entered[root]) return;
    entered[root] = 1;
    stack.emplace_back(root, 0);
    while (!stack.empty()) {
      auto& [v, i] = stack.back();
      auto p = preds(v, i++);
      if (!p) {
        prio[v] = next++;
        stack.pop_back();
      } else if (!entered[*p]) {
        entered[*p] = 1;
        stack.emplace_back(*p, 0);
      }
    }
  };
  for (uint32_t v = 0; v < n; ++v) {
    if (!has_consumer[v]) visit(v);
  }
  for (uint32_t v = 0; v < n; ++v) visit(v);  // cycles through live channels (rings) only
  return prio;
}

Scheduler::Job& Scheduler::NewJob(JobId id, std::shared_ptr<const JobGraph> graph, std::string job_dir) {
  auto job = std::make_unique<Job>();
  job->id = id;
  job->graph = std::move(graph);
  job->job_dir = std::move(job_dir);
  if (job->g().ChannelCounts()[static_cast<size_t>(ChannelKind::kDurable)] > 0) {
    job->durable_dir = (std::filesystem::path(job->job_dir) / job->g().spec().durable_dir /
                        ("job" + std::to_string(id.value())))
                           .lexically_normal()
                           .string();
  }
  job->started = clock_.Now();
  job->runs.resize(job->g().vertices().size());
  job->faults = job->g().spec().faults;
  job->fault_fired.assign(job->faults.size(), 0);
  job->declared.assign(job->runs.size(), 0);
  job->settled.assign(job->runs.size(), 0);
  for (const auto& st : job->g().spec().stages) job->retains = job->retains || st.RetainsAny();
  job->stage_seconds.resize(job->g().spec().stages.size());
  job->gang_version.assign(job->g().gangs().size(), 0);
  job->gang_waits.assign(job->g().gangs().size(), {});
  job->gang_needs.emplace(job->g());
  job->priority = Priorities(job->g());
  for (const auto& o : job->g().spec().outputs) job->declared[job->g().FindVertex(o.from.ToString()).value()] = 1;
  Job& j = *job;
  jobs_[j.id] = std::move(job);
  return j;
}

JobId Scheduler::Submit(std::shared_ptr<const JobGraph> graph, std::string job_dir) {
  Job& j = NewJob(JobId(next_job_++), std::move(graph), std::move(job_dir));
  Journal(JobRecord(j));
  RemoveDurableCopies(j);  // an earlier job manager's job of the same id left them
  Log(j, VertexId::Invalid(), "submitted: " + std::to_string(j.runs.size()) + " vertices, " +
                                  std::to_string(j.g().channels().size()) + " channels");
  if (j.runs.empty()) {
    FinishJob(j, JobState::kCompleted, "");
    return j.id;
  }
  RecomputePending(j);
  CheckFaults(j);
  Schedule();
  return j.id;
}

void Scheduler::RecomputePending(Job& job) {
  const JobGraph& g = job.g();
  // A vertex that must run (again) needs its inputs: producers whose outputs were released by
  // garbage collection run again too, consumers first so the walk reaches as far upstream as
  // outputs are gone.
  const auto& order = g.topological_order();
  for (auto it = order.rbegin(); it != order.rend(); ++it) {
    const Run& r = job.runs[it->value()];
    if (r.state == VertexState::kCompleted || r.state == VertexState::kRunning) continue;
    for (ChannelId ch : g.vertex(*it).inputs) {
      const ChannelEdge& c = g.channel(ch);
      // Ordering edges carry no data, and a durable one has its copy. A retained port is
      // still stored when the producer's other outputs were released, until it settled.
      if (c.kind == ChannelKind::kOrder || c.kind == ChannelKind::kDurable) continue;
      VertexId p = c.from;
      Run& pr = job.runs[p.value()];
      if (pr.state == VertexState::kCompleted && OutputReleased(g, p, pr, c.from_port)) {
        pr.released = pr.retained_released = false;
        Regenerate(job, p, "its released output is needed again by " + g.vertex(*it).name);
      }
    }
  }
  for (auto& r : job.runs) {
    if (r.state != VertexState::kCompleted) r.pending = 0;
  }
  for (const auto& ch : g.channels()) {
    if (IsLive(ch.kind)) continue;  // live ends run together: no completion to wait for
    Run& to = job.runs[ch.to.value()];
    if (to.state != VertexState::kCompleted && job.runs[ch.from.value()].state != VertexState::kCompleted) ++to.pending;
  }
  for (const auto& v : g.vertices()) {
    Run& r = job.runs[v.id.value()];
    if (r.state == VertexState::kWaiting && r.pending == 0) MakeReady(job, v.id);
    if (r.state == VertexState::kReady && r.pending > 0) r.state = VertexState::kWaiting;  // stale queue entry is skipped
  }
}

void Scheduler::MakeReady(Job& job, VertexId v) {
  job.runs[v.value()].state = VertexState::kReady;
  job.runs[v.value()].ready_since = clock_.Now();
  job.ready.emplace(job.priority[v.value()], v.value());
}

Status Scheduler::Cancel(JobId id) {
  Job* job = FindJob(id);
  if (!job) return Status::NotFound("no job " + id.ToString());
  if (job->state != JobState::kRunning) {
    return Status::FailedPrecondition("job " + id.ToString() + " already " + std::string(JobStateName(job->state)));
  }
  FinishJob(*job, JobState::kCancelled, "cancelled by the user");
  Schedule();
  return Status::OK();
}

void Scheduler::CloseSpan(Job& job, VertexId v, uint32_t version, const std::string& outcome, double ran_ms) {
  auto it = job.open_spans.find({v.value(), version});
  if (it == job.open_spans.end()) return;
  auto& span = job.spans[it->second];
  span.end_ms = ElapsedMs(job);
  // The daemon measured how long the attempt ran: the span covers that, not the dispatch and
  // report latencies (or a chained attempt's wait), shifted by one report's latency.
  if (ran_ms >= 0) span.start_ms = std::max(span.start_ms, span.end_ms - ran_ms);
  span.outcome = outcome;
  job.open_spans.erase(it);
}

Result<Json> Scheduler::Trace(JobId id) const {
  const Job* job = FindJob(id);
  if (!job) return Status::NotFound("no job " + id.ToString());
  // Chrome / Perfetto trace-event format: a process per daemon, a thread per concurrent slot.
  Json events = Json::array();
  std::map<uint32_t, std::vector<double>> lanes;  // per daemon: when each lane frees up
  std::vector<size_t> order(job->spans.size());
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return job->spans[a].start_ms < job->spans[b].start_ms; });
  double now = ElapsedMs(*job);
  for (size_t i : order) {
    const auto& s = job->spans[i];
    double end = s.end_ms >= 0 ? s.end_ms : now;
    auto& free_at = lanes[s.daemon.value()];
    size_t lane = 0;
    while (lane < free_at.size() && free_at[lane] > s.start_ms) ++lane;
    if (lane == free_at.size()) free_at.push_back(0);
    free_at[lane] = end;
    const VertexNode& node = job->g().vertex(VertexId(s.vertex));
    events.push_back({{"name", node.name},
                      {"cat", job->g().spec().stages[node.stage].name},
                      {"ph", "X"},
                      {"ts", s.start_ms * 1000},
                      {"dur", (end - s.start_ms) * 1000},
                      {"pid", s.daemon.value()},
                      {"tid", lane},
                      {"args", {{"version", s.version}, {"outcome", s.end_ms >= 0 ? s.outcome : "running"}}}});
  }
  for (const auto& [daemon, free_at] : lanes) {
    events.push_back({{"name", "process_name"}, {"ph", "M"}, {"pid", daemon},
                      {"args", {{"name", "daemon " + daemons_[daemon]->spec.name}}}});
  }
  return Json{{"traceEvents", events}, {"displayTimeUnit", "ms"},
              {"otherData", {{"job", id.value()}, {"name", job->g().spec().name}, {"state", JobStateName(job->state)}}}};
}

void Scheduler::FreeSlot(Job& job, VertexId v, DaemonId daemon) {
  if (!daemon.valid()) return;
  Daemon& d = *daemons_[daemon.value()];
  if (d.alive) {
    const auto& res = job.g().stage_of(v).resources;
    d.free_cpus += res.cpus;
    d.free_gpus += res.gpus;
    ++capacity_epoch_;
  }
  if (d.running) --d.running;
}

void Scheduler::ReleaseSlots(Job& job, VertexId v) {
  Run& r = job.runs[v.value()];
  if (r.state != VertexState::kRunning) return;
  job.running.erase(v.value());
  CloseSpan(job, v, r.version, "stopped");
  if (r.dup_version) CloseSpan(job, v, r.dup_version, "stopped");
  FreeSlot(job, v, r.daemon);
  if (r.dup_version) {
    FreeSlot(job, v, r.dup_daemon);
    r.dup_version = 0;
  }
}

bool Scheduler::ResolveDuplicate(Job& job, VertexId v, const AttemptReport& rep) {
  Run& r = job.runs[v.value()];
  if (!r.dup_version) return false;
  bool from_dup = rep.version == r.dup_version;
  DaemonId other = from_dup ? r.daemon : r.dup_daemon;
  uint32_t other_version = from_dup ? r.version : r.dup_version;
  if (rep.ok) {
    // First to finish wins; the other attempt is cancelled and its slot freed.
    if (daemons_[other.value()]->alive) {
      sink_.SendToDaemon(other, {{"op", "cancel"}, {"job", job.id.value()}, {"vertex", v.value()}, {"version", other_version}});
    }
    FreeSlot(job, v, other);
    if (from_dup) {
      WithdrawRemoteChains(job, v);  // they wait for the original's outputs
      r.version = r.dup_version;
      r.daemon = r.dup_daemon;
    }
    r.dup_version = 0;
    Log(job, v, "version " + std::to_string(rep.version) + (from_dup ? " (the duplicate)" : " (the original)") +
                    " finished first; version " + std::to_string(other_version) + " cancelled");
    return false;  // the caller completes the vertex
  }
  // One of two attempts failed: the other carries on, and nothing is charged.
  FreeSlot(job, v, from_dup ? r.dup_daemon : r.daemon);
  if (!from_dup) {
    WithdrawRemoteChains(job, v);  // they wait for the failed original's outputs
    r.version = r.dup_version;
    r.daemon = r.dup_daemon;
    r.started = r.dup_started;
  }
  r.dup_version = 0;
  Log(job, v, "version " + std::to_string(rep.version) + " failed while version " + std::to_string(r.version) +
                  " still runs: " + rep.error);
  return true;
}

void Scheduler::OnAttemptFinished(const AttemptReport& rep) {
  Job* job = FindJob(rep.job);
  if (!job || job->state != JobState::kRunning || rep.vertex.value() >= job->runs.size()) return;
  Run& r = job->runs[rep.vertex.value()];
  CloseSpan(*job, rep.vertex, rep.version, rep.ok ? "completed" : std::string(FailureClassName(rep.failure)),
            rep.duration_ms > 0 ? rep.duration_ms : -1);
  bool current = r.version == rep.version || (r.dup_version && r.dup_version == rep.version);
  if (r.state != VertexState::kRunning || !current) return;  // a stale attempt
  if (ResolveDuplicate(*job, rep.vertex, rep)) {
    Schedule();
    return;
  }
  if (!rep.ok && !r.chained_after.empty()) {  // never started: a predecessor did not deliver
    // Chained after one on another daemon, it may have found that daemon gone before this job
    // manager did: it waits for the predecessor's report rather than chaining after it again.
    const bool all_local = std::all_of(r.chained_after.begin(), r.chained_after.end(),
                                       [&](VertexId p) { return job->runs[p.value()].daemon == r.daemon; });
    Unchain(*job, rep.vertex, /*rechain=*/all_local);
    Schedule();
    return;
  }
  const JobGraph& g = job->g();
  const auto& inputs = g.vertex(rep.vertex).inputs;
  const bool input_lost = !rep.ok && rep.failure == FailureClass::kInputLost && rep.lost_input_port >= 0;
  if (rep.ok) {
    Complete(*job, rep.vertex, rep);
  } else if (input_lost && static_cast<size_t>(rep.lost_input_port) >= inputs.size()) {
    Fail(*job, rep.vertex, FailureClass::kProgramError,
         "its daemon reported input " + std::to_string(rep.lost_input_port) + " lost, but it has " +
             std::to_string(inputs.size()) + " inputs: " + rep.error,
         true);
  } else if (input_lost && !IsLive(g.channel(inputs[rep.lost_input_port]).kind)) {
    const ChannelEdge& in = g.channel(inputs[rep.lost_input_port]);
    const VertexId producer = in.from;
    // A consumer that could not reach a held output (file outputs of a lost daemon, kept for
    // its return) runs again once the daemon is back, at its new address if it has one. A
    // damaged or missing output, or one whose daemon answered, is regenerated as before.
    Run& pr = job->runs[producer.value()];
    const Daemon* holder = pr.state == VertexState::kCompleted && pr.daemon.valid() ? daemons_[pr.daemon.value()].get() : nullptr;
    bool held = rep.lost_input_unreachable && holder && (holder->awaiting || holder->returned_at > r.started);
    // Unreachable but still registered: most likely dead with its loss not seen yet. The file
    // output is held for up to the return grace, once; unreachable again after that, it is lost.
    const bool suspect = rep.lost_input_unreachable && holder && holder->alive && !held &&
                         options_.daemon_return_grace > Duration::zero() && in.kind == ChannelKind::kFile &&
                         (pr.unreachable_hold_until == TimePoint{} || clock_.Now() < pr.unreachable_hold_until);
    if (suspect) {
      if (pr.unreachable_hold_until == TimePoint{}) {
        pr.unreachable_hold_until = clock_.Now() + options_.daemon_return_grace;
      }
      held = true;
    }
    if (!held) {
      // Each lost input is regenerated, so only one lost again and again means its producer
      // cannot make a readable output; different ones lost once each are faults of their own.
      auto lost = std::find_if(r.inputs_lost.begin(), r.inputs_lost.end(),
                               [&](const auto& p) { return p.first == rep.lost_input_port; });
      if (lost == r.inputs_lost.end()) lost = r.inputs_lost.insert(r.inputs_lost.end(), {rep.lost_input_port, 0});
      if (++lost->second >= kMaxInputLosses) {
        FinishJob(*job, JobState::kFailed,
                  "vertex " + g.vertex(rep.vertex).name + " could not read input " +
                      std::to_string(rep.lost_input_port) + " (from " + g.vertex(producer).name + ") " +
                      std::to_string(lost->second) + " times, its producer re-run each time: " + rep.error);
        Schedule();
        return;
      }
    }
    Fail(*job, rep.vertex, FailureClass::kInputLost, rep.error, /*charge=*/false);
    if (suspect) {
      Log(*job, producer, "daemon " + holder->spec.name + " could not be reached for its output; held for its loss or return");
    } else if (held) {
      Log(*job, producer, "output unreadable at daemon " + holder->spec.name + "'s old address; held for its return");
    } else {
      Regenerate(*job, producer, "consumer " + g.vertex(rep.vertex).name + " could not read it: " + rep.error);
    }
    RecomputePending(*job);
  } else {
    Fail(*job, rep.vertex, rep.failure, rep.error, rep.failure != FailureClass::kCancelled);
  }
  Schedule();
}

void Scheduler::Complete(Job& job, VertexId v, const AttemptReport& rep) {
  ReleaseSlots(job, v);
  Run& r = job.runs[v.value()];
  job.stage_seconds[job.g().vertex(v).stage].push_back(std::chrono::duration<double>(clock_.Now() - r.started).count());
  r.state = VertexState::kCompleted;
  r.unreachable_hold_until = {};
  // It ran, so what it was chained after delivered, whether or not that attempt's own report
  // has come yet: a completed vertex is never withdrawn as a chain that did not start.
  r.chained_after.clear();
  r.inputs_lost.clear();
  r.output_bytes = rep.output_bytes;
  r.output_bytes.resize(job.g().vertex(v).outputs.size(), 0);
  r.output_messages = rep.output_messages;
  // Unknown counts (an older daemon) mean "fetch it": never claim an output is empty.
  r.output_messages.resize(r.output_bytes.size(), 1);
  Journal(DoneRecord(job, v));
  r.duration_ms = rep.duration_ms;
  if (rep.progress.is_object()) NoteProgress(job, rep.progress);
  ++job.completed;
  ++job.completions;
  // Successors wait for one predecessor fewer. Those chained after v now wait less deep, and
  // those it was the last for started on its daemon just now: their clocks (timeouts,
  // stragglers, trace spans) start here.
  std::vector<VertexId> behind;
  ForEachSuccessor(job.g(), v, [&](VertexId u) {
    Run& c = job.runs[u.value()];
    if (std::erase(c.chained_after, v)) {
      behind.push_back(u);
      if (c.chained_after.empty()) {
        c.started = clock_.Now();
        auto span = job.open_spans.find({u.value(), c.version});
        if (span != job.open_spans.end()) job.spans[span->second].start_ms = ElapsedMs(job);
      }
    }
    if (c.state == VertexState::kCompleted || c.pending == 0) return;
    if (--c.pending == 0 && c.state == VertexState::kWaiting) MakeReady(job, u);
  });
  ReleaseConsumedInputs(job, v);
  if (job.retains) Settle(job, v);
  if (job.completed == job.runs.size()) {
    FinishJob(job, JobState::kCompleted, "");
    return;
  }
  CheckFaults(job);
  // v's slot is free: what waits on v, or on what started in its place, may chain now.
  if (job.state == JobState::kRunning) ChainSuccessors(job, v);
  for (VertexId u : behind) {
    if (job.state == JobState::kRunning) ChainBehind(job, u);
  }
}

void Scheduler::ChainBehind(Job& job, VertexId u) {
  // u waits one task less deep (a predecessor ended): so do the tasks chained after it, and
  // what waits on either may chain now.
  ChainSuccessors(job, u);
  ForEachSuccessor(job.g(), u, [&](VertexId w) {
    const Run& c = job.runs[w.value()];
    if (c.state == VertexState::kRunning && std::find(c.chained_after.begin(), c.chained_after.end(), u) != c.chained_after.end()) {
      ChainSuccessors(job, w);
    }
  });
}

int Scheduler::ChainDepth(const Job& job, VertexId v) const {
  int depth = 0;
  for (VertexId a : job.runs[v.value()].chained_after) depth = std::max(depth, 1 + ChainDepth(job, a));
  return depth;
}

void Scheduler::ChainSuccessors(Job& job, VertexId v) {
  if (!options_.chain_dispatch) return;
  ForEachSuccessor(job.g(), v, [&](VertexId u) {
    const Run& c = job.runs[u.value()];
    if (c.state == VertexState::kWaiting && c.pending > 0) TryChain(job, u);
  });
}

void Scheduler::TryChain(Job& job, VertexId u) {
  const JobGraph& g = job.g();
  const VertexNode& node = g.vertex(u);
  const StageSpec& stage = g.stage_of(u);
  Run& r = job.runs[u.value()];
  // A vertex waiting for many predecessors (a wide gather) is not chained: the daemon would
  // hold a long list, and each predecessor's dispatch would scan all of u's inputs again.
  if (!options_.chain_dispatch || job.state != JobState::kRunning || r.state != VertexState::kWaiting ||
      r.pending == 0 || r.pending > kMaxChainedAfter || node.gang.valid()) {
    return;
  }
  // Every unfinished predecessor must be running (not as a duplicate pair, not in a gang).
  std::vector<VertexId> after;
  bool live = false;
  auto visit = [&](ChannelId ch) {
    const ChannelEdge& c = g.channel(ch);
    live = live || IsLive(c.kind);
    if (job.runs[c.from.value()].state != VertexState::kCompleted &&
        std::find(after.begin(), after.end(), c.from) == after.end()) {
      after.push_back(c.from);
    }
  };
  for (ChannelId ch : node.inputs) visit(ch);
  for (ChannelId ch : node.order_in) visit(ch);
  if (ReadsAHeldOutput(job, u)) return;
  for (const auto& port : node.outputs) {
    for (ChannelId ch : port) live = live || IsLive(g.channel(ch).kind);
  }
  if (live || after.empty()) return;
  for (VertexId a : after) {
    const Run& p = job.runs[a.value()];
    if (p.state != VertexState::kRunning || p.dup_version || g.vertex(a).gang.valid()) return;
    if (ChainDepth(job, a) >= kMaxChainDepth) return;
  }
  auto reads = [&](VertexId a) {
    return std::any_of(node.inputs.begin(), node.inputs.end(), [&](ChannelId ch) { return g.channel(ch).from == a; });
  };
  DaemonId where;
  if (!stage.affinity.empty()) {
    auto pinned = job.affinity.find(stage.affinity);
    if (pinned == job.affinity.end()) return;
    where = pinned->second;
    // On another daemon, u learns that a predecessor succeeded from its outputs (fetched as
    // they are written): it must read one, and the daemon watches one such predecessor.
    int remote = 0;
    for (VertexId a : after) {
      const Run& p = job.runs[a.value()];
      if (p.daemon == where) continue;
      if (++remote > 1 || !reads(a) || !daemons_[p.daemon.value()]->alive) return;
    }
  } else {
    // Unpinned: on the predecessors' daemon, where placement would put it once they complete
    // (the daemon holding the most of its inputs) — provided they share one daemon, u reads one
    // of them and nothing from elsewhere, names no input hosts of its own, and the policy places
    // by inputs at all.
    where = job.runs[after.front().value()].daemon;
    if (std::none_of(after.begin(), after.end(), reads) || !stage.input_hosts.empty() || !policy_->FollowsInputs()) return;
    for (ChannelId ch : node.inputs) {
      if (job.runs[g.channel(ch).from.value()].daemon != where) return;
    }
    for (VertexId a : after) {
      if (job.runs[a.value()].daemon != where) return;
    }
  }
  Daemon& d = *daemons_[where.value()];
  // A task chained on its predecessors' daemon starts only after they, and the tasks there they
  // are chained after in turn, have all ended: it may take all their slots. free_cpus already
  // counts what earlier chained tasks took (it goes negative until their predecessors end), so
  // free + theirs bounds what they take together: one slot passes down one chain.
  std::vector<VertexId> ahead;
  std::vector<VertexId> todo(after.begin(), after.end());
  while (!todo.empty()) {
    VertexId a = todo.back();
    todo.pop_back();
    const Run& p = job.runs[a.value()];
    if (p.daemon != where || std::find(ahead.begin(), ahead.end(), a) != ahead.end()) continue;
    ahead.push_back(a);
    todo.insert(todo.end(), p.chained_after.begin(), p.chained_after.end());
  }
  double cpus = d.free_cpus;
  int gpus = d.free_gpus;
  for (VertexId a : ahead) {
    cpus += g.stage_of(a).resources.cpus;
    gpus += g.stage_of(a).resources.gpus;
  }
  if (!d.alive || d.awaiting || cpus + 1e-9 < stage.resources.cpus || gpus < stage.resources.gpus) return;
  Dispatch(job, u, d, /*duplicate=*/false, after);
}

void Scheduler::WithdrawRemoteChains(Job& job, VertexId v) {
  const DaemonId where = job.runs[v.value()].daemon;
  ForEachSuccessor(job.g(), v, [&](VertexId u) {
    Run& c = job.runs[u.value()];
    if (c.daemon == where || std::find(c.chained_after.begin(), c.chained_after.end(), v) == c.chained_after.end()) return;
    Flush();  // u's "run" may still wait in the outbox: it must not arrive after its cancel
    if (daemons_[c.daemon.value()]->alive) {
      sink_.SendToDaemon(c.daemon, {{"op", "cancel"}, {"job", job.id.value()}, {"vertex", u.value()}, {"version", c.version}});
    }
    Unchain(job, u, /*rechain=*/false);
  });
}

void Scheduler::Unchain(Job& job, VertexId u, bool rechain) {
  Run& r = job.runs[u.value()];
  ReleaseSlots(job, u);
  r.state = VertexState::kWaiting;
  r.chained_after.clear();
  WithdrawRemoteChains(job, u);  // u will not run: nor will what waits for it elsewhere
  Log(job, u, "version " + std::to_string(r.version) + " withdrawn: the vertex it was chained after did not succeed");
  if (r.pending == 0) {
    MakeReady(job, u);
  } else if (rechain) {
    TryChain(job, u);  // its predecessor may run again already
  }
}

void Scheduler::NoteProgress(Job& job, const Json& figures) {
  // A re-run (recovery) reports an older step: the newest figures stay.
  auto step = [](const Json& j) { return j.contains("step") && j["step"].is_number() ? j["step"].get<double>() : -1.0; };
  if (job.progress.is_object() && step(figures) < step(job.progress)) return;
  job.progress = figures;
  if (figures.contains("images") && figures["images"].is_number()) {
    const double images = figures["images"].get<double>(), now = ElapsedMs(job);
    if (job.first_images < 0) job.first_images = images, job.first_images_ms = now;
    job.last_images = images, job.last_images_ms = now;
  }
}

bool Scheduler::OutputNeeded(const Job& job, VertexId v, bool count_durable) const {
  if (job.declared[v.value()]) return true;
  const JobGraph& g = job.g();
  for (const auto& port : g.vertex(v).outputs) {
    for (ChannelId ch : port) {
      const ChannelEdge& c = g.channel(ch);
      if (!count_durable && c.kind == ChannelKind::kDurable) continue;
      if (job.runs[c.to.value()].state != VertexState::kCompleted) return true;
    }
  }
  return false;
}

bool Scheduler::ReadsAHeldOutput(const Job& job, VertexId v) const {
  const JobGraph& g = job.g();
  const TimePoint now = clock_.Now();
  for (ChannelId ch : g.vertex(v).inputs) {
    const ChannelEdge& c = g.channel(ch);
    if (IsLive(c.kind) || c.kind == ChannelKind::kDurable) continue;  // nothing stored / a copy serves
    const Run& p = job.runs[c.from.value()];
    if (p.state != VertexState::kCompleted || !p.daemon.valid()) continue;
    if (!daemons_[p.daemon.value()]->awaiting && now >= p.unreachable_hold_until) continue;
    const size_t port = static_cast<size_t>(c.from_port);
    if (port >= p.output_messages.size() || p.output_messages[port] > 0) return true;  // empty: nothing to read
  }
  return false;
}

bool Scheduler::OutputsInFiles(const JobGraph& g, VertexId v) {
  const auto& ports = g.vertex(v).outputs;
  return std::all_of(ports.begin(), ports.end(), [&](const auto& port) { return PortKind(g, port) == ChannelKind::kFile; });
}

std::string Scheduler::DurablePath(const Job& job, VertexId v, uint32_t version, int port) const {
  return job.durable_dir + "/v" + std::to_string(v.value()) + "." + std::to_string(version) + ".p" +
         std::to_string(port) + ".out";
}

void Scheduler::RemoveDurableCopies(const Job& job) {
  if (job.durable_dir.empty()) return;
  std::error_code ec;
  std::filesystem::remove_all(job.durable_dir, ec);
  if (ec) SchedLog()->warn("job={} cannot remove {}: {}", job.id.value(), job.durable_dir, ec.message());
  std::filesystem::remove(std::filesystem::path(job.durable_dir).parent_path(), ec);  // only when empty
}

void Scheduler::ReleaseConsumedInputs(Job& job, VertexId v) {
  const JobGraph& g = job.g();
  for (ChannelId in : g.vertex(v).inputs) {
    VertexId p = g.channel(in).from;
    Run& pr = job.runs[p.value()];
    if (pr.released || job.declared[p.value()] || g.stage_of(p).retain_all || !pr.daemon.valid() ||
        !daemons_[pr.daemon.value()]->alive) {
      continue;
    }
    bool all_done = true;
    for (const auto& port : g.vertex(p).outputs) {
      for (ChannelId ch : port) all_done = all_done && job.runs[g.channel(ch).to.value()].state == VertexState::kCompleted;
    }
    if (!all_done) continue;
    pr.released = true;
    for (size_t port = 0; port < g.vertex(p).outputs.size(); ++port) {
      if (pr.output_messages.size() > port && pr.output_messages[port] == 0) continue;  // nothing stored
      if (g.stage_of(p).Retains(port)) continue;  // kept until it settles (Settle)
      QueueRelease(job, p, port);
    }
  }
}

bool Scheduler::OutputReleased(const JobGraph& g, VertexId v, const Run& r, int port) {
  return g.stage_of(v).Retains(static_cast<size_t>(port)) ? r.retained_released : r.released;
}

void Scheduler::QueueRelease(Job& job, VertexId v, size_t port) {
  const Run& r = job.runs[v.value()];
  PendingReleases& batch = release_outbox_[r.daemon];
  if (batch.msg.is_null()) batch.msg = {{"op", "release"}, {"keys", Json::array()}};
  batch.msg["keys"].push_back({{"job", job.id.value()}, {"vertex", v.value()}, {"version", r.version}, {"port", port}});
  batch.bytes += port < r.output_bytes.size() ? r.output_bytes[port] : 0;
}

void Scheduler::Settle(Job& job, VertexId v) {
  const JobGraph& g = job.g();
  std::vector<VertexId> work{v};
  while (!work.empty()) {
    const VertexId x = work.back();
    work.pop_back();
    Run& r = job.runs[x.value()];
    if (job.settled[x.value()] || job.declared[x.value()] || r.state != VertexState::kCompleted) continue;
    bool settles = true;
    for (const auto& port : g.vertex(x).outputs) {
      for (ChannelId ch : port) {
        const ChannelEdge& c = g.channel(ch);
        if (c.kind != ChannelKind::kOrder && c.kind != ChannelKind::kDurable && !job.settled[c.to.value()]) settles = false;
      }
    }
    if (!settles) continue;
    job.settled[x.value()] = 1;
    for (ChannelId in : g.vertex(x).inputs) work.push_back(g.channel(in).from);
    const StageSpec& stage = g.stage_of(x);
    if (r.retained_released || !stage.RetainsAny() || !r.daemon.valid() || !daemons_[r.daemon.value()]->alive) continue;
    r.retained_released = true;
    for (size_t port = 0; port < g.vertex(x).outputs.size(); ++port) {
      if (!stage.Retains(port) || (r.output_messages.size() > port && r.output_messages[port] == 0)) continue;
      QueueRelease(job, x, port);
    }
  }
}

void Scheduler::ResetGang(Job& job, GangId gang, VertexId cause, const std::string& why) {
  const JobGraph& g = job.g();
  for (VertexId m : g.gangs()[gang.value()].members) {
    Run& r = job.runs[m.value()];
    if (r.state == VertexState::kRunning) {
      if (r.daemon.valid() && daemons_[r.daemon.value()]->alive && m != cause) {
        sink_.SendToDaemon(r.daemon, {{"op", "cancel"}, {"job", job.id.value()}, {"vertex", m.value()}, {"version", r.version}});
      }
      ReleaseSlots(job, m);
    } else if (r.state == VertexState::kCompleted) {
      --job.completed;
      Journal({{"t", "regen"}, {"job", job.id.value()}, {"v", m.value()}});
    }
    r.state = VertexState::kWaiting;
    job.settled[m.value()] = 0;
  }
  Log(job, cause, "gang of " + std::to_string(g.gangs()[gang.value()].members.size()) + " restarts: " + why);
}

void Scheduler::RecordRecovery(Job& job, VertexId v, uint32_t version, std::string_view reason, const std::string& detail,
                               bool charged) {
  job.recoveries.push_back({{"vertex", job.g().vertex(v).name},
                            {"failed_version", version},
                            {"reason", reason},
                            {"detail", detail},
                            {"charged", charged},
                            {"at_ms", ElapsedMs(job)}});
}

void Scheduler::Fail(Job& job, VertexId v, FailureClass cls, const std::string& error, bool charge) {
  Run& r = job.runs[v.value()];
  const std::string& name = job.g().vertex(v).name;
  const GangId gang = job.g().vertex(v).gang;
  std::string detail = error;
  if (gang.valid()) {
    // Live channels cannot be replayed: the whole gang runs again with a new version. Only a
    // member's own error or timeout is charged, not the peers it took down.
    if (r.state != VertexState::kRunning) return;  // already reset with its gang
    charge = charge && (cls == FailureClass::kProgramError || cls == FailureClass::kTimeout);
    ResetGang(job, gang, v, name + " failed (" + std::string(FailureClassName(cls)) + "): " + error);
    detail += " (its gang of " + std::to_string(job.g().gangs()[gang.value()].members.size()) + " restarts)";
  } else {
    ReleaseSlots(job, v);
    r.state = VertexState::kWaiting;
    r.chained_after.clear();
    WithdrawRemoteChains(job, v);
    Log(job, v, "version " + std::to_string(r.version) + " failed (" + std::string(FailureClassName(cls)) + "): " + error);
  }
  r.last_error = error;
  if (charge) ++r.charged;
  const int max_attempts = job.g().stage_of(v).max_attempts;
  if (charge && r.charged >= max_attempts) {
    FinishJob(job, JobState::kFailed,
              "vertex " + name + " failed " + std::to_string(r.charged) + " of " + std::to_string(max_attempts) +
                  " attempts (" + std::string(FailureClassName(cls)) + "): " + error);
    return;
  }
  RecordRecovery(job, v, r.version, FailureClassName(cls), detail, charge);
  if (gang.valid()) {
    RecomputePending(job);
  } else if (r.pending == 0) {
    MakeReady(job, v);
  }
}

void Scheduler::Regenerate(Job& job, VertexId v, const std::string& why) {
  Run& r = job.runs[v.value()];
  if (r.state != VertexState::kCompleted) return;
  if (GangId gang = job.g().vertex(v).gang; gang.valid()) {
    RecordRecovery(job, v, r.version, "output_lost", why + " (its gang restarts)", false);
    ResetGang(job, gang, v, why);
    return;
  }
  r.state = VertexState::kWaiting;
  job.settled[v.value()] = 0;
  --job.completed;
  Journal({{"t", "regen"}, {"job", job.id.value()}, {"v", v.value()}});
  Log(job, v, "output of version " + std::to_string(r.version) + " lost, re-running: " + why);
  RecordRecovery(job, v, r.version, "output_lost", why, false);
}

void Scheduler::FinishJob(Job& job, JobState state, const std::string& reason) {
  job.state = state;
  job.failure = reason;
  job.finished = clock_.Now();
  Journal(EndRecord(job));
  job.ready = {};
  Log(job, VertexId::Invalid(), std::string(JobStateName(state)) + (reason.empty() ? "" : ": " + reason));
  std::set<DaemonId> busy;
  for (uint32_t v : std::vector<uint32_t>(job.running.begin(), job.running.end())) {
    busy.insert(job.runs[v].daemon);
    ReleaseSlots(job, VertexId(v));
    job.runs[v].state = VertexState::kWaiting;
  }
  for (DaemonId d : busy) {
    if (d.valid() && daemons_[d.value()]->alive) sink_.SendToDaemon(d, {{"op", "cancel"}, {"job", job.id.value()}});
  }
  // Garbage-collect intermediate outputs; keep the declared job outputs of a completed job.
  std::map<DaemonId, Json> keep;
  if (state == JobState::kCompleted) {
    for (const auto& o : job.g().spec().outputs) {
      VertexId v = job.g().FindVertex(o.from.ToString());
      const Run& r = job.runs[v.value()];
      keep[r.daemon].push_back({{"job", job.id.value()}, {"vertex", v.value()}, {"version", r.version}, {"port", o.port}});
    }
  }
  for (const auto& d : daemons_) {
    if (!d->alive) continue;
    Flush();  // tasks queued before the GC message must not be reordered after it
    sink_.SendToDaemon(d->id, {{"op", "gc"}, {"job", job.id.value()}, {"keep", keep.count(d->id) ? keep[d->id] : Json::array()}});
  }
  RemoveDurableCopies(job);  // checkpoints for recovery only: the job needs them no more
}

// ---- placement -------------------------------------------------------------------------------

std::string_view Scheduler::LabelOf(const Daemon& d, const std::string& key) {
  auto it = d.spec.labels.find(key);
  return it == d.spec.labels.end() ? std::string_view() : std::string_view(it->second);
}

void Scheduler::Schedule() {
  for (auto& [id, job_ptr] : jobs_) {
    Job& job = *job_ptr;
    if (job.state != JobState::kRunning) continue;
    std::vector<VertexId> blocked;
    while (!job.ready.empty() && blocked.size() < kMaxBlockedScan && AnySlotFree()) {
      VertexId v(job.ready.top().second);
      job.ready.pop();
      if (job.runs[v.value()].state != VertexState::kReady) continue;  // stale entry
      GangId gang = job.g().vertex(v).gang;
      if (gang.valid()) {
        // The last member to become ready places the whole gang; the others wait with it.
        bool all_ready = true;
        for (VertexId m : job.g().gangs()[gang.value()].members) {
          all_ready = all_ready && job.runs[m.value()].state == VertexState::kReady;
        }
        if (all_ready && !TryPlaceGang(job, gang)) blocked.push_back(v);
        continue;
      }
      if (!TryPlace(job, v)) blocked.push_back(v);
      if (job.state != JobState::kRunning) break;
    }
    for (VertexId b : blocked) job.ready.emplace(job.priority[b.value()], b.value());
    // A fault aimed at a vertex fires at the first chance after it is placed.
    if (job.state == JobState::kRunning &&
        std::find(job.fault_fired.begin(), job.fault_fired.end(), 0) != job.fault_fired.end()) {
      CheckFaults(job);
    }
  }
}

bool Scheduler::TryPlace(Job& job, VertexId v) {
  const JobGraph& g = job.g();
  const StageSpec& stage = g.stage_of(v);
  const Resources& need = stage.resources;
  Daemon* pinned = nullptr;
  if (!stage.affinity.empty()) {
    auto it = job.affinity.find(stage.affinity);
    if (it != job.affinity.end()) pinned = daemons_[it->second.value()].get();
  }
  auto fits = [&](const Daemon& d) {
    return d.alive && d.free_cpus + 1e-9 >= need.cpus && d.free_gpus >= need.gpus && d.spec.cpus + 1e-9 >= need.cpus;
  };
  if (pinned) {
    if (!fits(*pinned) || ReadsAHeldOutput(job, v)) return false;
    Dispatch(job, v, *pinned, /*duplicate=*/false);
    return true;
  }
  // The common case on a busy cluster: no daemon has room. Say so before building a request.
  if (std::none_of(daemons_.begin(), daemons_.end(), [&](const auto& d) { return fits(*d); })) return false;
  if (ReadsAHeldOutput(job, v)) return false;  // not back yet: its outputs are held for it
  PlacementRequest request;
  for (ChannelId ch : g.vertex(v).inputs) {
    const ChannelEdge& c = g.channel(ch);
    const Run& p = job.runs[c.from.value()];
    if (p.daemon.valid() && static_cast<size_t>(c.from_port) < p.output_bytes.size()) {
      request.input_bytes[p.daemon] += p.output_bytes[c.from_port];
    }
  }
  if (!stage.input_hosts.empty()) {
    const int replica = g.vertex(v).replica;
    std::string host = stage.input_hosts.size() == 1 ? stage.input_hosts[0] : stage.input_hosts[replica % stage.input_hosts.size()];
    request.input_hosts.push_back(ReplaceAll(host, "{replica}", std::to_string(replica)));
  }
  request.waited = clock_.Now() - job.runs[v.value()].ready_since;
  // The group's first vertex pins it: only where the gangs it joins later can follow (the
  // others are no candidates, so locality does not wait for them). Where no live daemon could
  // hold those gangs, it waits: a daemon may return or join (after a job manager restart the
  // daemons come back one by one), and a pin made now would be for good.
  auto pin_fits = [&](const Daemon& d) { return PinFits(job, stage, d, job.affinity); };
  if (std::none_of(daemons_.begin(), daemons_.end(), [&](const auto& d) { return d->alive && pin_fits(*d); })) {
    if (job.pin_waits.insert(stage.affinity).second) {
      Log(job, v, "waits: no live daemon can hold affinity group " + stage.affinity + "'s vertices and the gangs they join");
    }
    return false;
  }
  std::vector<PlacementDaemon> candidates;
  for (const auto& d : daemons_) {
    if (!d->alive || !pin_fits(*d)) continue;
    candidates.push_back({d->id, LabelOf(*d, kHostLabel), LabelOf(*d, kRackLabel), d->free_cpus, fits(*d)});
  }
  auto chosen = policy_->Choose(request, candidates);
  if (!chosen) return false;
  Daemon& best = *daemons_[chosen->value()];
  if (!stage.affinity.empty()) job.affinity[stage.affinity] = best.id;
  Dispatch(job, v, best, /*duplicate=*/false);
  return true;
}

void Scheduler::AddNcclInfo(Job& job, VertexId v, uint32_t version, Json& task) {
  // Ranks: the gang's members that nccl channels touch, in vertex-id order.
  const JobGraph& g = job.g();
  std::vector<VertexId> ranked;
  for (VertexId m : g.gangs()[g.vertex(v).gang.value()].members) {
    const VertexNode& n = g.vertex(m);
    bool nccl = false;
    for (ChannelId ch : n.inputs) nccl = nccl || g.channel(ch).kind == ChannelKind::kNccl;
    for (const auto& port : n.outputs) {
      for (ChannelId ch : port) nccl = nccl || g.channel(ch).kind == ChannelKind::kNccl;
    }
    if (nccl) ranked.push_back(m);
  }
  auto rank_of = [&](VertexId m) { return static_cast<int>(std::find(ranked.begin(), ranked.end(), m) - ranked.begin()); };
  int rank = rank_of(v);
  if (rank == static_cast<int>(ranked.size())) return;
  std::string group = "job" + std::to_string(job.id.value()) + "-gang" + std::to_string(g.vertex(v).gang.value()) + "-v" +
                      std::to_string(version);
  task["nccl"] = {{"group", group}, {"rank", rank}, {"nranks", ranked.size()}};
  nccl_groups_[group].insert(job.runs[v.value()].daemon);
  const VertexNode& node = g.vertex(v);
  for (size_t port = 0; port < node.inputs.size(); ++port) {
    const ChannelEdge& c = g.channel(node.inputs[port]);
    if (c.kind == ChannelKind::kNccl) task["inputs"][port]["peer_rank"] = rank_of(c.from);
  }
  for (size_t port = 0; port < node.outputs.size(); ++port) {
    if (node.outputs[port].empty() || g.channel(node.outputs[port].front()).kind != ChannelKind::kNccl) continue;
    for (size_t i = 0; i < node.outputs[port].size(); ++i) {
      task["outputs"][port]["channels"][i]["peer_rank"] = rank_of(g.channel(node.outputs[port][i]).to);
    }
  }
}

void Scheduler::RelayNcclId(const std::string& group, const std::string& id, DaemonId from) {
  auto it = nccl_groups_.find(group);
  if (it == nccl_groups_.end()) return;
  for (DaemonId d : it->second) {
    if (d != from && daemons_[d.value()]->alive) sink_.SendToDaemon(d, {{"op", "nccl_id"}, {"group", group}, {"id", id}});
  }
  nccl_groups_.erase(it);
}

bool Scheduler::AnySlotFree() const {
  for (const auto& d : daemons_) {
    if (d->alive && (d->free_cpus > 1e-9 || d->free_gpus > 0)) return true;
  }
  return false;
}

bool Scheduler::TryPlaceGang(Job& job, GangId gang) {
  const auto& members = job.g().gangs()[gang.value()].members;
  for (VertexId m : members) {
    if (ReadsAHeldOutput(job, m)) return false;
  }
  // Placed whole or not at all, so a gang that does not fit holds no slot (two jobs' gangs can
  // never deadlock on partial reservations).
  Job::GangWait& wait = job.gang_waits[gang.value()];
  const TimePoint start = clock_.Now();
  if (wait.epoch == capacity_epoch_ + 1 || start < wait.retry_after) return false;
  GangPlacement placement = PlaceGangOn(job, gang, /*idle=*/false);
  if (!placement.placed()) {
    // Tried again once capacity frees (Tick schedules), but no sooner than 100 times what
    // this search cost, capped at a second so that a freed slot is not missed for long: a gang
    // of a thousand members that cannot fit would otherwise take the job manager's thread on
    // every completion in the cluster. (So at most 1 % of the thread for searches under 10 ms,
    // and one search a second beyond.)
    wait.epoch = capacity_epoch_ + 1;
    wait.retry_after = clock_.Now() + std::min<Duration>(100 * (clock_.Now() - start), std::chrono::seconds(1));
    return false;
  }
  for (size_t i = 0; i < members.size(); ++i) {
    const std::string& group = job.g().stage_of(members[i]).affinity;
    if (!group.empty()) job.affinity[group] = placement.daemons[i];
  }
  uint32_t version = 0;
  for (VertexId m : members) version = std::max({version, job.runs[m.value()].version, job.runs[m.value()].dup_version});
  job.gang_version[gang.value()] = version + 1;
  // Every member's daemon is known before any task is written: producers address consumers.
  for (size_t i = 0; i < members.size(); ++i) job.runs[members[i].value()].daemon = placement.daemons[i];
  for (size_t i = 0; i < members.size(); ++i) Dispatch(job, members[i], *daemons_[placement.daemons[i].value()], /*duplicate=*/false);
  return true;
}

GangPlacement Scheduler::PlaceGangOn(const Job& job, GangId gang, bool idle) const {
  const JobGraph& g = job.g();
  const auto& members = g.gangs()[gang.value()].members;
  GangRequest request;
  request.pins = job.affinity;
  std::map<VertexId, size_t> index;
  for (VertexId m : members) {
    index[m] = request.members.size();
    GangMember member{g.vertex(m).name, g.stage_of(m).resources, g.stage_of(m).affinity, {}};
    for (ChannelId ch : g.vertex(m).inputs) {
      const ChannelEdge& c = g.channel(ch);
      const Run& p = job.runs[c.from.value()];
      if (IsLive(c.kind) || !p.daemon.valid()) continue;
      if (static_cast<size_t>(c.from_port) < p.output_bytes.size()) member.input_bytes[p.daemon] += p.output_bytes[c.from_port];
    }
    request.members.push_back(std::move(member));
  }
  // shm ends share a daemon.
  for (VertexId m : members) {
    for (ChannelId ch : g.vertex(m).inputs) {
      const ChannelEdge& c = g.channel(ch);
      if (c.kind == ChannelKind::kShm && index.count(c.from)) request.share_daemon.emplace_back(index[c.from], index[m]);
    }
  }
  std::vector<GangDaemon> daemons;
  for (const auto& d : daemons_) {
    if (!d->alive || d->awaiting) continue;
    daemons.push_back({d->id, LabelOf(*d, kHostLabel), LabelOf(*d, kRackLabel), idle ? d->spec.cpus : d->free_cpus,
                       idle ? d->spec.gpus : d->free_gpus, d->spec.cpus, d->spec.gpus});
  }
  return PlaceGang(request, daemons, *job.gang_needs, *policy_);
}

bool Scheduler::PinFits(const Job& job, const StageSpec& stage, const Daemon& d,
                        const std::map<std::string, DaemonId>& pins) const {
  return stage.affinity.empty() || job.gang_needs->PinFits(stage.affinity, {d.id, d.spec.cpus, d.spec.gpus}, pins);
}

void Scheduler::Dispatch(Job& job, VertexId v, Daemon& d, bool duplicate, const std::vector<VertexId>& after) {
  const JobGraph& g = job.g();
  const VertexNode& node = g.vertex(v);
  const StageSpec& stage = g.stage_of(v);
  Run& r = job.runs[v.value()];
  uint32_t version = std::max(r.version, r.dup_version) + 1;
  if (node.gang.valid()) version = job.gang_version[node.gang.value()];  // one version per gang attempt
  if (duplicate) {
    r.dup_version = version;
    r.dup_daemon = d.id;
    r.dup_started = clock_.Now();
  } else {
    r.state = VertexState::kRunning;
    r.version = version;
    r.daemon = d.id;
    r.started = clock_.Now();
    r.chained_after = after;
    job.running.insert(v.value());
  }
  d.free_cpus -= stage.resources.cpus;
  d.free_gpus -= stage.resources.gpus;
  ++d.running;

  Json inputs = Json::array();
  for (ChannelId ch : node.inputs) {
    const ChannelEdge& c = g.channel(ch);
    const Run& p = job.runs[c.from.value()];
    if (IsLive(c.kind)) {
      inputs.push_back({{"live", ChannelKindName(c.kind)},
                        {"key", {{"job", job.id.value()}, {"channel", ch.value()}, {"version", version}}}});
      continue;
    }
    // A producer still running (v is chained after it) has no counts yet: those it has are an
    // earlier attempt's.
    if (p.state == VertexState::kCompleted && static_cast<size_t>(c.from_port) < p.output_messages.size() &&
        p.output_messages[c.from_port] == 0) {
      inputs.push_back({{"empty", true}});  // nothing to fetch: the reader ends at once
      continue;
    }
    const Daemon& pd = *daemons_[p.daemon.value()];
    Json in = {{"key", {{"job", job.id.value()}, {"vertex", c.from.value()}, {"version", p.version}, {"port", c.from_port}}}};
    // A durable input names its copy too: the only source once the producer's store cannot
    // serve it (its daemon is gone, or the memory output was released after its consumers
    // completed), else the daemon's fallback.
    const bool durable = c.kind == ChannelKind::kDurable;
    if (durable) in["durable"] = DurablePath(job, c.from, p.version, c.from_port);
    const bool store_serves = pd.alive && !(p.state == VertexState::kCompleted && OutputReleased(g, c.from, p, c.from_port));
    if (!durable || store_serves) {
      in["local"] = p.daemon == d.id;
      in["host"] = pd.spec.data_host;
      in["port"] = pd.spec.data_port;
    }
    inputs.push_back(std::move(in));
  }
  Json outputs = Json::array();
  for (const auto& port : node.outputs) {
    const ChannelKind kind = PortKind(g, port);
    if (kind == ChannelKind::kDurable) {  // a memory output with a copy there
      outputs.push_back({{"durable", DurablePath(job, v, version, static_cast<int>(outputs.size()))}});
      continue;
    }
    if (!IsLive(kind)) {
      outputs.push_back(ChannelKindName(kind));
      continue;
    }
    // A live output goes straight to each consumer (placed with this gang): where and as what.
    Json channels = Json::array();
    for (ChannelId ch : port) {
      const Daemon& to = *daemons_[job.runs[g.channel(ch).to.value()].daemon.value()];
      channels.push_back({{"key", {{"job", job.id.value()}, {"channel", ch.value()}, {"version", version}}},
                          {"peer", to.spec.stream_endpoints}});
    }
    outputs.push_back({{"live", ChannelKindName(kind)}, {"channels", std::move(channels)}});
  }
  Json task = {{"job", job.id.value()},     {"vertex", v.value()},         {"version", version},
               {"name", node.name},         {"program", stage.program},    {"replica", node.replica},
               {"params", *node.params},    {"job_dir", job.job_dir},      {"threads", std::max(1, static_cast<int>(stage.resources.cpus))}, {"gpus", stage.resources.gpus},
               {"inputs", std::move(inputs)}, {"outputs", std::move(outputs)}};
  if (node.gang.valid()) AddNcclInfo(job, v, version, task);
  if (!after.empty()) {
    Json& list = task["after"] = Json::array();
    for (VertexId a : after) {
      const Run& p = job.runs[a.value()];
      list.push_back({{"vertex", a.value()}, {"version", p.version}});
      if (p.daemon != d.id) list.back()["remote"] = true;
    }
  }
  // Faults the job file injects into this attempt.
  const auto& faults = job.faults;
  for (size_t i = 0; i < faults.size(); ++i) {
    const FaultSpec& f = faults[i];
    if (!f.vertex || g.FindVertex(f.vertex->ToString()) != v) continue;
    bool armed = (!f.when.completed || job.completions >= static_cast<size_t>(*f.when.completed)) &&
                 (!f.when.after_ms || ElapsedMs(job) >= static_cast<double>(*f.when.after_ms));
    if (!armed) continue;
    if (f.kind == FaultKind::kFail &&
        std::find(f.attempts.begin(), f.attempts.end(), static_cast<int>(version)) != f.attempts.end()) {
      task["inject_failure"] = "injected fault " + f.pointer + ": attempt " + std::to_string(version) + " fails";
      job.faults_log.push_back({{"fault", "fail"}, {"vertex", node.name}, {"attempt", version}, {"at_ms", ElapsedMs(job)}});
    }
    if (f.kind == FaultKind::kDelay &&
        std::find(f.attempts.begin(), f.attempts.end(), static_cast<int>(version)) != f.attempts.end()) {
      task["delay_ms"] = f.ms;
      if (!job.fault_fired[i]) {
        job.fault_fired[i] = 1;
        job.faults_log.push_back({{"fault", "delay"}, {"vertex", node.name}, {"ms", f.ms}, {"at_ms", ElapsedMs(job)}});
      }
    }
  }
  for (ChannelId ch : node.inputs) {
    const ChannelEdge& c = g.channel(ch);
    const Run& p = job.runs[c.from.value()];
    uint64_t bytes = static_cast<size_t>(c.from_port) < p.output_bytes.size() ? p.output_bytes[c.from_port] : 0;
    (p.daemon == d.id ? job.local_input_bytes : job.remote_input_bytes) += bytes;
  }
  if (job.spans.size() < kMaxSpans) {
    job.open_spans[{v.value(), version}] = job.spans.size();
    job.spans.push_back({v.value(), version, d.id, ElapsedMs(job), -1, ""});
  }
  Json& batch = outbox_[d.id];
  if (batch.is_null()) batch = {{"op", "run"}, {"tasks", Json::array()}};
  batch["tasks"].push_back(std::move(task));
  Log(job, v, "version " + std::to_string(version) + (duplicate ? " (straggler duplicate)" : "") + " placed on " + d.spec.name +
                  (after.empty() ? "" : " chained after " + NameList(g, after)));
  if (!duplicate && !node.gang.valid()) ChainSuccessors(job, v);
}

void Scheduler::Flush() {
  for (auto& [daemon, msg] : std::exchange(stale_outbox_, {})) {
    if (daemons_[daemon.value()]->alive) sink_.SendToDaemon(daemon, msg);
  }
  auto batches = std::move(outbox_);
  outbox_.clear();
  for (auto& [daemon, msg] : batches) {
    if (daemons_[daemon.value()]->alive) sink_.SendToDaemon(daemon, msg);
  }
  for (auto it = release_outbox_.begin(); it != release_outbox_.end();) {
    const auto& [daemon, batch] = *it;
    if (!releases_due_ && batch.msg["keys"].size() < kReleaseBatchKeys && batch.bytes < kReleaseBatchBytes) {
      ++it;
      continue;
    }
    if (daemons_[daemon.value()]->alive && !batch.msg["keys"].empty()) sink_.SendToDaemon(daemon, batch.msg);
    it = release_outbox_.erase(it);
  }
  releases_due_ = false;
}

// ---- time and faults -------------------------------------------------------------------------

void Scheduler::Tick() {
  releases_due_ = true;
  RandomChaosStep();
  TimePoint now = clock_.Now();
  for (size_t i = 0; i < daemons_.size(); ++i) {
    const Daemon& d = *daemons_[i];
    if (d.awaiting && now > d.awaiting_until) DaemonLost(DaemonId(static_cast<uint32_t>(i)), d.awaiting_why);
  }
  for (auto it = jobs_.begin(); it != jobs_.end();) {
    Job& job = *it->second;
    if (job.state != JobState::kRunning) {
      it = (now - job.finished > options_.finished_job_ttl) ? jobs_.erase(it) : std::next(it);
      continue;
    }
    for (uint32_t v : std::vector<uint32_t>(job.running.begin(), job.running.end())) {
      Run& r = job.runs[v];
      double timeout_s = job.g().stage_of(VertexId(v)).timeout_s;
      if (!r.chained_after.empty()) continue;  // not started yet
      if (timeout_s <= 0 || now - r.started < std::chrono::duration<double>(timeout_s)) continue;
      sink_.SendToDaemon(r.daemon, {{"op", "cancel"}, {"job", job.id.value()}, {"vertex", v}, {"version", r.version}});
      Fail(job, VertexId(v), FailureClass::kTimeout, "ran longer than timeout_s=" + std::to_string(timeout_s), true);
      if (job.state != JobState::kRunning) break;
    }
    if (job.state == JobState::kRunning) {
      LaunchDuplicates(job);
      CheckFaults(job);
    }
    ++it;
  }
  Schedule();
}

void Scheduler::LaunchDuplicates(Job& job) {
  if (options_.straggler_factor <= 0) return;
  const JobGraph& g = job.g();
  TimePoint now = clock_.Now();
  std::map<int, double> median_s;  // per stage with enough completed peers
  for (uint32_t v : std::vector<uint32_t>(job.running.begin(), job.running.end())) {
    Run& r = job.runs[v];
    if (r.dup_version || g.vertex(VertexId(v)).gang.valid()) continue;  // gangs restart whole instead
    if (!r.chained_after.empty()) continue;                              // not started yet
    int stage = g.vertex(VertexId(v)).stage;
    auto& done = job.stage_seconds[stage];
    int replicas = g.spec().stages[stage].replicas;
    if (done.empty() || done.size() < options_.straggler_fraction * replicas) continue;
    auto m = median_s.find(stage);
    if (m == median_s.end()) {
      std::vector<double> copy = done;
      std::nth_element(copy.begin(), copy.begin() + copy.size() / 2, copy.end());
      m = median_s.emplace(stage, copy[copy.size() / 2]).first;
    }
    double elapsed = std::chrono::duration<double>(now - r.started).count();
    if (elapsed < options_.straggler_factor * m->second ||
        now - r.started < options_.straggler_min) {
      continue;
    }
    // A daemon other than the straggler's, by the same placement rules.
    const Resources& need = g.stage_of(VertexId(v)).resources;
    Daemon* target = nullptr;
    for (auto& d : daemons_) {
      if (d->alive && d->id != r.daemon && d->free_cpus + 1e-9 >= need.cpus && d->free_gpus >= need.gpus &&
          (!target || d->free_cpus > target->free_cpus)) {
        target = d.get();
      }
    }
    if (!target) continue;
    char why[160];
    std::snprintf(why, sizeof(why), "running %.2f s, %.1fx its stage's median of %.3f s", elapsed, elapsed / std::max(m->second, 1e-9),
                  m->second);
    RecordRecovery(job, VertexId(v), r.version, "straggler", why, false);
    Dispatch(job, VertexId(v), *target, /*duplicate=*/true);
  }
}

Result<Json> Scheduler::Chaos(const Json& request) {
  std::string action = request.value("action", "");
  auto find_daemon = [&](const std::string& name) -> Daemon* {
    for (auto& d : daemons_) {
      if (d->alive && d->spec.name == name) return d.get();
    }
    return nullptr;
  };
  auto record_everywhere = [&](Json record) {
    for (auto& [id, job] : jobs_) {
      if (job->state != JobState::kRunning) continue;
      record["at_ms"] = ElapsedMs(*job);
      job->faults_log.push_back(record);
    }
  };
  if (action == "kill" || action == "cut") {
    std::string name = request.value("daemon", "");
    Daemon* d = find_daemon(name);
    if (!d) return Status::NotFound("no live daemon named \"" + name + "\"");
    int64_t ms = request.value("ms", int64_t{2000});
    if (action == "cut" && (ms < 1 || ms > 3'600'000)) {
      return Status::InvalidArgument("a cut lasts 1 to 3600000 ms, got " + std::to_string(ms));
    }
    Flush();
    ExpectInjectedLoss(*d);
    sink_.SendToDaemon(d->id, action == "kill" ? Json{{"op", "kill"}} : Json{{"op", "cut"}, {"ms", ms}});
    Json record = {{"fault", action == "kill" ? "kill_daemon" : "cut_daemon"}, {"daemon", name}, {"source", "chaos"}};
    if (action == "cut") record["ms"] = ms;
    record_everywhere(record);
    return record;
  }
  if (action == "fail" || action == "delay" || action == "corrupt" || action == "drop") {
    Job* job = FindJob(JobId(request.value("job", uint64_t{0})));
    if (!job || job->state != JobState::kRunning) return Status::NotFound("no running job " + std::to_string(request.value("job", 0)));
    std::string vertex = request.value("vertex", "");
    VertexId v = job->g().FindVertex(vertex);
    if (!v.valid()) return Status::NotFound("job " + job->id.ToString() + " has no vertex \"" + vertex + "\"");
    FaultSpec f;
    f.pointer = "chaos";
    f.vertex = ParseEndpointRef(job->g().vertex(v).name);
    const Run& r = job->runs[v.value()];
    uint32_t next = std::max(r.version, r.dup_version) + 1;
    if (action == "fail" || action == "delay") {
      f.kind = action == "fail" ? FaultKind::kFail : FaultKind::kDelay;
      // The job file's bounds (job_parser.cc): attempt 0 never comes, and a delay past a day
      // would hold the vertex's slot beyond any timeout. Read wide, so 2^32+1 is not 1.
      const auto attempts = request.value("attempts", std::vector<int64_t>{next});
      if (attempts.empty()) return Status::InvalidArgument("no attempt numbers");
      for (int64_t a : attempts) {
        if (a < 1 || a > 1000) return Status::InvalidArgument("attempt numbers run from 1 to 1000, got " + std::to_string(a));
        f.attempts.push_back(static_cast<int>(a));
      }
      f.ms = request.value("ms", int64_t{1000});
      if (f.ms < 0 || f.ms > 86'400'000) return Status::InvalidArgument("a delay is 0 to 86400000 ms, got " + std::to_string(f.ms));
    } else {
      f.kind = action == "corrupt" ? FaultKind::kCorruptOutputOf : FaultKind::kDropOutputOf;
    }
    job->faults.push_back(f);
    job->fault_fired.push_back(0);
    Log(*job, v, "chaos: " + action + " armed");
    CheckFaults(*job);
    return Json{{"fault", action}, {"vertex", job->g().vertex(v).name}, {"job", job->id.value()}, {"armed", true}};
  }
  if (action == "random") {
    RandomChaos chaos;
    chaos.rng.seed(request.value("seed", uint64_t{1}));
    const int64_t interval_ms = request.value("interval_ms", int64_t{500});
    const int64_t duration_ms = request.value("duration_ms", int64_t{10000});
    chaos.kinds = request.value("kinds", std::vector<std::string>{"kill", "fail", "delay", "corrupt", "cut"});
    chaos.cut_ms = request.value("cut_ms", int64_t{1000});
    if (interval_ms < 1) return Status::InvalidArgument("chaos interval must be at least 1 ms, got " + std::to_string(interval_ms));
    if (duration_ms < 0) return Status::InvalidArgument("chaos duration must not be negative, got " + std::to_string(duration_ms) + " ms");
    if (chaos.cut_ms < 0) return Status::InvalidArgument("chaos cut must not be negative, got " + std::to_string(chaos.cut_ms) + " ms");
    if (chaos.kinds.empty()) return Status::InvalidArgument("no chaos kinds; expected some of kill, fail, delay, corrupt, cut");
    for (const auto& k : chaos.kinds) {
      if (k != "kill" && k != "fail" && k != "delay" && k != "corrupt" && k != "cut") {
        return Status::InvalidArgument("unknown chaos kind \"" + k + "\"; expected kill, fail, delay, corrupt or cut");
      }
    }
    chaos.interval = std::chrono::milliseconds(interval_ms);
    chaos.until = clock_.Now() + std::chrono::milliseconds(duration_ms);
    chaos.next = clock_.Now() + chaos.interval;
    chaos_ = std::move(chaos);
    return Json{{"random", true}, {"kinds", chaos_->kinds}};
  }
  if (action == "stop") {
    chaos_.reset();
    return Json{{"random", false}};
  }
  return Status::InvalidArgument("unknown chaos action \"" + action + "\"; expected kill, cut, fail, delay, corrupt, drop, random or stop");
}

void Scheduler::RandomChaosStep() {
  if (!chaos_) return;
  TimePoint now = clock_.Now();
  if (now > chaos_->until) {
    chaos_.reset();
    return;
  }
  if (now < chaos_->next) return;
  chaos_->next = now + chaos_->interval;
  auto& rng = chaos_->rng;
  const std::string kind = chaos_->kinds[rng() % chaos_->kinds.size()];
  std::vector<Daemon*> alive;
  for (auto& d : daemons_) {
    if (d->alive) alive.push_back(d.get());
  }
  if (kind == "kill" || kind == "cut") {
    if (alive.size() < 2) return;  // never take the last daemon
    Daemon* d = alive[rng() % alive.size()];
    (void)Chaos({{"action", kind}, {"daemon", d->spec.name}, {"ms", chaos_->cut_ms}});
    return;
  }
  std::vector<Job*> running;
  for (auto& [id, job] : jobs_) {
    if (job->state == JobState::kRunning) running.push_back(job.get());
  }
  if (running.empty()) return;
  Job& job = *running[rng() % running.size()];
  std::vector<uint32_t> targets;
  for (uint32_t v = 0; v < job.runs.size(); ++v) {
    const Run& r = job.runs[v];
    // Random chaos proves a job survives faults: it never spends a vertex's last attempt.
    bool spare = r.charged + 1 < job.g().stage_of(VertexId(v)).max_attempts;
    bool waiting = (r.state == VertexState::kWaiting || r.state == VertexState::kReady) && (kind != "fail" || spare);
    bool stored = r.state == VertexState::kCompleted && OutputNeeded(job, VertexId(v)) && !job.g().vertex(VertexId(v)).gang.valid();
    if (kind == "corrupt" ? stored : waiting) targets.push_back(v);
  }
  if (targets.empty()) return;
  const std::string& name = job.g().vertex(VertexId(targets[rng() % targets.size()])).name;
  (void)Chaos({{"action", kind}, {"job", job.id.value()}, {"vertex", name}, {"ms", 200}});
}

void Scheduler::ExpectInjectedLoss(Daemon& d) {
  // A killed or cut daemon's connection closes at once; the window covers the message's way
  // there. A longer one does no harm: it only spares the attempts running there a count.
  d.loss_injected_until = clock_.Now() + kInjectedLossWindow;
}

void Scheduler::CheckFaults(Job& job) {
  const JobGraph& g = job.g();
  const auto& faults = job.faults;
  for (size_t i = 0; i < faults.size(); ++i) {
    const FaultSpec& f = faults[i];
    if (job.fault_fired[i] || f.kind == FaultKind::kFail || f.kind == FaultKind::kDelay) continue;
    if (f.when.completed && job.completions < static_cast<size_t>(*f.when.completed)) continue;
    if (f.when.after_ms && ElapsedMs(job) < static_cast<double>(*f.when.after_ms)) continue;
    Daemon* target = nullptr;
    VertexId v = f.vertex ? g.FindVertex(f.vertex->ToString()) : VertexId::Invalid();
    if (f.kind == FaultKind::kKillDaemon) {
      for (auto& d : daemons_) {
        if (d->alive && d->spec.name == f.daemon) target = d.get();
      }
      if (!target) continue;  // not registered (yet)
    } else {
      const Run& r = job.runs[v.value()];
      if (!r.daemon.valid()) continue;  // not placed yet: fire at the first chance after
      bool needs_output = f.kind == FaultKind::kCorruptOutputOf || f.kind == FaultKind::kDropOutputOf;
      if (needs_output && r.state != VertexState::kCompleted) continue;
      target = daemons_[r.daemon.value()].get();
      if (!target->alive) continue;
    }
    job.fault_fired[i] = 1;
    Json record = {{"fault", FaultKindName(f.kind)}, {"daemon", target->spec.name}, {"at_ms", ElapsedMs(job)}};
    if (v.valid()) record["vertex"] = g.vertex(v).name;
    job.faults_log.push_back(record);
    Log(job, v, "injecting " + std::string(FaultKindName(f.kind)) + " on daemon " + target->spec.name);
    if (f.kind == FaultKind::kKillDaemon || f.kind == FaultKind::kKillDaemonOf) {
      Flush();
      ExpectInjectedLoss(*target);
      sink_.SendToDaemon(target->id, {{"op", "kill"}});
    } else {
      Json keys = Json::array();
      const Run& r = job.runs[v.value()];
      for (size_t p = 0; p < g.vertex(v).outputs.size(); ++p) {
        keys.push_back({{"job", job.id.value()}, {"vertex", v.value()}, {"version", r.version}, {"port", p}});
      }
      sink_.SendToDaemon(target->id, {{"op", f.kind == FaultKind::kCorruptOutputOf ? "corrupt" : "drop"}, {"keys", keys}});
    }
  }
}

// ---- queries ---------------------------------------------------------------------------------

bool Scheduler::HasJob(JobId id) const { return FindJob(id) != nullptr; }

std::optional<JobState> Scheduler::StateOf(JobId id) const {
  const Job* job = FindJob(id);
  if (!job) return std::nullopt;
  return job->state;
}

std::string Scheduler::WhyNotPlaced(const Job& job, VertexId v, std::map<uint32_t, std::string>& gang_reasons) const {
  const JobGraph& g = job.g();
  const StageSpec& stage = g.stage_of(v);
  auto describe = [](double cpus, int gpus) { return fmt::format("{:g} cpus", cpus) + (gpus ? fmt::format(" and {} gpus", gpus) : ""); };
  if (GangId gang = g.vertex(v).gang; gang.valid()) {
    auto [cached, added] = gang_reasons.try_emplace(gang.value());
    if (!added) return cached->second;
    const auto& members = g.gangs()[gang.value()].members;
    std::string& why = cached->second;
    for (VertexId m : members) {
      const Run& r = job.runs[m.value()];
      if (r.state == VertexState::kWaiting) {
        return why = fmt::format("its gang of {} waits for its member {} to be ready", members.size(), g.vertex(m).name);
      }
      if (r.state == VertexState::kReady && ReadsAHeldOutput(job, m)) {
        return why = fmt::format("its gang of {} waits for its member {}'s input, held for its daemon's return", members.size(),
                                 g.vertex(m).name);
      }
    }
    GangPlacement idle = PlaceGangOn(job, gang, /*idle=*/true);
    if (!idle.placed() && !idle.gave_up) {
      return why = fmt::format("its gang of {} cannot be placed on the live daemons even when they are idle: {}",
                               members.size(), idle.why_not);
    }
    const Resources whole = job.gang_needs->Whole(gang);
    why = fmt::format("its gang of {} waits for {} free at once", members.size(), describe(whole.cpus, whole.gpus));
    if (idle.gave_up) why += " (whether the live daemons could hold it even idle was not settled: " + idle.why_not + ")";
    return why;
  }
  const Resources& need = stage.resources;
  auto holds = [&](const Daemon& d) { return d.alive && d.spec.cpus + 1e-9 >= need.cpus && d.spec.gpus >= need.gpus; };
  if (std::none_of(daemons_.begin(), daemons_.end(), [&](const auto& d) { return holds(*d); })) {
    return "needs " + describe(need.cpus, need.gpus) + ", more than any live daemon has";
  }
  if (!stage.affinity.empty() && !job.affinity.count(stage.affinity) &&
      std::none_of(daemons_.begin(), daemons_.end(),
                   [&](const auto& d) { return d->alive && PinFits(job, stage, *d, job.affinity); })) {
    return "no live daemon can hold affinity group " + stage.affinity + "'s vertices and the gangs they join";
  }
  return "no daemon has " + describe(need.cpus, need.gpus) + " free";
}

Json Scheduler::JobStatus(JobId id) const {
  const Job* job_ptr = FindJob(id);
  if (!job_ptr) return nullptr;
  const Job& job = *job_ptr;
  const JobGraph& g = job.g();
  Json stages = Json::array();
  size_t counts[4] = {0, 0, 0, 0};
  for (size_t s = 0; s < g.spec().stages.size(); ++s) {
    const StageSpec& st = g.spec().stages[s];
    size_t c[4] = {0, 0, 0, 0};
    size_t failed_attempts = 0;
    for (int i = 0; i < st.replicas; ++i) {
      const Run& r = job.runs[g.stage_base(static_cast<int>(s)).value() + i];
      ++c[static_cast<int>(r.state)];
      failed_attempts += r.charged;
    }
    for (int k = 0; k < 4; ++k) counts[k] += c[k];
    stages.push_back({{"name", st.name}, {"program", st.program}, {"total", st.replicas}, {"completed", c[3]},
                      {"running", c[2]}, {"ready", c[1]}, {"waiting", c[0]}, {"failed_attempts", failed_attempts}});
  }
  // Why vertices wait: the first few, each with its first unfinished predecessor or missing slot.
  Json waiting = Json::array();
  std::map<uint32_t, std::string> gang_reasons;  // one search per gang and call
  for (const auto& v : g.vertices()) {
    if (waiting.size() >= 5 || job.state != JobState::kRunning) break;
    const Run& r = job.runs[v.id.value()];
    if (r.state == VertexState::kReady && ReadsAHeldOutput(job, v.id)) {
      waiting.push_back({{"vertex", v.name}, {"reason", "ready; reads an output held for its daemon's return"}});
    } else if (r.state == VertexState::kReady) {
      waiting.push_back({{"vertex", v.name}, {"reason", "ready; " + WhyNotPlaced(job, v.id, gang_reasons)}});
    } else if (r.state == VertexState::kWaiting) {
      std::string on;
      auto check = [&](ChannelId ch) {
        VertexId p = g.channel(ch).from;
        if (on.empty() && job.runs[p.value()].state != VertexState::kCompleted) {
          on = g.vertex(p).name + " (" + std::string(VertexStateName(job.runs[p.value()].state)) + ")";
        }
      };
      for (ChannelId ch : v.inputs) check(ch);
      for (ChannelId ch : v.order_in) check(ch);
      waiting.push_back({{"vertex", v.name}, {"reason", on.empty() ? "waiting" : "waiting for " + on}});
    }
  }
  Json out = {{"id", job.id.value()},
              {"name", g.spec().name},
              {"state", JobStateName(job.state)},
              {"elapsed_s", ElapsedMs(job) / 1000.0},
              {"vertices", {{"total", job.runs.size()}, {"completed", counts[3]}, {"running", counts[2]},
                            {"ready", counts[1]}, {"waiting", counts[0]}}},
              {"stages", stages},
              {"input_bytes", {{"local", job.local_input_bytes}, {"remote", job.remote_input_bytes}}},
              {"waiting", waiting},
              {"faults", job.faults_log},
              {"recoveries", job.recoveries}};
  if (!job.failure.empty()) out["failure"] = job.failure;
  if (job.progress.is_object()) {
    Json progress = job.progress;
    if (job.last_images_ms > job.first_images_ms) {
      progress["images_per_s"] = (job.last_images - job.first_images) / ((job.last_images_ms - job.first_images_ms) / 1000.0);
    }
    out["progress"] = std::move(progress);
  }
  return out;
}

Json Scheduler::JobsTable() const {
  Json rows = Json::array();
  for (const auto& [id, job] : jobs_) {
    rows.push_back({{"id", id.value()}, {"name", job->g().spec().name}, {"state", JobStateName(job->state)},
                    {"completed", job->completed}, {"total", job->runs.size()}, {"elapsed_s", ElapsedMs(*job) / 1000.0}});
  }
  return rows;
}

Json Scheduler::DaemonsTable() const {
  // A daemon that registers again after its grace gets a new id (runs still name the old one),
  // so a name can have several rows: every one but the newest is superseded.
  std::unordered_map<std::string_view, size_t> newest;
  for (size_t i = 0; i < daemons_.size(); ++i) newest[daemons_[i]->spec.name] = i;
  Json rows = Json::array();
  for (size_t i = 0; i < daemons_.size(); ++i) {
    const Daemon& d = *daemons_[i];
    // Tasks chained after an attempt take its slots ahead of time: free_cpus dips below 0 until it ends.
    const char* state = d.alive ? "alive" : d.awaiting ? "awaited" : "lost";
    rows.push_back({{"name", d.spec.name}, {"alive", d.alive}, {"state", state}, {"superseded", newest[d.spec.name] != i},
                    {"cpus", d.spec.cpus}, {"free_cpus", std::max(0.0, d.free_cpus)}, {"gpus", d.spec.gpus}, {"running", d.running},
                    {"labels", d.spec.labels}, {"data", d.spec.data_port ? d.spec.data_host + ":" + std::to_string(d.spec.data_port) : ""},
                    {"control", d.spec.control}});
  }
  return rows;
}

Json Scheduler::Logs(JobId id, const std::string& vertex) const {
  const Job* job = FindJob(id);
  if (!job) return nullptr;
  VertexId only = vertex.empty() ? VertexId::Invalid() : job->g().FindVertex(vertex);
  if (!vertex.empty() && !only.valid()) return nullptr;
  Json lines = Json::array();
  for (const auto& [v, line] : job->log) {
    if (vertex.empty() || v == only) lines.push_back(line);
  }
  return lines;
}

Result<Json> Scheduler::OutputLocations(JobId id) const {
  const Job* job = FindJob(id);
  if (!job) return Status::NotFound("no job " + id.ToString());
  if (job->state != JobState::kCompleted) {
    return Status::FailedPrecondition("job " + id.ToString() + " is " + std::string(JobStateName(job->state)));
  }
  Json out = Json::array();
  for (const auto& o : job->g().spec().outputs) {
    VertexId v = job->g().FindVertex(o.from.ToString());
    if (!v.valid() || job->runs[v.value()].state != VertexState::kCompleted ||
        job->runs[v.value()].daemon.value() >= daemons_.size()) {
      return Status::Internal("job " + id.ToString() + " completed but its output " + o.from.ToString() +
                              " has no completed attempt (a scheduler bug)");
    }
    const Run& r = job->runs[v.value()];
    const Daemon& d = *daemons_[r.daemon.value()];
    out.push_back({{"path", o.path}, {"vertex", job->g().vertex(v).name}, {"host", d.spec.data_host},
                   {"port", d.spec.data_port}, {"alive", d.alive},
                   {"key", {{"job", id.value()}, {"vertex", v.value()}, {"version", r.version}, {"port", o.port}}}});
  }
  return out;
}

}  // namespace copse::jm
