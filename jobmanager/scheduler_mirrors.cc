// Mirrored channels: a completed output copied into another daemon's memory, so that losing
// the producer's daemon costs no re-run while the copy lives (Gemini's in-memory checkpoints,
// Bamboo's redundant neighbour). The job manager asks a second daemon to fetch the output from
// the producer's data server (a Mirror message) once the producer completed, off the critical
// path; the copy counts only once that daemon says it is whole (Mirrored). The output's
// location stays the producer's; DaemonLost moves it to the copy (PromoteMirror) instead of
// regenerating the producer.
//
// A copy outlives its output's release while it still guards what follows: until each of the
// nearest mirrored vertices downstream completed with its copy whole. A pipeline stage lost just
// after its mirrored update completed, before that copy was made, then re-runs from the
// previous mirrored update's copy (K + 1 steps when every K-th is mirrored), not its whole
// lineage.
//
// Not journaled: after a job manager restart the copies are unknown, and the daemons' lists
// of outputs name them as stale (ReleaseStale drops them).
#include <algorithm>
#include <unordered_set>

#include "jobmanager/daemon_messages.h"
#include "jobmanager/scheduler.h"
#include "jobmanager/scheduler_state.h"

namespace copse::jm {

std::optional<size_t> Scheduler::MirroredPort(const JobGraph& g, VertexId v) {
  const auto& ports = g.vertex(v).outputs;
  for (size_t port = 0; port < ports.size(); ++port)
    if (PortKind(g, ports[port]) == ChannelKind::kMirrored) return port;
  return std::nullopt;
}

void Scheduler::StartMirror(Job& job, VertexId v) {
  Run& r = job.runs[v.value()];
  const auto port = MirroredPort(job.g(), v);
  if (!port || *port >= r.output_messages.size() || r.output_messages[*port] == 0 || !r.daemon.valid()) return;
  // The next live daemon after the producer's, in id order: each daemon's copies go to one
  // neighbour, and a spare daemon (where a lost stage is likely to run again) takes some.
  const size_t n = daemons_.size();
  for (size_t k = 1; k < n; ++k) {
    Daemon& d = *daemons_[(r.daemon.value() + k) % n];
    if (!d.alive || d.awaiting) continue;
    const Daemon& producer = *daemons_[r.daemon.value()];
    r.mirror = d.id;
    r.mirror_ready = false;
    sink_.SendToDaemon(
        d.id, daemon_msg::Mirror(protocol::MakeOutputKey(job.id.value(), v.value(), r.version, static_cast<uint32_t>(*port)),
                                 producer.spec.data_host, producer.spec.data_port));
    return;
  }
}

void Scheduler::OnMirrored(const protocol::Mirrored& done, DaemonId from) {
  const protocol::OutputKey& key = done.key();
  auto it = jobs_.find(JobId(key.job()));
  Job* job = it == jobs_.end() ? nullptr : it->second.get();
  Run* r = job && key.vertex() < job->runs.size() ? &job->runs[key.vertex()] : nullptr;
  const bool current = r && job->state == JobState::kRunning && r->state == VertexState::kCompleted &&
                       r->version == key.version() && r->mirror == from && !r->mirror_ready;
  if (!current) {
    // Too late: the output was released, regenerated or the job ended meanwhile. The copy is
    // of no use; drop it (a release of a key the store lacks is nothing).
    if (done.ok() && from.valid() && from.value() < daemons_.size() && daemons_[from.value()]->alive) {
      protocol::JmToDaemon release;
      *release.mutable_release()->add_keys() = key;
      sink_.SendToDaemon(from, release);
    }
    return;
  }
  const VertexId v(key.vertex());
  if (!done.ok()) {
    Log(*job, v, "no mirror of its output on daemon " + daemons_[from.value()]->spec.name + ": " + done.error());
    r->mirror = DaemonId::Invalid();
  } else {
    r->mirror_ready = true;
  }
  // Its primary's release waited for the copy (a fetch from a released output finds nothing).
  if (r->release_after_mirror) {
    r->release_after_mirror = false;
    if (const auto port = MirroredPort(job->g(), v)) {
      QueueReleaseOn(r->daemon, *job, v, *port);
      if (r->mirror.valid() && !MirrorGuards(*job, v)) DropMirror(*job, v);
      if (r->mirror.valid()) job->guarding.insert(v.value());
    }
  }
  if (done.ok()) ReviewGuards(*job);  // the copies this one replaces may guard nothing more
}

void Scheduler::ReleaseMirrored(Job& job, VertexId v, size_t port) {
  Run& r = job.runs[v.value()];
  if (r.mirror.valid() && !r.mirror_ready) {
    r.release_after_mirror = true;  // OnMirrored releases it
    return;
  }
  QueueReleaseOn(r.daemon, job, v, port);
  if (!r.mirror.valid()) return;
  if (MirrorGuards(job, v)) {
    job.guarding.insert(v.value());  // dropped by ReviewGuards once it guards nothing
  } else {
    DropMirror(job, v);
  }
}

void Scheduler::ReviewGuards(Job& job) {
  for (auto it = job.guarding.begin(); it != job.guarding.end();) {
    const VertexId v(*it);
    const Run& r = job.runs[v.value()];
    if (!r.mirror.valid()) {
      it = job.guarding.erase(it);
    } else if (!MirrorGuards(job, v)) {
      it = job.guarding.erase(it);
      DropMirror(job, v);
    } else {
      ++it;
    }
  }
}

bool Scheduler::MirrorGuards(const Job& job, VertexId v) const {
  // What recovery could have to re-run from v's copy: the vertices downstream of v up to the
  // nearest whole copies. While one of those has not completed (a lost output of a completed
  // one is needed only by one that has not), or a copy there is still being made, v's copy may
  // be the newest to resume from. A mirrored vertex with no copy (none could be made, it
  // failed, it was dropped once those after it were whole, its daemon was lost, it moved) is
  // walked past like any other. A walk longer than kMaxGuardWalk gives the guard up: a copy
  // held that far back is worth less than the job manager's time each tick.
  constexpr size_t kMaxGuardWalk = 100'000;
  const JobGraph& g = job.g();
  std::vector<VertexId> work{v};
  std::unordered_set<uint32_t> seen{v.value()};
  bool guards = false;
  auto visit = [&](VertexId u) {
    if (guards || !seen.insert(u.value()).second) return;
    const Run& c = job.runs[u.value()];
    if (c.state != VertexState::kCompleted) {
      guards = true;
    } else if (c.mirror.valid() && MirroredPort(g, u)) {
      guards = !c.mirror_ready;  // being made: guards; whole: the walk stops there
    } else {
      work.push_back(u);
    }
  };
  while (!work.empty() && !guards) {
    if (seen.size() > kMaxGuardWalk) return false;
    const VertexId x = work.back();
    work.pop_back();
    ForEachSuccessor(g, x, visit);
  }
  return guards;
}

bool Scheduler::PromoteMirror(Job& job, VertexId v, const std::string& why) {
  Run& r = job.runs[v.value()];
  if (!r.mirror_ready || !r.mirror.valid() || !daemons_[r.mirror.value()]->alive) return false;
  const auto port = MirroredPort(job.g(), v);
  // The copy holds the mirrored port alone: a vertex with data on another port re-runs.
  for (size_t p = 0; p < r.output_messages.size(); ++p) {
    if (p != *port && r.output_messages[p] > 0) return false;
  }
  const Daemon& to = *daemons_[r.mirror.value()];
  // A primary still held where it was made (a consumer could not read it there) goes.
  if (r.daemon.valid() && daemons_[r.daemon.value()]->alive && !OutputReleased(job.g(), v, r, static_cast<int>(*port)))
    QueueReleaseOn(r.daemon, job, v, *port);
  r.daemon = r.mirror;
  r.mirror = DaemonId::Invalid();
  r.mirror_ready = false;
  r.release_after_mirror = false;
  r.released = r.retained_released = false;  // the copy holds it
  r.moved = ++mirror_moves_;
  job.guarding.erase(v.value());
  Journal(DoneRecord(job, v));  // where it is now: a restarted job manager looks for it there
  Log(job, v,
      "output of version " + std::to_string(r.version) + " " + why + "; its mirror on daemon " + to.spec.name + " serves it");
  ++job.mirrors_used;
  return true;
}

void Scheduler::DropMirror(Job& job, VertexId v) {
  Run& r = job.runs[v.value()];
  if (!r.mirror.valid()) return;
  if (daemons_[r.mirror.value()]->alive) {
    if (const auto port = MirroredPort(job.g(), v)) QueueReleaseOn(r.mirror, job, v, *port);
  }
  if (r.release_after_mirror && r.daemon.valid() && daemons_[r.daemon.value()]->alive) {
    if (const auto port = MirroredPort(job.g(), v)) QueueReleaseOn(r.daemon, job, v, *port);
  }
  r.release_after_mirror = false;
  r.mirror = DaemonId::Invalid();
  r.mirror_ready = false;
  job.guarding.erase(v.value());
}

void Scheduler::ForgetMirrorsOn(DaemonId d) {
  for (auto& [id, job] : jobs_) {
    if (job->state != JobState::kRunning) continue;
    // DropMirror sends nothing to d (no longer alive), and releases a primary that waited for
    // the copy.
    for (size_t v = 0; v < job->runs.size(); ++v)
      if (job->runs[v].mirror == d) DropMirror(*job, VertexId(static_cast<uint32_t>(v)));
  }
}

}  // namespace copse::jm
