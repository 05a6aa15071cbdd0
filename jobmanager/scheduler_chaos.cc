// Faults injected on purpose — `copse chaos` requests, the seeded random monkey, the job
// file's faults — kept apart from the production state machine they exercise.
#include "jobmanager/daemon_messages.h"
#include "jobmanager/scheduler_state.h"

#include <algorithm>
#include <cstdio>

#include "common/text_util.h"

namespace copse::jm {

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
    int64_t ms = IntegerOr<int64_t>(request, "ms", 2000);
    if (action == "cut" && (ms < 1 || ms > 3'600'000)) {
      return Status::InvalidArgument("a cut lasts 1 to 3600000 ms, got " + std::to_string(ms));
    }
    Flush();
    ExpectInjectedLoss(*d);
    sink_.SendToDaemon(d->id, action == "kill" ? daemon_msg::Kill() : daemon_msg::Cut(ms));
    Json record = {{"fault", action == "kill" ? "kill_daemon" : "cut_daemon"}, {"daemon", name}, {"source", "chaos"}};
    if (action == "cut") record["ms"] = ms;
    record_everywhere(record);
    return record;
  }
  if (action == "fail" || action == "delay" || action == "corrupt" || action == "drop") {
    Job* job = FindJob(JobId(IntegerOr<uint64_t>(request, "job", 0)));
    if (!job || job->state != JobState::kRunning)
      return Status::NotFound("no running job " + std::to_string(IntegerOr<uint64_t>(request, "job", 0)));
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
      const auto attempts = request.contains("attempts") ? IntegersAt<int64_t>(request, "attempts") : std::vector<int64_t>{next};
      if (attempts.empty()) return Status::InvalidArgument("no attempt numbers");
      for (int64_t a : attempts) {
        if (a < 1 || a > 1000) return Status::InvalidArgument("attempt numbers run from 1 to 1000, got " + std::to_string(a));
        f.attempts.push_back(static_cast<int>(a));
      }
      f.ms = IntegerOr<int64_t>(request, "ms", 1000);
      if (f.ms < 0 || f.ms > 86'400'000)
        return Status::InvalidArgument("a delay is 0 to 86400000 ms, got " + std::to_string(f.ms));
    } else {
      f.kind = action == "corrupt" ? FaultKind::kCorruptOutputOf : FaultKind::kDropOutputOf;
    }
    job->faults.push_back(f);
    job->fault_fired.push_back(0);
    Log(*job, v, "chaos: " + action + " armed");
    auto names = [&](uint32_t a) {
      return std::find(f.attempts.begin(), f.attempts.end(), static_cast<int>(a)) != f.attempts.end();
    };
    if (Run& chained = job->runs[v.value()]; (action == "fail" || action == "delay") && chained.state == VertexState::kRunning &&
                                             !chained.chained_after.empty() && names(next) && !names(chained.version)) {
      // Sent chained, it waits on its daemon with a task that carries no fault: withdrawn (it
      // has not started) and sent again, as attempt `next`, with the fault in it.
      Flush();  // its "run" must not arrive after its cancel
      if (daemons_[chained.daemon.value()]->alive) {
        sink_.SendToDaemon(chained.daemon, daemon_msg::Cancel(job->id, v, chained.version));
      }
      Unchain(*job, v, /*rechain=*/true, "copse chaos armed a fault on it before it started");
    }
    CheckFaults(*job);
    Schedule();  // what a fired fault made run again goes now, not at the next tick
    Json reply = {{"fault", action}, {"vertex", job->g().vertex(v).name}, {"job", job->id.value()}, {"armed", true}};
    if ((action == "fail" || action == "delay") && r.state == VertexState::kCompleted) {
      reply["note"] = job->g().vertex(v).name + " has completed: the fault fires only if it runs again";
    } else if ((action == "fail" || action == "delay") && r.state == VertexState::kRunning && r.chained_after.empty() &&
               std::find(f.attempts.begin(), f.attempts.end(), static_cast<int>(r.version)) == f.attempts.end()) {
      reply["note"] = fmt::format("{} is running as attempt {}: the fault fires on the attempts named ({}), if it runs again",
                                  job->g().vertex(v).name, r.version,
                                  Join(
                                      [&] {
                                        std::vector<std::string> a;
                                        for (int n : f.attempts) a.push_back(std::to_string(n));
                                        return a;
                                      }(),
                                      ", "));
    }
    return reply;
  }
  if (action == "random") {
    RandomChaos chaos;
    chaos.rng.seed(IntegerOr<uint64_t>(request, "seed", 1));
    const int64_t interval_ms = IntegerOr<int64_t>(request, "interval_ms", 500);
    const int64_t duration_ms = IntegerOr<int64_t>(request, "duration_ms", 10000);
    chaos.kinds = request.value("kinds", std::vector<std::string>{"kill", "fail", "delay", "corrupt", "cut"});
    chaos.cut_ms = IntegerOr<int64_t>(request, "cut_ms", 1000);
    if (interval_ms < 1)
      return Status::InvalidArgument("chaos interval must be at least 1 ms, got " + std::to_string(interval_ms));
    if (duration_ms < 0)
      return Status::InvalidArgument("chaos duration must not be negative, got " + std::to_string(duration_ms) + " ms");
    if (chaos.cut_ms < 0)
      return Status::InvalidArgument("chaos cut must not be negative, got " + std::to_string(chaos.cut_ms) + " ms");
    if (chaos.kinds.empty()) return Status::InvalidArgument("no chaos kinds; expected some of kill, fail, delay, corrupt, cut");
    for (const auto& k : chaos.kinds) {
      if (k != "kill" && k != "fail" && k != "delay" && k != "corrupt" && k != "cut") {
        return Status::InvalidArgument("unknown chaos kind \"" + k + "\"; expected kill, fail, delay, corrupt or cut");
      }
    }
    chaos.interval = std::chrono::milliseconds(interval_ms);
    chaos.until = clock_.Now() + std::chrono::milliseconds(duration_ms);
    chaos.next = clock_.Now() + chaos.interval;
    const bool replaced = chaos_.has_value();  // one seeded sequence at a time
    chaos_ = std::move(chaos);
    Json reply = {{"random", true}, {"kinds", chaos_->kinds}};
    if (replaced) reply["replaced"] = "the random chaos that was running";
    return reply;
  }
  if (action == "stop") {
    chaos_.reset();
    return Json{{"random", false}};
  }
  return Status::InvalidArgument("unknown chaos action \"" + action +
                                 "\"; expected kill, cut, fail, delay, corrupt, drop, random or stop");
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
    bool stored =
        r.state == VertexState::kCompleted && OutputNeeded(job, VertexId(v)) && !job.g().vertex(VertexId(v)).gang.valid();
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
    Json record = {
        {"fault", FaultKindName(f.kind)}, {"daemon", target->spec.name}, {"at_ms", ElapsedMs(job)}, {"source", f.pointer}};
    if (v.valid()) record["vertex"] = g.vertex(v).name;
    job.faults_log.push_back(record);
    Log(job, v, "injecting " + std::string(FaultKindName(f.kind)) + " on daemon " + target->spec.name);
    if (f.kind == FaultKind::kKillDaemon || f.kind == FaultKind::kKillDaemonOf) {
      Flush();
      ExpectInjectedLoss(*target);
      sink_.SendToDaemon(target->id, daemon_msg::Kill());
    } else {
      protocol::JmToDaemon damage = daemon_msg::Damage(f.kind == FaultKind::kCorruptOutputOf ? protocol::DamageOutputs::CORRUPT
                                                                                             : protocol::DamageOutputs::DROP);
      const Run& r = job.runs[v.value()];
      for (size_t p = 0; p < g.vertex(v).outputs.size(); ++p) {
        *damage.mutable_damage()->add_keys() =
            protocol::MakeOutputKey(job.id.value(), v.value(), r.version, static_cast<uint32_t>(p));
      }
      sink_.SendToDaemon(target->id, damage);
      // Readers detect a damaged output and have it regenerated. A job output may have none
      // that will: a reader that opened it before keeps the undamaged copy, one over a durable
      // channel falls back to its copy, a live channel's reader never reads the stored port,
      // and the job's outputs are fetched only once it completed. The job manager, which did
      // the damage, has a job output regenerated at once.
      if (job.declared[v.value()]) {
        Regenerate(job, v,
                   std::string("a job output ") + (f.kind == FaultKind::kCorruptOutputOf ? "damaged" : "deleted") +
                       " by an injected fault");
        RecomputePending(job);
      }
    }
  }
}

