#include "jobmanager/daemon_messages.h"
#include "jobmanager/scheduler_state.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <numeric>
#include <string_view>

namespace copse::jm {

namespace {

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

}  // namespace

std::shared_ptr<spdlog::logger> SchedLog() {
  static auto log = Logger("sched");
  return log;
}

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

Scheduler::Scheduler(DaemonSink& sink, const Clock& clock, SchedulerOptions options)
    : sink_(sink), clock_(clock), options_(options), policy_(MakePlacementPolicy(options_.placement, options_.locality_wait)) {
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

AttemptReport AttemptReport::From(const protocol::AttemptReport& a) {
  AttemptReport r;
  r.job = JobId(a.job());
  r.vertex = VertexId(a.vertex());
  r.version = a.version();
  r.ok = a.ok();
  r.error = a.error();
  r.failure = a.ok() ? protocol::FAILURE_PROGRAM_ERROR : a.failure();
  // A port beyond any input stays beyond them (the scheduler says so), never "no port".
  r.lost_input_port = a.has_lost_input() ? static_cast<int>(std::min<uint32_t>(a.lost_input(), INT32_MAX)) : -1;
  r.lost_input_unreachable = a.lost_input_unreachable();
  r.lost_input_version = a.lost_input_version();
  r.output_bytes.assign(a.output_bytes().begin(), a.output_bytes().end());
  r.output_messages.assign(a.output_messages().begin(), a.output_messages().end());
  r.duration_ms = a.duration_ms();
  r.deterministic = a.deterministic();
  if (!a.progress_json().empty()) {
    // The program's figures, shown as they are; not an object: none.
    if (auto figures = ParseJson(a.progress_json(), "progress"); figures.ok() && figures->is_object())
      r.progress = std::move(*figures);
  }
  return r;
}

double Scheduler::ElapsedMs(const Job& job) const {
  TimePoint end = job.state == JobState::kRunning ? clock_.Now() : job.finished;
  return std::chrono::duration<double, std::milli>(end - job.started).count();
}

void Scheduler::Log(Job& job, VertexId v, std::string text) {
  // One string, formatted in place: a line per dispatch and per completion.
  std::string line;
  line.reserve(16 + (v.valid() ? job.g().vertex(v).name.size() + 1 : 0) + text.size());
  fmt::format_to(std::back_inserter(line), "{:10.3f}s ", ElapsedMs(job) / 1000.0);
  if (v.valid()) line.append(job.g().vertex(v).name).push_back(' ');
  line += text;
  SchedLog()->info("job={} {}", job.id.value(), line);
  if (history_) history_->JobLine(job.id, v, line);
  if (job.log.size() < kMaxLogLines) job.log.push_back({v, std::move(line)});
}

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
    job->durable_dir = (std::filesystem::path(job->job_dir) / job->g().spec().durable_dir / ("job" + std::to_string(id.value())))
                           .lexically_normal()
                           .string();
  }
  job->started = clock_.Now();
  job->submitted_unix_ms = clock_.UnixMs();
  job->runs.resize(job->g().vertices().size());
  job->faults = job->g().spec().faults;
  job->fault_fired.assign(job->faults.size(), 0);
  job->declared.assign(job->runs.size(), 0);
  job->settled.assign(job->runs.size(), 0);
  for (const auto& st : job->g().spec().stages) job->retains = job->retains || st.RetainsAny();
  job->mirrors = job->g().ChannelCounts()[static_cast<size_t>(ChannelKind::kMirrored)] > 0;
  job->stage_seconds.resize(job->g().spec().stages.size());
  job->gang_version.assign(job->g().gangs().size(), 0);
  job->gang_waits.assign(job->g().gangs().size(), {});
  job->gang_needs.emplace(job->g());
  for (const auto& o : job->g().spec().outputs) {
    const uint32_t v = job->g().FindVertex(o.from.ToString()).value();
    if (!job->declared[v]) job->declared_vertices.push_back(v);
    job->declared[v] = 1;
  }
  Job& j = *job;
  jobs_[j.id] = std::move(job);
  return j;
}

