// Mirrored channels: a completed output copied into another daemon's memory, so that losing
// the producer's daemon costs no re-run while the copy lives (Gemini's in-memory checkpoints,
// Bamboo's redundant neighbour). The job manager asks a second daemon to fetch the output from
// the producer's data server (a Mirror message) once the producer completed, off the critical
// path; the copy counts only once that daemon says it is whole (Mirrored). The output's
// location stays the producer's; DaemonLost moves it to the copy (PromoteMirror) instead of
// regenerating the producer.
//
// A copy outlives its output's release while it still guards a consumer: until every consumer
// that has a mirrored output of its own completed with that copy whole. A daemon lost just after
// a step's update completed, before its copy was made, then costs two steps (that update runs
// again from the previous one's copy), not the whole lineage.
//
// Not journaled: after a job manager restart the copies are unknown, and the daemons' lists
// of outputs name them as stale (ReleaseStale drops them).
#include <algorithm>

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
  if (!done.ok()) {
    Log(*job, VertexId(key.vertex()),
        "no mirror of its output on daemon " + daemons_[from.value()]->spec.name + ": " + done.error());
    r->mirror = DaemonId::Invalid();
    return;
  }
  r->mirror_ready = true;
  // The copies this one replaces guard nothing more.
  const JobGraph& g = job->g();
  for (ChannelId ch : g.vertex(VertexId(key.vertex())).inputs) {
    const ChannelEdge& c = g.channel(ch);
    Run& p = job->runs[c.from.value()];
    if (c.kind == ChannelKind::kMirrored && p.released && p.mirror.valid() && !MirrorGuards(*job, c.from)) {
      DropMirror(*job, c.from);
    }
  }
}

bool Scheduler::MirrorGuards(const Job& job, VertexId v) const {
  const JobGraph& g = job.g();
  const auto port = MirroredPort(g, v);
  if (!port) return false;
  for (ChannelId ch : g.vertex(v).outputs[*port]) {
    const VertexId u = g.channel(ch).to;
    const Run& c = job.runs[u.value()];
    if (MirroredPort(g, u) && !(c.state == VertexState::kCompleted && c.mirror_ready)) return true;
  }
  return false;
}

bool Scheduler::PromoteMirror(Job& job, VertexId v, const std::string& why) {
  Run& r = job.runs[v.value()];
  if (!r.mirror_ready || !r.mirror.valid() || !daemons_[r.mirror.value()]->alive) return false;
  const auto port = MirroredPort(job.g(), v);
  // Every port still read must be the mirrored one: the copy holds no other.
  for (size_t p = 0; p < r.output_messages.size(); ++p) {
    if (p != *port && r.output_messages[p] > 0 && !OutputReleased(job.g(), v, r, static_cast<int>(p))) return false;
  }
  const Daemon& to = *daemons_[r.mirror.value()];
  r.daemon = r.mirror;
  r.mirror = DaemonId::Invalid();
  r.mirror_ready = false;
  r.released = r.retained_released = false;  // the copy holds it
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
  r.mirror = DaemonId::Invalid();
  r.mirror_ready = false;
}

void Scheduler::ForgetMirrorsOn(DaemonId d) {
  for (auto& [id, job] : jobs_) {
    if (job->state != JobState::kRunning) continue;
    for (Run& r : job->runs) {
      if (r.mirror != d) continue;
      r.mirror = DaemonId::Invalid();
      r.mirror_ready = false;
    }
  }
}

}  // namespace copse::jm
