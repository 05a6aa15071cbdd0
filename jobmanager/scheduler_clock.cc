// The scheduler's clock: what happens as time passes — timeouts, stragglers' duplicates,
// return graces running out, finished jobs forgotten (Tick).
#include "jobmanager/daemon_messages.h"
#include "jobmanager/scheduler_state.h"

#include <algorithm>
#include <cstdio>

#include "common/text_util.h"

namespace copse::jm {

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
    // Completed by a returning daemon's outputs (AdoptOutputs), not by a report.
    if (job.state == JobState::kRunning && job.completed == job.runs.size()) FinishJob(job, JobState::kCompleted, "");
    if (job.state != JobState::kRunning) {
      it = (now - job.finished > options_.finished_job_ttl) ? jobs_.erase(it) : std::next(it);
      continue;
    }
    for (uint32_t v : std::vector<uint32_t>(job.running.begin(), job.running.end())) {
      Run& r = job.runs[v];
      double timeout_s = job.g().stage_of(VertexId(v)).timeout_s;
      if (!r.chained_after.empty()) continue;  // not started yet
      if (timeout_s <= 0 || now - r.started < std::chrono::duration<double>(timeout_s)) continue;
      sink_.SendToDaemon(r.daemon, daemon_msg::Cancel(job.id, VertexId(v), r.version));
      Fail(job, VertexId(v), protocol::FAILURE_TIMEOUT, "ran longer than timeout_s=" + std::to_string(timeout_s), true);
      if (job.state != JobState::kRunning) break;
    }
    if (job.state == JobState::kRunning) {
      LaunchDuplicates(job);
      CheckFaults(job);
    }
    if (job.state == JobState::kRunning && !job.guarding.empty()) ReviewGuards(job);
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
    if (!r.chained_after.empty()) continue;                             // not started yet
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
    if (elapsed < options_.straggler_factor * m->second || now - r.started < options_.straggler_min) {
      continue;
    }
    // A daemon other than the straggler's, by the same placement rules.
    const Resources& need = g.stage_of(VertexId(v)).resources;
    Daemon* target = nullptr;
    for (auto& d : daemons_) {
      if (d->alive && d->id != r.daemon && Within(need, d->free_cpus, d->free_gpus, d->free_memory_mb, GpuMemoryOf(d->spec)) &&
          (!target || d->free_cpus > target->free_cpus)) {
        target = d.get();
      }
    }
    if (!target) continue;
    char why[160];
    std::snprintf(why, sizeof(why), "running %.2f s, %.1fx its stage's median of %.3f s", elapsed,
                  elapsed / std::max(m->second, 1e-9), m->second);
    RecordRecovery(job, VertexId(v), r.version, "straggler", why, false);
    Dispatch(job, VertexId(v), *target, /*duplicate=*/true);
  }
}

}  // namespace copse::jm