JobId Scheduler::Submit(std::shared_ptr<const JobGraph> graph, std::string job_dir) {
  Job& j = NewJob(JobId(next_job_++), std::move(graph), std::move(job_dir));
  ++counters_.jobs_submitted;
  Journal(JobRecord(j));
  RemoveDurableCopies(j);  // an earlier job manager's job of the same id left them
  Log(j, VertexId::Invalid(),
      "submitted: " + std::to_string(j.runs.size()) + " vertices, " + std::to_string(j.g().channels().size()) + " channels");
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
      if (pr.state != VertexState::kCompleted) continue;
      if (OutputReleased(g, p, pr, c.from_port)) {
        if (PromoteMirror(job, p, "was released and is needed again by " + g.vertex(*it).name)) continue;
        pr.released = pr.retained_released = false;
        Regenerate(job, p, "its released output is needed again by " + g.vertex(*it).name);
      } else if (pr.daemon.valid() && pr.daemon.value() < daemons_.size()) {
        // On a daemon gone for good (neither alive nor awaited back): when it was lost nothing
        // needed this output, so it was left; now something does. Found by the multi-host
        // soak: a restarted job manager sent the consumer an input located at a daemon that
        // never came back (with no address), and every daemon refused it. A daemon still
        // awaited keeps its outputs for now: after a job manager restart it is most likely
        // alive, memory outputs and all, and registers again within the recovery grace.
        const Daemon& d = *daemons_[pr.daemon.value()];
        if (!d.alive && !d.awaiting && !PromoteMirror(job, p, "was on lost daemon " + d.spec.name)) {
          Regenerate(job, p, "its output was on lost daemon " + d.spec.name + ", and " + g.vertex(*it).name + " needs it again");
          if (pr.state != VertexState::kCompleted) pr.lost_with_daemon_version = pr.version;
        }
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
  // Computed when a vertex first becomes ready: a completed job restored after a restart (a
  // million vertices, perhaps) never needs it.
  if (job.priority.empty()) job.priority = Priorities(job.g());
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
  // report latencies (or a chained attempt's wait), shifted by one report's latency. Not the
  // later of that and the start noted here: a chained attempt starts on its daemon the moment
  // the attempt before it ends there, before this job manager hears of that end.
  if (ran_ms >= 0) span.start_ms = std::max(0.0, span.end_ms - ran_ms);
  span.outcome = outcome;
  span.log_lines_before_end = job.log.size();
  job.open_spans.erase(it);
  if (history_) {
    const VertexNode& node = job.g().vertex(v);
    history_->JobSpan(
        job.id, {span.vertex, span.version, span.start_ms, span.end_ms, span.outcome, daemons_[span.daemon.value()]->spec.name,
                 node.name, job.g().spec().stages[node.stage].name, span.log_lines_before_end});
  }
}

Result<TraceSnapshot> Scheduler::Trace(JobId id, size_t max_spans) const {
  const Job* job = FindJob(id);
  if (!job) return Status::NotFound("no job " + id.ToString());
  TraceSnapshot snap;
  snap.job = id.value();
  snap.name = job->g().spec().name;
  snap.state = JobStateName(job->state);
  snap.now_ms = ElapsedMs(*job);
  snap.graph = job->graph;
  std::map<std::string, size_t> registrations;  // per name: how many so far
  for (const auto& d : daemons_) ++registrations[d->spec.name];
  std::map<std::string, size_t> seen;
  snap.daemons.reserve(daemons_.size());
  for (const auto& d : daemons_) {
    const size_t n = ++seen[d->spec.name];
    snap.daemons.emplace_back(d->spec.name, registrations[d->spec.name] > 1 ? n : 0);
  }
  const size_t first = job->spans.size() > max_spans ? job->spans.size() - max_spans : 0;
  snap.total_spans = job->spans.size();
  snap.spans.reserve(job->spans.size() - first);
  for (size_t i = first; i < job->spans.size(); ++i) {
    const auto& s = job->spans[i];
    snap.spans.push_back({s.vertex, s.version, s.daemon.value(), s.start_ms, s.end_ms, s.outcome});
  }
  return snap;
}

void Scheduler::FreeSlot(Job& job, VertexId v, DaemonId daemon) {
  if (!daemon.valid()) return;
  Daemon& d = *daemons_[daemon.value()];
  if (d.alive) {
    const auto& res = job.g().stage_of(v).resources;
    d.free_cpus += res.cpus;
    d.free_gpus += res.gpus;
    d.free_memory_mb += res.memory_mb;
    ++capacity_epoch_;
  }
  if (d.running) --d.running;
}

void Scheduler::ReleaseSlots(Job& job, VertexId v, std::string_view outcome) {
  Run& r = job.runs[v.value()];
  if (r.state != VertexState::kRunning) return;
  job.running.erase(v.value());
  CloseSpan(job, v, r.version, std::string(outcome));
  if (r.dup_version) CloseSpan(job, v, r.dup_version, std::string(outcome));
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
      sink_.SendToDaemon(other, daemon_msg::Cancel(job.id, v, other_version));
    }
    FreeSlot(job, v, other);
    if (from_dup) {
      WithdrawRemoteChains(job, v);  // they wait for the original's outputs
      r.version = r.dup_version;
      r.daemon = r.dup_daemon;
    }
    r.dup_version = 0;
    Log(job, v,
        "version " + std::to_string(rep.version) + (from_dup ? " (the duplicate)" : " (the original)") +
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
  Log(job, v,
      "version " + std::to_string(rep.version) + " failed while version " + std::to_string(r.version) +
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
  const bool input_lost = !rep.ok && rep.failure == protocol::FAILURE_INPUT_LOST && rep.lost_input_port >= 0;
  if (rep.ok) {
    Complete(*job, rep.vertex, rep);
  } else if (input_lost && static_cast<size_t>(rep.lost_input_port) >= inputs.size()) {
    Fail(*job, rep.vertex, protocol::FAILURE_PROGRAM_ERROR,
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
    if (rep.lost_input_version != 0 && rep.lost_input_version != pr.version) {
      // It read a version of its input that was re-run meanwhile (the consumer was sent before
      // the producer's new version existed): run it again on the new one, nothing regenerated.
      Fail(*job, rep.vertex, protocol::FAILURE_INPUT_LOST,
           rep.error + " (a superseded version " + std::to_string(rep.lost_input_version) + "; now " +
               std::to_string(pr.version) + ")",
           /*charge=*/false);
      RecomputePending(*job);
      Schedule();
      return;
    }
    const Daemon* holder = pr.state == VertexState::kCompleted && pr.daemon.valid() ? daemons_[pr.daemon.value()].get() : nullptr;
    bool held = rep.lost_input_unreachable && holder && (holder->awaiting || holder->returned_at > r.started);
    // The output moved to its mirror after this attempt started (it read the old place), or
    // moves there now: the consumer runs again, its producer does not.
    const bool mirrored_port = job->mirrors && MirroredPort(g, producer) == static_cast<size_t>(in.from_port);
    const bool moved = mirrored_port && !held && pr.state == VertexState::kCompleted &&
                       (pr.moved > r.dispatched_after_moves ||
                        PromoteMirror(*job, producer, "could not be read by " + g.vertex(rep.vertex).name + ": " + rep.error));
    if (moved) {
      Fail(*job, rep.vertex, protocol::FAILURE_INPUT_LOST, rep.error, /*charge=*/false);
      RecomputePending(*job);
      Schedule();
      return;
    }
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
      auto lost =
          std::find_if(r.inputs_lost.begin(), r.inputs_lost.end(), [&](const auto& p) { return p.first == rep.lost_input_port; });
      if (lost == r.inputs_lost.end()) lost = r.inputs_lost.insert(r.inputs_lost.end(), {rep.lost_input_port, 0});
      if (++lost->second >= kMaxInputLosses) {
        FinishJob(*job, JobState::kFailed,
                  "vertex " + g.vertex(rep.vertex).name + " could not read input " + std::to_string(rep.lost_input_port) +
                      " (from " + g.vertex(producer).name + ") " + std::to_string(lost->second) +
                      " times, its producer re-run each time: " + rep.error);
        Schedule();
        return;
      }
    }
    Fail(*job, rep.vertex, protocol::FAILURE_INPUT_LOST, rep.error, /*charge=*/false);
    if (suspect) {
      Log(*job, producer, "daemon " + holder->spec.name + " could not be reached for its output; held for its loss or return");
    } else if (held) {
      Log(*job, producer, "output unreadable at daemon " + holder->spec.name + "'s old address; held for its return");
    } else {
      Regenerate(*job, producer, "consumer " + g.vertex(rep.vertex).name + " could not read it: " + rep.error);
    }
    RecomputePending(*job);
  } else {
    Fail(*job, rep.vertex, rep.failure, rep.error, rep.failure != protocol::FAILURE_CANCELLED,
         rep.deterministic && rep.failure == protocol::FAILURE_PROGRAM_ERROR);
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
  // What placement achieved, counted when the reader succeeded: a chained task is sent before
  // its producers' sizes are known, so counting at dispatch missed nearly all of a pipeline's.
  for (ChannelId ch : job.g().vertex(v).inputs) {
    const ChannelEdge& c = job.g().channel(ch);
    const Run& p = job.runs[c.from.value()];
    const uint64_t bytes = static_cast<size_t>(c.from_port) < p.output_bytes.size() ? p.output_bytes[c.from_port] : 0;
    (p.daemon == r.daemon ? job.local_input_bytes : job.remote_input_bytes) += bytes;
    (p.daemon == r.daemon ? counters_.input_bytes_local : counters_.input_bytes_remote) += bytes;
  }
  ++counters_.attempts_completed;
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
  if (job.mirrors) StartMirror(job, v);
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
    if (c.state == VertexState::kRunning &&
        std::find(c.chained_after.begin(), c.chained_after.end(), u) != c.chained_after.end()) {
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
  if (!options_.chain_dispatch || job.state != JobState::kRunning || r.state != VertexState::kWaiting || r.pending == 0 ||
      r.pending > kMaxChainedAfter || node.gang.valid()) {
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
  Resources room{d.free_cpus, d.free_gpus, d.free_memory_mb};
  for (VertexId a : ahead) room += g.stage_of(a).resources;
  if (!d.alive || d.awaiting || !Within(stage.resources, room.cpus, room.gpus, room.memory_mb, GpuMemoryOf(d.spec))) return;
  Dispatch(job, u, d, /*duplicate=*/false, after);
}

void Scheduler::WithdrawRemoteChains(Job& job, VertexId v) {
  const DaemonId where = job.runs[v.value()].daemon;
  ForEachSuccessor(job.g(), v, [&](VertexId u) {
    Run& c = job.runs[u.value()];
    if (c.daemon == where || std::find(c.chained_after.begin(), c.chained_after.end(), v) == c.chained_after.end()) return;
    Flush();  // u's "run" may still wait in the outbox: it must not arrive after its cancel
    if (daemons_[c.daemon.value()]->alive) {
      sink_.SendToDaemon(c.daemon, daemon_msg::Cancel(job.id, u, c.version));
    }
    Unchain(job, u, /*rechain=*/false);
  });
}

void Scheduler::Unchain(Job& job, VertexId u, bool rechain, std::string_view why) {
  Run& r = job.runs[u.value()];
  ReleaseSlots(job, u);
  r.state = VertexState::kWaiting;
  r.chained_after.clear();
  WithdrawRemoteChains(job, u);  // u will not run: nor will what waits for it elsewhere
  Log(job, u, "version " + std::to_string(r.version) + " withdrawn: " + std::string(why));
  if (r.pending == 0) {
    MakeReady(job, u);
  } else if (rechain) {
    TryChain(job, u);  // its predecessor may run again already
  }
}

void Scheduler::NoteProgress(Job& job, const Json& figures) {
  // A job's results ({"final": true, "test_accuracy": …}, from its evaluation) join the newest
  // figures whenever they come, so every status shows them beside the last step's.
  if (auto final = figures.find("final"); final != figures.end() && *final == true) {
    for (const auto& [key, value] : figures.items()) {
      if (key != "final") job.results[key] = value;
    }
    return;
  }
  // A re-run (recovery) reports an older step: the newest figures stay.
  auto step = [](const Json& j) { return j.contains("step") && j["step"].is_number() ? j["step"].get<double>() : -1.0; };
  if (job.progress.is_object() && step(figures) < step(job.progress)) return;
  job.progress = figures;
  if (job.progress_reports++ % job.progress_stride == 0) {
    Json point = {{"elapsed_s", ElapsedMs(job) / 1000.0}};
    for (const auto& [key, value] : figures.items()) {
      if (value.is_number()) point[key] = value;
    }
    if (history_) history_->JobProgress(job.id, point);
    job.progress_points.push_back(std::move(point));
    if (job.progress_points.size() >= kMaxProgressPoints) {  // keep every other one, and record half as often
      for (size_t i = 0; 2 * i < job.progress_points.size(); ++i) job.progress_points[i] = std::move(job.progress_points[2 * i]);
      job.progress_points.resize((job.progress_points.size() + 1) / 2);
      job.progress_stride *= 2;
    }
  }
  for (const char* unit : {"images", "tokens"}) {  // trained so far: the rate shown is per second of these
    if (!figures.contains(unit) || !figures[unit].is_number()) continue;
    const double count = figures[unit].get<double>(), now = ElapsedMs(job);
    if (job.first_images < 0) job.first_images = count, job.first_images_ms = now, job.rate_unit = unit;
    job.last_images = count, job.last_images_ms = now;
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
  return job.durable_dir + "/v" + std::to_string(v.value()) + "." + std::to_string(version) + ".p" + std::to_string(port) +
         ".out";
}

void Scheduler::RemoveDurableCopies(const Job& job) {
  if (storage_ && !job.durable_dir.empty()) storage_->RemoveDurableCopies(job.id, job.durable_dir);
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
      if (g.stage_of(p).Retains(port)) continue;                                        // kept until it settles (Settle)
      QueueRelease(job, p, port);
    }
  }
}

bool Scheduler::OutputReleased(const JobGraph& g, VertexId v, const Run& r, int port) {
  return g.stage_of(v).Retains(static_cast<size_t>(port)) ? r.retained_released : r.released;
}

void Scheduler::QueueRelease(Job& job, VertexId v, size_t port) {
  if (job.mirrors && MirroredPort(job.g(), v) == port) return ReleaseMirrored(job, v, port);
  QueueReleaseOn(job.runs[v.value()].daemon, job, v, port);
}

void Scheduler::QueueReleaseOn(DaemonId d, Job& job, VertexId v, size_t port) {
  const Run& r = job.runs[v.value()];
  PendingReleases& batch = release_outbox_[d];
  *batch.msg.mutable_release()->add_keys() =
      protocol::MakeOutputKey(job.id.value(), v.value(), r.version, static_cast<uint32_t>(port));
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
        sink_.SendToDaemon(r.daemon, daemon_msg::Cancel(job.id, m, r.version));
      }
      ReleaseSlots(job, m);
    } else if (r.state == VertexState::kCompleted) {
      --job.completed;
      DropMirror(job, m);  // a copy of the version that will be replaced
      Journal(RegenRecord(job, m));
    }
    r.state = VertexState::kWaiting;
    job.settled[m.value()] = 0;
  }
  Log(job, cause, "gang of " + std::to_string(g.gangs()[gang.value()].members.size()) + " restarts: " + why);
}

void Scheduler::RecordRecovery(Job& job, VertexId v, uint32_t version, std::string_view reason, const std::string& detail,
                               bool charged) {
  ++counters_.recoveries[std::string(reason)];
  job.recoveries.push_back({{"vertex", job.g().vertex(v).name},
                            {"failed_version", version},
                            {"reason", reason},
                            {"detail", detail},
                            {"charged", charged},
                            {"at_ms", ElapsedMs(job)}});
}

void Scheduler::Fail(Job& job, VertexId v, FailureClass cls, const std::string& error, bool charge, bool deterministic) {
  Run& r = job.runs[v.value()];
  const std::string& name = job.g().vertex(v).name;
  const GangId gang = job.g().vertex(v).gang;
  std::string detail = error;
  if (gang.valid()) {
    // Live channels cannot be replayed: the whole gang runs again with a new version. Only a
    // member's own error or timeout is charged, not the peers it took down.
    if (r.state != VertexState::kRunning) return;  // already reset with its gang (and counted)
    ++counters_.attempts_failed[std::string(FailureClassName(cls))];
    charge = charge && (cls == protocol::FAILURE_PROGRAM_ERROR || cls == protocol::FAILURE_TIMEOUT);
    ResetGang(job, gang, v, name + " failed (" + std::string(FailureClassName(cls)) + "): " + error);
    detail += " (its gang of " + std::to_string(job.g().gangs()[gang.value()].members.size()) + " restarts)";
  } else {
    ++counters_.attempts_failed[std::string(FailureClassName(cls))];
    ReleaseSlots(job, v, FailureClassName(cls));  // its span's outcome, where no report closed it (a lost daemon)
    r.state = VertexState::kWaiting;
    r.chained_after.clear();
    WithdrawRemoteChains(job, v);
    Log(job, v, "version " + std::to_string(r.version) + " failed (" + std::string(FailureClassName(cls)) + "): " + error);
  }
  r.last_error = error;
  if (charge) ++r.charged;
  const int max_attempts = job.g().stage_of(v).max_attempts;
  if (charge && (deterministic || r.charged >= max_attempts)) job.failed_attempt = {name, r.version};  // for `copse logs`
  if (charge && deterministic && r.charged < max_attempts) {
    // The program said this error comes back on every attempt (a missing file, bad params):
    // retrying it would only spend max_attempts - 1 more runs before the same failure.
    FinishJob(job, JobState::kFailed,
              "vertex " + name + " failed (" + std::string(FailureClassName(cls)) +
                  "), not retried: the program reports "
                  "an error that repeats on every attempt: " +
                  error);
    return;
  }
  if (charge && r.charged >= max_attempts) {
    FinishJob(job, JobState::kFailed,
              "vertex " + name + " failed " + std::to_string(r.charged) + " of " + std::to_string(max_attempts) + " attempts (" +
                  std::string(FailureClassName(cls)) + "): " + error);
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
  DropMirror(job, v);  // a copy of the version that will be replaced
  Journal(RegenRecord(job, v));
  Log(job, v, "output of version " + std::to_string(r.version) + " lost, re-running: " + why);
  RecordRecovery(job, v, r.version, "output_lost", why, false);
}

void Scheduler::FinishJob(Job& job, JobState state, const std::string& reason) {
  ++counters_.jobs_finished[std::string(JobStateName(state))];
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
  Flush();  // a task of this job still in the outbox must not arrive after its cancel
  for (DaemonId d : busy) {
    if (d.valid() && daemons_[d.value()]->alive) sink_.SendToDaemon(d, daemon_msg::Cancel(job.id));
  }
  // Garbage-collect intermediate outputs; keep the declared job outputs of a completed job.
  std::map<DaemonId, protocol::JmToDaemon> gc;
  if (state == JobState::kCompleted) {
    for (const auto& o : job.g().spec().outputs) {
      VertexId v = job.g().FindVertex(o.from.ToString());
      const Run& r = job.runs[v.value()];
      auto [it, fresh] = gc.try_emplace(r.daemon, daemon_msg::Gc(job.id));
      *it->second.mutable_gc()->add_keep() =
          protocol::MakeOutputKey(job.id.value(), v.value(), r.version, static_cast<uint32_t>(o.port));
    }
  }
  for (const auto& d : daemons_) {
    if (!d->alive) continue;
    Flush();  // tasks queued before the GC message must not be reordered after it
    auto it = gc.find(d->id);
    sink_.SendToDaemon(d->id, it != gc.end() ? it->second : daemon_msg::Gc(job.id));
  }
  RemoveDurableCopies(job);  // checkpoints for recovery only: the job needs them no more
  if (history_) history_->JobFinished(job.id, Summary(job));
}

}  // namespace copse::jm
