#include "jobmanager/scheduler_state.h"

#include <algorithm>
#include <string_view>
#include <tuple>

#include <fmt/format.h>

#include "common/text_util.h"
#include "jobmanager/event_log.h"

namespace copse::jm {

bool Scheduler::HasJob(JobId id) const { return FindJob(id) != nullptr; }

bool Scheduler::HistoryInMemory(JobId id) const {
  const Job* job = FindJob(id);
  return job && job->history_in_memory;
}

std::optional<JobState> Scheduler::StateOf(JobId id) const {
  const Job* job = FindJob(id);
  if (!job) return std::nullopt;
  return job->state;
}

bool Scheduler::HasAttempt(JobId id, VertexId v, uint32_t version) const {
  const Job* job = FindJob(id);
  if (!job || !v.valid() || v.value() >= job->runs.size()) return false;
  const Run& r = job->runs[v.value()];
  return version >= 1 && version <= std::max(r.version, r.dup_version);
}

Result<Json> Scheduler::Attempt(JobId id, const std::string& vertex, uint32_t attempt) const {
  const Job* job = FindJob(id);
  if (!job) return Status::NotFound("no job " + id.ToString());
  const VertexId v = job->g().FindVertex(vertex);
  if (!v.valid()) return Status::NotFound("job " + id.ToString() + " has no vertex \"" + vertex + "\"");
  const Run& r = job->runs[v.value()];
  // Its attempts are numbered by version, which a job manager restart moves on by 1000 (the
  // version of a vertex not sent anywhere yet never ran): the trace says which there were.
  const bool dispatched = r.state == VertexState::kRunning || r.state == VertexState::kCompleted;
  uint32_t newest = dispatched ? std::max(r.version, r.dup_version) : 0;
  std::vector<std::string> attempts;
  std::vector<const Job::Span*> mine;  // v's spans: the job's are walked once
  for (const auto& s : job->spans) {
    if (s.vertex != v.value()) continue;
    mine.push_back(&s);
    if (attempts.size() < 20) attempts.push_back(std::to_string(s.version));
    newest = std::max(newest, s.version);
  }
  if (attempt == 0) attempt = newest;
  Json out = {{"vertex", v.value()}, {"name", vertex}, {"attempt", attempt}, {"newest", newest}};
  bool known = attempt == 0 || (dispatched && (attempt == r.version || attempt == r.dup_version));
  for (const Job::Span* s : mine) {
    if (s->version != attempt) continue;
    known = true;
    out["daemon"] = daemons_[s->daemon.value()]->spec.name;
    if (s->end_ms >= 0) out["outcome"] = s->outcome;
  }
  if (!known) {
    return Status::NotFound(fmt::format("{} of job {} has no attempt {} (its attempts: {})", vertex, id.value(), attempt,
                                        attempts.empty() ? "none yet" : Join(attempts, ", ")));
  }
  const bool current = attempt > 0 && (r.version == attempt || r.dup_version == attempt);
  const bool sent_ahead = current && r.state == VertexState::kRunning && !r.chained_after.empty() && r.version == attempt;
  out["running"] = current && r.state == VertexState::kRunning && !sent_ahead && job->state == JobState::kRunning;
  // Sent ahead, to start once its predecessors succeed; or not run yet at all.
  if (job->state == JobState::kRunning && (sent_ahead || attempt == 0)) out["waiting"] = true;
  return out;
}

std::string Scheduler::WhyNotPlaced(const Job& job, VertexId v, std::map<uint32_t, std::string>& gang_reasons) const {
  const JobGraph& g = job.g();
  const StageSpec& stage = g.stage_of(v);
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
      return why = fmt::format("its gang of {} cannot be placed on the live daemons even when they are idle: {}", members.size(),
                               idle.why_not);
    }
    const Resources whole = job.gang_needs->Whole(gang);
    why = fmt::format("its gang of {} waits for {} free at once", members.size(), DescribeResources(whole));
    if (idle.gave_up) why += " (whether the live daemons could hold it even idle was not settled: " + idle.why_not + ")";
    return why;
  }
  const Resources& need = stage.resources;
  auto holds = [&](const Daemon& d) {
    return d.alive && Within(need, d.spec.cpus, d.spec.gpus, MemoryOf(d.spec), GpuMemoryOf(d.spec));
  };
  if (std::none_of(daemons_.begin(), daemons_.end(), [&](const auto& d) { return holds(*d); })) {
    // Daemons awaited after a restart (or lost within their return grace) offer nothing yet:
    // that is what it waits for, not a daemon larger than any.
    std::vector<std::string> awaited;
    for (const auto& d : daemons_) {
      if (d->awaiting && awaited.size() < 3) awaited.push_back(d->spec.name);
    }
    if (!awaited.empty()) {
      return "needs " + DescribeResources(need) + "; waits for daemons to register again (awaited: " + Join(awaited, ", ") + ")";
    }
    return "needs " + DescribeResources(need) + ", more than any live daemon has";
  }
  if (!stage.affinity.empty() && !job.affinity.count(stage.affinity) &&
      std::none_of(daemons_.begin(), daemons_.end(),
                   [&](const auto& d) { return d->alive && PinFits(job, stage, *d, job.affinity); })) {
    return "no live daemon can hold affinity group " + stage.affinity + "'s vertices and the gangs they join";
  }
  return "no daemon has " + DescribeResources(need) + " free";
}

