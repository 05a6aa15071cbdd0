#include "jobmanager/scheduler_state.h"

#include <algorithm>
#include <limits>
#include <stdexcept>

#include "jobmanager/job_loader.h"

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

size_t Scheduler::Restore(const std::vector<Json>& records, const ProgramCatalog& catalog, std::vector<std::string>* skipped) {
  JournalSink* journal = journal_;
  journal_ = nullptr;  // replaying must not append what it reads
  size_t restored = 0;
  size_t index = 0;
  auto skip = [&](const std::string& why) {
    const std::string line = fmt::format("journal record {}: {}; skipped", index, why);
    SchedLog()->error("{}", line);
    if (skipped) skipped->push_back(line);
  };
  for (const auto& rec : records) {
    ++index;
    try {
      const std::string t = rec.at("t");
      if (t == "restart") {
        restarts_ = std::max(restarts_, IntegerAt<uint32_t>(rec, "n"));
        continue;
      }
      JobId id(IntegerAt<uint64_t>(rec, "job"));
      if (id.value() == 0 || id.value() >= kMaxJobId) {
        skip(fmt::format("job {} is not a job id (they run from 1 to 2^53)", id.value()));
        continue;
      }
      next_job_ = std::max(next_job_, id.value() + 1);
      if (t == "ids") continue;  // next_job_ covers it
      if (t == "job") {
        if (FindJob(id)) {
          skip(fmt::format("a second record of job {} (the first is kept)", id.value()));
          continue;
        }
        JobLoad load = LoadJobJson(rec.at("doc"), "journal", catalog);
        if (!load.ok()) {
          skip(fmt::format("job {} no longer loads: {}", id.value(), load.status().message()));
          continue;
        }
        Job& job = NewJob(id, load.graph, rec.value("job_dir", std::string()));
        job.history_in_memory = false;  // until RestoreHistory
        // Older journals lack the time: such a job's elapsed time counts from the restart.
        if (const Json& at = rec.value("submitted_unix_ms", Json()); at.is_number_integer() && at.get<int64_t>() > 0) {
          job.submitted_unix_ms = at.get<int64_t>();
          job.started -=
              std::chrono::milliseconds(std::clamp<int64_t>(clock_.UnixMs() - job.submitted_unix_ms, 0, int64_t{1} << 40));
        }
        ++restored;
        continue;
      }
      Job* job = FindJob(id);
      if (!job) continue;  // a job that did not load (said above) or whose record compaction dropped
      if (t == "done") {
        // Every field is read before the run changes: a record damaged half-way must leave no
        // completed vertex without a daemon behind it.
        const Json& ver = rec.at("ver");
        if (!ver.is_number_unsigned() || ver.get<uint64_t>() > std::numeric_limits<uint32_t>::max())
          throw std::invalid_argument("\"ver\" is not an attempt version");
        VertexId v(IntegerAt<uint32_t>(rec, "v"));
        const uint32_t version = ver.get<uint32_t>();
        const std::string daemon = rec.at("daemon").get<std::string>();
        auto bytes = IntegersAt<uint64_t>(rec, "bytes");
        auto messages = IntegersAt<uint64_t>(rec, "msgs");
        if (v.value() >= job->runs.size()) {
          skip(fmt::format("job {} has no vertex {}", id.value(), v.value()));
          continue;
        }
        Run& r = job->runs[v.value()];
        if (r.state != VertexState::kCompleted) ++job->completed;
        r.state = VertexState::kCompleted;
        r.version = version;
        r.daemon = PlaceholderDaemon(daemon);
        r.output_bytes = std::move(bytes);
        r.output_messages = std::move(messages);
        ++job->completions;
      } else if (t == "regen") {
        const uint32_t v = IntegerAt<uint32_t>(rec, "v");
        if (v >= job->runs.size()) {
          skip(fmt::format("job {} has no vertex {}", id.value(), v));
          continue;
        }
        Run& r = job->runs[v];
        if (r.state == VertexState::kCompleted) {
          r.state = VertexState::kWaiting;
          --job->completed;
        }
      } else if (t == "end") {
        const Json& state = rec.at("state");
        if (state != "completed" && state != "failed" && state != "cancelled") {
          skip(fmt::format("job {} ended in {}, which is not a job's end state", id.value(), state.dump()));
          continue;
        }
        job->state = state == "completed" ? JobState::kCompleted : state == "failed" ? JobState::kFailed : JobState::kCancelled;
        if (job->state == JobState::kCompleted) {
          // Every vertex completed; a snapshot names only those whose outputs the job declared
          // (the others' outputs were released when it ended, and they run no more).
          for (Run& r : job->runs) r.state = VertexState::kCompleted;
          job->completed = job->runs.size();
        }
        job->failure = rec.value("failure", std::string());
        job->finished = clock_.Now();
        // At most 2^40 ms (35 years): beyond int64 nanoseconds lies undefined behaviour.
        if (const Json& ms = rec.value("elapsed_ms", Json());
            ms.is_number() && ms.get<double>() >= 0 && ms.get<double>() < 1099511627776.0) {
          job->started =
              job->finished - std::chrono::duration_cast<Duration>(std::chrono::duration<double, std::milli>(ms.get<double>()));
        }
        // What the summary shows of the faults it went through (older journals: none), entries
        // of the shape the status display reads only.
        auto keep = [](const Json& events, Json& into, auto well_formed) {
          if (!events.is_array()) return;
          for (const Json& e : events) {
            if (e.is_object() && well_formed(e)) into.push_back(e);
          }
        };
        auto string_if_present = [](const Json& e, const char* key) { return !e.contains(key) || e[key].is_string(); };
        keep(rec.value("faults", Json()), job->faults_log, [&](const Json& e) {
          return e.value("fault", Json()).is_string() && e.value("at_ms", Json()).is_number() && string_if_present(e, "source") &&
                 string_if_present(e, "vertex") && string_if_present(e, "daemon");
        });
        // The attempt whose failure failed it (older journals: none).
        if (const Json& failed = rec.value("failed_attempt", Json()); failed.is_object()) {
          const Json& vertex = failed.value("vertex", Json());
          const Json& attempt = failed.value("attempt", Json());
          if (vertex.is_string() && attempt.is_number_unsigned() && attempt.get<uint64_t>() <= UINT32_MAX) {
            job->failed_attempt = {vertex.get<std::string>(), static_cast<uint32_t>(attempt.get<uint64_t>())};
          }
        }
        // Which of the job file's faults fired: without the list (an older journal) not known.
        const Json& fired = rec.value("faults_fired", Json());
        if (fired.is_array()) {
          for (const Json& source : fired) {
            if (source.is_string()) job->fired_before_restore.insert(source.get<std::string>());
          }
        }
        if (!fired.is_array() || rec.value("faults_unknown", Json()) == true) job->faults_before_restart_unknown = true;
        keep(rec.value("recoveries", Json()), job->recoveries, [](const Json& e) {
          return e.value("vertex", Json()).is_string() && e.value("reason", Json()).is_string() &&
                 e.value("detail", Json()).is_string() && e.value("failed_version", Json()).is_number_integer() &&
                 e.value("failed_version", Json()) >= 0;
        });
      } else {
        skip(fmt::format("unknown record type {}", Json(t).dump()));
      }
    } catch (const std::exception& e) {
      skip(fmt::format("malformed: {}", e.what()));
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

Json Scheduler::RestartRecord() const { return {{"t", "restart"}, {"job", 0}, {"n", restarts_}}; }

Json Scheduler::JobRecord(const Job& job) {
  return {{"t", "job"},
          {"job", job.id.value()},
          {"doc", job.g().spec().source},
          {"job_dir", job.job_dir},
          {"submitted_unix_ms", job.submitted_unix_ms}};
}

Json Scheduler::DoneRecord(const Job& job, VertexId v) const {
  const Run& r = job.runs[v.value()];
  return {{"t", "done"},
          {"job", job.id.value()},
          {"v", v.value()},
          {"ver", r.version},
          {"daemon", daemons_[r.daemon.value()]->spec.name},
          {"bytes", r.output_bytes},
          {"msgs", r.output_messages}};
}

namespace {

/// At most this many faults and recoveries of a finished job are journaled (its summary after
/// a restart): a record stays small whatever a long job went through.
constexpr size_t kMaxJournaledEvents = 1000;

Json FirstOf(const Json& events) {
  if (events.size() <= kMaxJournaledEvents) return events;
  return Json(std::vector<Json>(events.begin(), events.begin() + kMaxJournaledEvents));
}

}  // namespace

Json Scheduler::EndRecord(const Job& job) {
  Json record = {{"t", "end"},
                 {"job", job.id.value()},
                 {"state", JobStateName(job.state)},
                 {"failure", job.failure},
                 {"elapsed_ms", std::chrono::duration<double, std::milli>(job.finished - job.started).count()},
                 {"faults", FirstOf(job.faults_log)},
                 {"recoveries", FirstOf(job.recoveries)},
                 // Whole, unlike the lists above: what faults_not_fired is computed from.
                 {"faults_fired", job.FiredFaultSources()},
                 {"faults_unknown", job.faults_before_restart_unknown}};
  // The attempt whose failure failed the job: `copse status` points at what it printed.
  if (!job.failed_attempt.first.empty()) {
    record["failed_attempt"] = {{"vertex", job.failed_attempt.first}, {"attempt", job.failed_attempt.second}};
  }
  return record;
}

std::vector<Json> Scheduler::Snapshot() const {
  std::vector<Json> records;
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
  if (next_job_ > 1) records.push_back({{"t", "ids"}, {"job", next_job_ - 1}});
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