void Scheduler::ArmInjectedFaults(Job& job, VertexId v, uint32_t version, protocol::Task& task) {
  const JobGraph& g = job.g();
  const VertexNode& node = g.vertex(v);
  const auto& faults = job.faults;
  for (size_t i = 0; i < faults.size(); ++i) {
    const FaultSpec& f = faults[i];
    if (!f.vertex || g.FindVertex(f.vertex->ToString()) != v) continue;
    bool armed = (!f.when.completed || job.completions >= static_cast<size_t>(*f.when.completed)) &&
                 (!f.when.after_ms || ElapsedMs(job) >= static_cast<double>(*f.when.after_ms));
    if (!armed) continue;
    if (f.kind == FaultKind::kFail &&
        std::find(f.attempts.begin(), f.attempts.end(), static_cast<int>(version)) != f.attempts.end()) {
      task.set_inject_failure("injected fault " + f.pointer + ": attempt " + std::to_string(version) + " fails");
      job.fault_fired[i] = 1;
      job.faults_log.push_back(
          {{"fault", "fail"}, {"vertex", node.name}, {"attempt", version}, {"at_ms", ElapsedMs(job)}, {"source", f.pointer}});
    }
    if (f.kind == FaultKind::kDelay &&
        std::find(f.attempts.begin(), f.attempts.end(), static_cast<int>(version)) != f.attempts.end()) {
      task.set_delay_ms(f.ms);
      if (!job.fault_fired[i]) {
        job.fault_fired[i] = 1;
        job.faults_log.push_back(
            {{"fault", "delay"}, {"vertex", node.name}, {"ms", f.ms}, {"at_ms", ElapsedMs(job)}, {"source", f.pointer}});
      }
    }
  }
}

}  // namespace copse::jm