std::string Scheduler::WhyItCannotFit(const JobGraph& graph) const {
  for (const StageSpec& stage : graph.spec().stages) {
    const Resources& need = stage.resources;
    if (need.gpus == 0 || need.gpu_memory_mb == 0) continue;
    const Daemon* largest = nullptr;
    bool unknown = false;
    for (const auto& d : daemons_) {
      if (!d->alive || d->spec.gpus < need.gpus) continue;
      unknown = unknown || d->spec.gpu_memory_mb <= 0;
      if (!largest || d->spec.gpu_memory_mb > largest->spec.gpu_memory_mb) largest = d.get();
    }
    if (!largest || unknown || largest->spec.gpu_memory_mb >= need.gpu_memory_mb) continue;
    return fmt::format(
        "stage {} needs {} MB of memory on each of its {} GPU(s) (resources.gpu_memory_mb), and the largest GPUs of the "
        "live daemons with {} GPU(s) have {} MB (daemon {})",
        stage.name, need.gpu_memory_mb, need.gpus, need.gpus, largest->spec.gpu_memory_mb, largest->spec.name);
  }
  return "";
}

namespace {

/// The job's graph by stage (the dashboard draws it): [[from stage, to stage, channel kind]].
Json StageEdges(const JobGraph& g) {
  Json edges = Json::array();
  for (const auto& e : g.stage_edges()) {
    edges.push_back({g.spec().stages[e.from].name, g.spec().stages[e.to].name, ChannelKindName(e.kind)});
  }
  return edges;
}

}  // namespace

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
    size_t failed_attempts = 0, sent_ahead = 0;
    for (int i = 0; i < st.replicas; ++i) {
      const Run& r = job.runs[g.stage_base(static_cast<int>(s)).value() + i];
      ++c[static_cast<int>(r.state)];
      failed_attempts += r.charged;
      // Chained: on its daemon, to start once its predecessors succeed: not running yet.
      sent_ahead += r.state == VertexState::kRunning && !r.chained_after.empty();
    }
    for (int k = 0; k < 4; ++k) counts[k] += c[k];
    stages.push_back({{"name", st.name},
                      {"program", st.program},
                      {"total", st.replicas},
                      {"completed", c[3]},
                      {"running", c[2] - sent_ahead},
                      {"sent_ahead", sent_ahead},
                      {"ready", c[1]},
                      {"waiting", c[0]},
                      {"failed_attempts", failed_attempts}});
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
              {"vertices",
               {{"total", job.runs.size()},
                {"completed", counts[3]},
                {"running", counts[2]},
                {"ready", counts[1]},
                {"waiting", counts[0]}}},
              {"stages", stages},
              {"edges", StageEdges(g)},
              {"input_bytes", {{"local", job.local_input_bytes}, {"remote", job.remote_input_bytes}}},
              {"waiting", waiting},
              {"faults", job.faults_log},
              {"recoveries", job.recoveries}};
  if (job.mirrors) out["mirrors_used"] = job.mirrors_used;  // lost outputs their copies served
  if (!job.failure.empty()) out["failure"] = job.failure;
  if (job.state == JobState::kFailed && !job.failed_attempt.first.empty()) {
    out["failed_attempt"] = {{"vertex", job.failed_attempt.first}, {"attempt", job.failed_attempt.second}};
  }
  if (job.state != JobState::kRunning && !job.faults_before_restart_unknown) {
    // The job file's faults that never got their chance (a daemon name no daemon had, a `when`
    // the job never reached, an attempt that never ran): a test of survival that did not test.
    // Faults copse chaos armed are told apart by their index (they share the source "chaos").
    const std::set<std::string> fired = job.FiredFaultSources();
    Json not_fired = Json::array();
    for (size_t i = 0; i < job.faults.size(); ++i) {
      const FaultSpec& f = job.faults[i];
      if (f.pointer == "chaos" ? !job.fault_fired[i] : !fired.count(f.pointer)) {
        not_fired.push_back({{"source", f.pointer}, {"fault", FaultKindName(f.kind)}});
        if (f.pointer == "chaos" && f.vertex) not_fired.back()["vertex"] = f.vertex->ToString();
      }
    }
    if (!not_fired.empty()) out["faults_not_fired"] = std::move(not_fired);
  }
  if (job.progress.is_object() || !job.results.empty()) {
    Json progress = job.progress.is_object() ? job.progress : Json::object();
    progress.update(job.results);
    if (job.last_images_ms > job.first_images_ms) {
      progress[job.rate_unit + "_per_s"] =
          (job.last_images - job.first_images) / ((job.last_images_ms - job.first_images_ms) / 1000.0);
    }
    out["progress"] = std::move(progress);
  }
  return out;
}

