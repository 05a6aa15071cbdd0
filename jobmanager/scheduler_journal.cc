#include "jobmanager/scheduler_state.h"

#include <algorithm>

#include "jobmanager/job_loader.h"
#include "protocol/codec.h"

namespace copse::jm {

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

void Scheduler::RestoreHistory(JobId id, std::vector<std::pair<VertexId, std::string>> lines, std::vector<HistorySpan> spans,
                               std::vector<Json> progress) {
  Job* job = FindJob(id);
  if (!job) return;
  job->history_in_memory = true;
  // Its loss curve from before, ahead of what came since; thinned as NoteProgress thins it.
  progress.insert(progress.end(), job->progress_points.begin(), job->progress_points.end());
  while (progress.size() >= kMaxProgressPoints) {
    for (size_t i = 0; 2 * i < progress.size(); ++i) progress[i] = std::move(progress[2 * i]);
    progress.resize((progress.size() + 1) / 2);
    job->progress_stride *= 2;
  }
  job->progress_points = std::move(progress);
  // A name the restore knows (a daemon holding outputs, awaited) keeps its id; any other is
  // one that ran attempts and holds nothing: a lost entry of its own, for the trace's names.
  std::map<std::string, DaemonId> by_name;
  for (const auto& d : daemons_) by_name[d->spec.name] = d->id;
  auto daemon_named = [&](const std::string& name) {
    auto [it, fresh] = by_name.try_emplace(name);
    if (fresh) {
      auto d = std::make_unique<Daemon>();
      d->id = it->second = DaemonId(static_cast<uint32_t>(daemons_.size()));
      d->spec.name = name;
      d->spec.cpus = 0;
      d->spec.control.clear();
      d->alive = false;
      daemons_.push_back(std::move(d));
    }
    return it->second;
  };
  const size_t before = std::min(lines.size(), kMaxLogLines);
  std::vector<Job::LogLine> log;
  log.reserve(before + job->log.size());
  for (size_t i = 0; i < before; ++i) {
    const VertexId v = lines[i].first.valid() && lines[i].first.value() < job->runs.size() ? lines[i].first : VertexId::Invalid();
    log.push_back({v, std::move(lines[i].second)});
  }
  for (auto& l : job->log) {
    if (log.size() < kMaxLogLines) log.push_back(std::move(l));
  }
  job->log = std::move(log);
  std::vector<Job::Span> restored;
  for (const HistorySpan& s : spans) {
    if (s.vertex >= job->runs.size() || restored.size() >= kMaxSpans) continue;
    restored.push_back(
        {s.vertex, s.version, daemon_named(s.daemon), s.start_ms, s.end_ms, s.outcome, std::min(s.log_lines_before_end, before)});
  }
  // Spans opened since the restore (none yet, unless the restore ran something) come after.
  for (auto& [key, index] : job->open_spans) index += restored.size();
  restored.insert(restored.end(), job->spans.begin(), job->spans.end());
  job->spans = std::move(restored);
}

std::vector<uint64_t> Scheduler::JobIds() const {
  std::vector<uint64_t> ids;
  for (const auto& [id, job] : jobs_) ids.push_back(id.value());
  return ids;
}

namespace {

/// A fault as the job's summary shows it (scheduler_chaos.cc builds these), and back.
protocol::InjectedFault FaultRecord(const Json& f) {
  protocol::InjectedFault out;
  out.set_fault(f.value("fault", std::string()));
  out.set_at_ms(f.value("at_ms", 0.0));
  out.set_source(f.value("source", std::string()));
  out.set_vertex(f.value("vertex", std::string()));
  out.set_daemon(f.value("daemon", std::string()));
  if (f.contains("attempt")) out.set_attempt(f["attempt"].get<uint32_t>());
  if (f.contains("ms")) out.set_ms(f["ms"].get<int64_t>());
  return out;
}

Json FaultEntry(const protocol::InjectedFault& f) {
  Json out = {{"fault", f.fault()}, {"at_ms", f.at_ms()}};
  if (!f.source().empty()) out["source"] = f.source();
  if (!f.vertex().empty()) out["vertex"] = f.vertex();
  if (!f.daemon().empty()) out["daemon"] = f.daemon();
  if (f.has_attempt()) out["attempt"] = f.attempt();
  if (f.has_ms()) out["ms"] = f.ms();
  return out;
}

/// A recovery as RecordRecovery builds it, and back.
protocol::Recovery RecoveryRecord(const Json& r) {
  protocol::Recovery out;
  out.set_vertex(r.value("vertex", std::string()));
  out.set_failed_version(r.value("failed_version", 0u));
  out.set_reason(r.value("reason", std::string()));
  out.set_detail(r.value("detail", std::string()));
  out.set_charged(r.value("charged", false));
  out.set_at_ms(r.value("at_ms", 0.0));
  return out;
}

Json RecoveryEntry(const protocol::Recovery& r) {
  return {{"vertex", r.vertex()},   {"failed_version", r.failed_version()},
          {"reason", r.reason()},   {"detail", r.detail()},
          {"charged", r.charged()}, {"at_ms", r.at_ms()}};
}

JobState EndState(protocol::JobEndState s) {
  return s == protocol::JOB_COMPLETED ? JobState::kCompleted
         : s == protocol::JOB_FAILED  ? JobState::kFailed
                                      : JobState::kCancelled;
}

}  // namespace

size_t Scheduler::Restore(const std::vector<protocol::JournalRecord>& records, const ProgramCatalog& catalog,
                          std::vector<std::string>* skipped) {
  JournalSink* journal = journal_;
  journal_ = nullptr;  // replaying must not append what it reads
  size_t restored = 0;
  size_t index = 0;
  auto skip = [&](const std::string& why) {
    const std::string line = fmt::format("journal record {}: {}; skipped", index, why);
    SchedLog()->error("{}", line);
    if (skipped) skipped->push_back(line);
  };
  for (const protocol::JournalRecord& rec : records) {
    ++index;
    if (Status checked = protocol::Check(rec); !checked.ok()) {
      skip(checked.message());
      continue;
    }
    if (rec.has_restart()) {
      restarts_ = std::max(restarts_, std::min(rec.restart().restarts(), kMaxRestarts));
      continue;
    }
    if (rec.has_ids()) {
      next_job_ = std::max(next_job_, rec.ids().up_to() + 1);
      continue;
    }
    const JobId id(protocol::JobNamed(rec));
    next_job_ = std::max(next_job_, id.value() + 1);
    if (rec.has_job()) {
      if (FindJob(id)) {
        skip(fmt::format("a second record of job {} (the first is kept)", id.value()));
        continue;
      }
      auto doc = ParseJson(rec.job().doc_json(), fmt::format("job {}'s document", id.value()));
      JobLoad load = doc.ok() ? LoadJobJson(*doc, "journal", catalog) : JobLoad{};
      if (!doc.ok() || !load.ok()) {
        skip(fmt::format("job {} no longer loads: {}", id.value(), doc.ok() ? load.status().message() : doc.status().message()));
        continue;
      }
      Job& job = NewJob(id, load.graph, rec.job().job_dir());
      job.history_in_memory = false;  // until RestoreHistory
      // Unknown (0): such a job's elapsed time counts from the restart.
      if (const int64_t at = rec.job().submitted_unix_ms(); at > 0) {
        job.submitted_unix_ms = at;
        job.started -= std::chrono::milliseconds(std::clamp<int64_t>(clock_.UnixMs() - at, 0, int64_t{1} << 40));
      }
      ++restored;
      continue;
    }
    Job* job = FindJob(id);
    if (!job) continue;  // a job that did not load (said above) or whose record compaction dropped
    if (rec.has_done()) {
      const protocol::VertexDone& done = rec.done();
      if (done.vertex() >= job->runs.size()) {
        skip(fmt::format("job {} has no vertex {}", id.value(), done.vertex()));
        continue;
      }
      Run& r = job->runs[done.vertex()];
      if (r.state != VertexState::kCompleted) ++job->completed;
      r.state = VertexState::kCompleted;
      r.version = done.version();
      r.daemon = PlaceholderDaemon(done.daemon());
      r.output_bytes.assign(done.output_bytes().begin(), done.output_bytes().end());
      r.output_messages.assign(done.output_messages().begin(), done.output_messages().end());
      ++job->completions;
    } else if (rec.has_regen()) {
      const uint32_t v = rec.regen().vertex();
      if (v >= job->runs.size()) {
        skip(fmt::format("job {} has no vertex {}", id.value(), v));
        continue;
      }
      Run& r = job->runs[v];
      if (r.state == VertexState::kCompleted) {
        r.state = VertexState::kWaiting;
        --job->completed;
      }
    } else if (rec.has_end()) {
      const protocol::JobEnded& end = rec.end();
      job->state = EndState(end.state());
      if (job->state == JobState::kCompleted) {
        // Every vertex completed; a snapshot names only those whose outputs the job declared
        // (the others' outputs were released when it ended, and they run no more).
        for (Run& r : job->runs) r.state = VertexState::kCompleted;
        job->completed = job->runs.size();
      }
      job->failure = end.failure();
      job->finished = clock_.Now();
      // At most 2^40 ms (35 years): beyond int64 nanoseconds lies undefined behaviour.
      if (const double ms = end.elapsed_ms(); ms >= 0 && ms < 1099511627776.0) {
        job->started = job->finished - std::chrono::duration_cast<Duration>(std::chrono::duration<double, std::milli>(ms));
      }
      // What the summary shows of the faults it went through and of its recoveries.
      for (const auto& f : end.faults()) job->faults_log.push_back(FaultEntry(f));
      for (const auto& r : end.recoveries()) job->recoveries.push_back(RecoveryEntry(r));
      if (!end.failed_attempt().vertex().empty())
        job->failed_attempt = {end.failed_attempt().vertex(), end.failed_attempt().attempt()};
      // Which of the job file's faults fired (the list above may be cut short).
      job->fired_before_restore.insert(end.faults_fired().begin(), end.faults_fired().end());
      if (end.faults_unknown()) job->faults_before_restart_unknown = true;
    }
  }
  StartRecoveryGrace();
  // Attempts the old job managers started are unknown, and may still be known to daemons (their
  // outputs stored, their ends remembered for tasks chained after them): new versions start
  // above every version any earlier life of this journal could have handed out, so no new
  // attempt reuses an old one's key. (Bumping by a constant instead gave a second restart in a
  // row the versions the first had used: a daemon then withdrew tasks chained after an attempt
  // "that did not succeed" — the old one — over and over.)
  restarts_ = std::min(restarts_ + 1, kMaxRestarts);
  if (restarts_ == kMaxRestarts) SchedLog()->warn("the journal has seen {} restarts: attempt versions may repeat", restarts_);
  const uint32_t version_base = restarts_ * kVersionsPerRestart;
  for (auto& [id, job] : jobs_) {
    if (job->state != JobState::kRunning) continue;  // a finished job's history says all there is
    Log(*job, VertexId::Invalid(),
        "restored from the journal after a job manager restart (attempts running then run again, as new versions)");
    for (auto& r : job->runs) {
      if (r.state != VertexState::kCompleted) r.version = std::max(r.version, version_base);
    }
    std::fill(job->fault_fired.begin(), job->fault_fired.end(), 1);  // injected faults fired already
    job->faults_before_restart_unknown = true;                       // which did is not journaled for a running job
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

protocol::JournalRecord Scheduler::RestartRecord() const {
  protocol::JournalRecord record;
  record.mutable_restart()->set_restarts(restarts_);
  return record;
}

protocol::JournalRecord Scheduler::JobRecord(const Job& job) {
  protocol::JournalRecord record;
  protocol::JobAccepted& accepted = *record.mutable_job();
  accepted.set_job(job.id.value());
  accepted.set_doc_json(DumpJson(job.g().spec().source));
  accepted.set_job_dir(job.job_dir);
  accepted.set_submitted_unix_ms(job.submitted_unix_ms);
  return record;
}

protocol::JournalRecord Scheduler::DoneRecord(const Job& job, VertexId v) const {
  const Run& r = job.runs[v.value()];
  protocol::JournalRecord record;
  protocol::VertexDone& done = *record.mutable_done();
  done.set_job(job.id.value());
  done.set_vertex(v.value());
  done.set_version(r.version);
  done.set_daemon(daemons_[r.daemon.value()]->spec.name);
  done.mutable_output_bytes()->Add(r.output_bytes.begin(), r.output_bytes.end());
  done.mutable_output_messages()->Add(r.output_messages.begin(), r.output_messages.end());
  return record;
}

protocol::JournalRecord Scheduler::RegenRecord(const Job& job, VertexId v) {
  protocol::JournalRecord record;
  record.mutable_regen()->set_job(job.id.value());
  record.mutable_regen()->set_vertex(v.value());
  return record;
}

namespace {

/// At most this many faults and recoveries of a finished job are journaled (its summary after
/// a restart): a record stays small whatever a long job went through.
constexpr size_t kMaxJournaledEvents = 1000;

}  // namespace

protocol::JournalRecord Scheduler::EndRecord(const Job& job) {
  protocol::JournalRecord record;
  protocol::JobEnded& end = *record.mutable_end();
  end.set_job(job.id.value());
  end.set_state(job.state == JobState::kCompleted ? protocol::JOB_COMPLETED
                : job.state == JobState::kFailed  ? protocol::JOB_FAILED
                                                  : protocol::JOB_CANCELLED);
  end.set_failure(job.failure);
  end.set_elapsed_ms(std::chrono::duration<double, std::milli>(job.finished - job.started).count());
  for (size_t i = 0; i < job.faults_log.size() && i < kMaxJournaledEvents; ++i)
    *end.add_faults() = FaultRecord(job.faults_log[i]);
  for (size_t i = 0; i < job.recoveries.size() && i < kMaxJournaledEvents; ++i) {
    *end.add_recoveries() = RecoveryRecord(job.recoveries[i]);
  }
  // Whole, unlike the lists above: what faults_not_fired is computed from.
  for (const std::string& source : job.FiredFaultSources()) end.add_faults_fired(source);
  end.set_faults_unknown(job.faults_before_restart_unknown);
  // The attempt whose failure failed the job: `copse status` points at what it printed.
  if (!job.failed_attempt.first.empty()) {
    end.mutable_failed_attempt()->set_vertex(job.failed_attempt.first);
    end.mutable_failed_attempt()->set_attempt(job.failed_attempt.second);
  }
  return record;
}

std::vector<protocol::JournalRecord> Scheduler::Snapshot() const {
  std::vector<protocol::JournalRecord> records;
  for (const auto& [id, job] : jobs_) {
    records.push_back(JobRecord(*job));
    if (job->state == JobState::kCompleted) {
      // What a completed job still needs of its vertices: where its declared outputs are (the
      // rest were released at its end). A million-vertex job snapshots in a few records.
      for (uint32_t v : job->declared_vertices) {
        if (job->runs[v].daemon.valid()) records.push_back(DoneRecord(*job, VertexId(v)));
      }
    } else {
      for (uint32_t v = 0; v < job->runs.size(); ++v) {
        if (job->runs[v].state == VertexState::kCompleted) records.push_back(DoneRecord(*job, VertexId(v)));
      }
    }
    if (job->state != JobState::kRunning) records.push_back(EndRecord(*job));
  }
  if (next_job_ > 1) {
    records.emplace_back().mutable_ids()->set_up_to(next_job_ - 1);
  }
  if (restarts_ > 0) records.push_back(RestartRecord());
  return records;
}

size_t Scheduler::SnapshotRecords() const {
  size_t n = (next_job_ > 1 ? 1 : 0) + (restarts_ > 0 ? 1 : 0);
  for (const auto& [id, job] : jobs_) {
    size_t done = job->completed;
    if (job->state == JobState::kCompleted) {  // as Snapshot: declared outputs with a known place
      done = 0;
      for (uint32_t v : job->declared_vertices) done += job->runs[v].daemon.valid() ? 1 : 0;
    }
    n += 1 + done + (job->state != JobState::kRunning ? 1 : 0);
  }
  return n;
}

}  // namespace copse::jm