Json Scheduler::Summary(const Job& job) const {
  Json summary = JobStatus(job.id);
  summary["submitted_unix_ms"] = job.submitted_unix_ms;
  summary["finished_unix_ms"] = clock_.UnixMs();
  summary["progress_series"] = job.progress_points;
  if (auto outputs = OutputLocations(job.id); outputs.ok()) {
    for (Json& o : *outputs) {  // where they were: the bytes go when the job is forgotten
      const Run& r = job.runs[o["key"]["vertex"].get<uint32_t>()];
      const size_t port = o["key"]["port"].get<size_t>();
      o["bytes"] = port < r.output_bytes.size() ? r.output_bytes[port] : 0;
    }
    summary["outputs"] = std::move(*outputs);
  }
  return summary;
}

std::optional<Json> Scheduler::FinalSummary(JobId id) const {
  const Job* job = FindJob(id);
  if (!job || job->state == JobState::kRunning) return std::nullopt;
  return Summary(*job);
}

Json Scheduler::JobsTable() const {
  Json rows = Json::array();
  for (const auto& [id, job] : jobs_) {
    Json row = {{"id", id.value()},
                {"name", job->g().spec().name},
                {"state", JobStateName(job->state)},
                {"completed", job->completed},
                {"total", job->runs.size()},
                {"elapsed_s", ElapsedMs(*job) / 1000.0},
                {"submitted_unix_ms", job->submitted_unix_ms}};
    // A running job with nothing running: why its next vertex waits (as squeue's reason
    // column). Only the front of the ready queue is asked, so a table of huge jobs stays cheap.
    if (job->state == JobState::kRunning && job->running.empty() && !job->ready.empty()) {
      const VertexId next(job->ready.top().second);
      if (job->runs[next.value()].state == VertexState::kReady) {
        std::map<uint32_t, std::string> gang_reasons;
        row["reason"] = ReadsAHeldOutput(*job, next) ? "reads an output held for its daemon's return"
                                                     : WhyNotPlaced(*job, next, gang_reasons);
      }
    }
    rows.push_back(std::move(row));
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
    rows.push_back({{"name", d.spec.name},
                    {"alive", d.alive},
                    {"state", state},
                    {"superseded", newest[d.spec.name] != i},
                    {"cpus", d.spec.cpus},
                    {"free_cpus", std::max(0.0, d.free_cpus)},
                    {"gpus", d.spec.gpus},
                    {"memory_mb", d.spec.memory_mb},
                    {"gpu_memory_mb", d.spec.gpu_memory_mb},
                    {"free_memory_mb", d.spec.memory_mb > 0 ? std::max<int64_t>(0, d.free_memory_mb) : 0},
                    {"running", d.running},
                    {"labels", d.spec.labels},
                    {"data", d.spec.data_port ? d.spec.data_host + ":" + std::to_string(d.spec.data_port) : ""},
                    {"control", d.spec.control}});
  }
  return rows;
}

Json Scheduler::Logs(JobId id, const std::string& vertex) const {
  const Job* job = FindJob(id);
  if (!job) return nullptr;
  VertexId only = vertex.empty() ? VertexId::Invalid() : job->g().FindVertex(vertex);
  if (!vertex.empty() && !only.valid()) return nullptr;
  // The log, and each completed attempt's line made from its trace span (here, not as it
  // completes: the scheduler's hot path writes no line per completion).
  std::vector<EventLine> lines;
  for (size_t i = 0; i < job->log.size(); ++i) {
    const auto& l = job->log[i];
    if (vertex.empty() || l.vertex == only) lines.push_back({i, true, 0, l.text});
  }
  for (const auto& s : job->spans) {
    if (s.outcome != "completed" || (only.valid() && s.vertex != only.value())) continue;
    std::string line = CompletedLine(s.end_ms, job->g().vertex(VertexId(s.vertex)).name, s.version,
                                     daemons_[s.daemon.value()]->spec.name, s.end_ms - s.start_ms);
    if (const Run& r = job->runs[s.vertex]; r.state == VertexState::kCompleted && r.version == s.version) {
      uint64_t bytes = 0;
      for (uint64_t b : r.output_bytes) bytes += b;
      line += fmt::format(", {} output bytes", bytes);
    }
    lines.push_back({s.log_lines_before_end, false, s.end_ms, std::move(line)});
  }
  return MergeEventLog(std::move(lines), kMaxLogLines);
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
    out.push_back({{"path", o.path},
                   {"vertex", job->g().vertex(v).name},
                   {"host", d.spec.data_host},
                   {"port", d.spec.data_port},
                   {"alive", d.alive},
                   {"key", {{"job", id.value()}, {"vertex", v.value()}, {"version", r.version}, {"port", o.port}}}});
  }
  return out;
}

Json Scheduler::VertexPage(JobId id, const VertexFilter& filter) const {
  const Job* job = FindJob(id);
  if (!job) return nullptr;
  const JobGraph& g = job->g();
  const int only_stage = filter.stage.empty() ? -1 : g.spec().FindStage(filter.stage);
  if (!filter.stage.empty() && only_stage < 0) return {{"total", 0}, {"offset", filter.offset}, {"vertices", Json::array()}};
  size_t first = 0, last = g.vertices().size();  // a stage's vertices are consecutive
  if (only_stage >= 0) {
    first = g.stage_base(only_stage).value();
    last = first + g.spec().stages[only_stage].replicas;
  }
  Json rows = Json::array();
  size_t matched = 0;
  std::map<uint32_t, std::string> gang_reasons;
  for (size_t i = first; i < last; ++i) {
    const Run& r = job->runs[i];
    const std::string_view state = VertexStateName(r.state);
    if (!filter.state.empty() && state != filter.state) continue;
    if (matched++ < filter.offset || rows.size() >= filter.limit) continue;
    const VertexNode& v = g.vertex(VertexId(static_cast<uint32_t>(i)));
    Json row = {{"name", v.name},       {"stage", g.spec().stages[v.stage].name},
                {"replica", v.replica}, {"state", state},
                {"version", r.version}, {"failed_attempts", r.charged}};
    if (r.daemon.valid() && r.daemon.value() < daemons_.size()) row["daemon"] = daemons_[r.daemon.value()]->spec.name;
    if (job->state == JobState::kRunning && r.state == VertexState::kReady) {
      row["reason"] =
          ReadsAHeldOutput(*job, v.id) ? "reads an output held for its daemon's return" : WhyNotPlaced(*job, v.id, gang_reasons);
    } else if (job->state == JobState::kRunning && r.state == VertexState::kWaiting) {
      row["reason"] = fmt::format("waits for {} predecessor{}", r.pending, r.pending == 1 ? "" : "s");
    }
    rows.push_back(std::move(row));
  }
  return {{"total", matched}, {"offset", filter.offset}, {"vertices", std::move(rows)}};
}

Json Scheduler::ProgressSeries(JobId id) const {
  const Job* job = FindJob(id);
  if (!job) return nullptr;
  return job->progress_points;
}

void Scheduler::WriteMetrics(metrics::MetricsWriter& out) const {
  using metrics::Labels;
  const Counters& c = counters_;
  out.Counter("copse_jobs_submitted_total", "Jobs submitted to this job manager since it started.", c.jobs_submitted);
  out.Family("copse_jobs_finished_total", "counter", "Jobs that finished since this job manager started, by final state.");
  for (JobState st : {JobState::kCompleted, JobState::kFailed, JobState::kCancelled}) {
    const std::string name(JobStateName(st));
    auto it = c.jobs_finished.find(name);
    out.Sample("copse_jobs_finished_total", it == c.jobs_finished.end() ? 0 : it->second, {{"state", name}});
  }
  out.Family("copse_jobs", "gauge", "Jobs this job manager holds, by state.");
  std::map<std::string, size_t> jobs_by_state;
  size_t by_state[4] = {0, 0, 0, 0};
  for (const auto& [id, job] : jobs_) {
    ++jobs_by_state[std::string(JobStateName(job->state))];
    if (job->state != JobState::kRunning) continue;
    for (const Run& r : job->runs) ++by_state[static_cast<int>(r.state)];
  }
  for (JobState st : {JobState::kRunning, JobState::kCompleted, JobState::kFailed, JobState::kCancelled}) {
    out.Sample("copse_jobs", jobs_by_state[std::string(JobStateName(st))], {{"state", std::string(JobStateName(st))}});
  }
  out.Family("copse_vertices", "gauge", "Vertices of the running jobs, by state.");
  for (VertexState st : {VertexState::kWaiting, VertexState::kReady, VertexState::kRunning, VertexState::kCompleted}) {
    out.Sample("copse_vertices", by_state[static_cast<int>(st)], {{"state", std::string(VertexStateName(st))}});
  }
  out.Counter("copse_attempts_dispatched_total", "Vertex attempts sent to daemons.", c.attempts_dispatched);
  out.Counter("copse_duplicates_dispatched_total", "Duplicate attempts of stragglers sent to daemons.", c.duplicates_dispatched);
  out.Counter("copse_attempts_completed_total", "Vertex attempts that completed and were accepted.", c.attempts_completed);
  out.Family("copse_attempts_failed_total", "counter", "Vertex attempts that failed, by failure class.");
  for (const auto& [cls, n] : c.attempts_failed) out.Sample("copse_attempts_failed_total", n, {{"class", cls}});
  out.Family("copse_recoveries_total", "counter", "Vertices run again after a fault, by reason.");
  for (const auto& [reason, n] : c.recoveries) out.Sample("copse_recoveries_total", n, {{"reason", reason}});
  out.Family("copse_input_bytes_total", "counter", "Bytes completed attempts read, by where the producer's output was.");
  out.Sample("copse_input_bytes_total", c.input_bytes_local, {{"locality", "local"}});
  out.Sample("copse_input_bytes_total", c.input_bytes_remote, {{"locality", "remote"}});
  out.Family("copse_scheduling_latency_seconds", "histogram", "From a vertex being ready to its dispatch to a daemon.");
  out.HistogramSamples("copse_scheduling_latency_seconds", c.scheduling_latency_s);
  size_t alive = 0, awaited = 0, lost = 0, running = 0;
  double cpus = 0, free_cpus = 0, gpus = 0, memory_mb = 0;
  for (const auto& d : daemons_) {
    if (d->alive) {
      ++alive, cpus += d->spec.cpus, free_cpus += std::max(0.0, d->free_cpus), gpus += d->spec.gpus;
      memory_mb += static_cast<double>(d->spec.memory_mb), running += d->running;
    } else {
      ++(d->awaiting ? awaited : lost);
    }
  }
  out.Family("copse_daemons", "gauge", "Daemon registrations, by state.");
  out.Sample("copse_daemons", alive, {{"state", "alive"}});
  out.Sample("copse_daemons", awaited, {{"state", "awaited"}});
  out.Sample("copse_daemons", lost, {{"state", "lost"}});
  out.Gauge("copse_capacity_cpus", "Vertex slots (cpus) the live daemons offer.", cpus);
  out.Gauge("copse_free_cpus", "Vertex slots (cpus) free on the live daemons.", free_cpus);
  out.Gauge("copse_capacity_gpus", "GPUs the live daemons offer.", gpus);
  out.Gauge("copse_capacity_memory_bytes", "Memory the live daemons offer vertices.", memory_mb * 1024 * 1024);
  out.Gauge("copse_attempts_running", "Attempts running (or sent ahead) on the live daemons.", running);
  out.Gauge("copse_slot_utilisation", "Share of the live daemons' slots in use (0 to 1).",
            cpus > 0 ? std::clamp(1.0 - free_cpus / cpus, 0.0, 1.0) : 0.0);
}

}  // namespace copse::jm
