#include "jobmanager/daemon_messages.h"
#include "jobmanager/scheduler_state.h"

namespace copse::jm {

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
    d->free_memory_mb = MemoryOf(spec);
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
    AdoptOutputs(*d, inventory);
    ReleaseStale(*d, inventory);
    Schedule();
    return d->id;
  }
  auto d = std::make_unique<Daemon>();
  d->id = DaemonId(static_cast<uint32_t>(daemons_.size()));
  d->free_cpus = spec.cpus;
  d->free_gpus = spec.gpus;
  d->free_memory_mb = MemoryOf(spec);
  d->spec = std::move(spec);
  ++capacity_epoch_;
  DaemonId id = d->id;
  SchedLog()->info("daemon {} joined: {} cpus, {} gpus, data at {}:{}", d->spec.name, d->spec.cpus, d->spec.gpus,
                   d->spec.data_host, d->spec.data_port);
  daemons_.push_back(std::move(d));
  AdoptOutputs(*daemons_.back(), inventory);
  ReleaseStale(*daemons_.back(), inventory);
  Schedule();
  return id;
}

void Scheduler::AdoptOutputs(const Daemon& d, const OutputInventory& inventory) {
  size_t adopted = 0;
  std::vector<std::pair<Job*, VertexId>> running_jobs;  // adopted vertices of running jobs
  for (const auto& [job_id, vertex, version, port] : inventory) {
    auto it = jobs_.find(JobId(job_id));
    if (it == jobs_.end() || vertex >= it->second->runs.size()) continue;
    Job& job = *it->second;
    Run& r = job.runs[vertex];
    if (r.version != version || !r.daemon.valid() || r.daemon == d.id) continue;
    const Daemon& earlier = *daemons_[r.daemon.value()];
    if (earlier.alive || earlier.awaiting || earlier.spec.name != d.spec.name) continue;
    // Still the version the job manager would read there: completed, or counted lost with
    // that earlier registration and not run again since (a gang restarts whole instead).
    const bool running = job.state == JobState::kRunning;
    const bool completed = r.state == VertexState::kCompleted;
    const bool lost_with_it = running && r.lost_with_daemon_version == version &&
                              (r.state == VertexState::kWaiting || r.state == VertexState::kReady) &&
                              !job.g().vertex(VertexId(vertex)).gang.valid();
    if (!completed && !lost_with_it) continue;
    if (!running && !(job.state == JobState::kCompleted && job.declared[vertex])) continue;
    if (!HoldsWhatIsRead(job, VertexId(vertex), inventory)) continue;
    r.daemon = d.id;
    ++adopted;
    // A finished job's log ended with it (its history is what people read); the job manager's
    // log tells of its outputs coming back (the count below).
    if (running)
      Log(job, VertexId(vertex), "output of version " + std::to_string(version) + " is on daemon " + d.spec.name + " again");
    if (running) running_jobs.emplace_back(&job, VertexId(vertex));
    if (completed) continue;  // the journal names daemons by name: its "done" record still holds
    r.state = VertexState::kCompleted;
    r.lost_with_daemon_version = 0;
    job.settled[vertex] = 0;
    ++job.completed;
    Journal(DoneRecord(job, VertexId(vertex)));
  }
  if (adopted) SchedLog()->info("daemon {}: it serves {} completed vertices' outputs again", d.spec.name, adopted);
  std::set<Job*> touched;
  for (const auto& entry : running_jobs) {
    Job* job = entry.first;  // not a structured binding: clang before 16 cannot capture one in a lambda
    const VertexId v = entry.second;
    touched.insert(job);
    // What was not released or settled while its daemon was gone (both need it alive) is now.
    ForEachSuccessor(job->g(), v, [&](VertexId u) {
      if (job->runs[u.value()].state == VertexState::kCompleted) ReleaseConsumedInputs(*job, u);
    });
    if (job->retains) Settle(*job, v);
  }
  // A job that has every vertex completed again ends at the next tick, once this daemon's
  // connection can be sent its end-of-job cleanup too.
  for (Job* job : touched) RecomputePending(*job);
}

bool Scheduler::HoldsWhatIsRead(const Job& job, VertexId v, const OutputInventory& inventory) const {
  const Run& r = job.runs[v.value()];
  auto listed = [&](size_t port) {
    return inventory.count({job.id.value(), v.value(), r.version, static_cast<uint32_t>(port)}) > 0;
  };
  if (job.state != JobState::kRunning) {
    // A finished job's daemons kept only its declared outputs (FinishJob's gc): those ports.
    for (const auto& o : job.g().spec().outputs) {
      if (job.g().FindVertex(o.from.ToString()) == v && !listed(static_cast<size_t>(o.port))) return false;
    }
    return true;
  }
  for (size_t port = 0; port < r.output_messages.size(); ++port) {
    const bool read = r.output_messages[port] > 0 && !OutputReleased(job.g(), v, r, static_cast<int>(port));
    if (read && !listed(port)) return false;  // half an output is none
  }
  return true;
}

void Scheduler::ReleaseStale(const Daemon& d, const OutputInventory& inventory) {
  protocol::JmToDaemon release;
  auto& keys = *release.mutable_release()->mutable_keys();
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
      if (r.mirror == d.id && r.version == version) continue;  // its mirror (a daemon re-registering while not lost)
    }
    *keys.Add() = protocol::MakeOutputKey(job_id, vertex, version, port);
  }
  if (keys.empty()) return;
  SchedLog()->info("daemon {}: releasing {} listed outputs no job needs", d.spec.name, keys.size());
  stale_outbox_[d.id] = std::move(release);
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
  d.free_memory_mb = 0;
  ++capacity_epoch_;  // its jobs' affinity pins to it go
  d.running = 0;      // every attempt there died with it, duplicates whose other attempt carries on included
  SchedLog()->warn("daemon {} lost: {}{}", d.spec.name, why, hold_files ? " (its file outputs are held for its return)" : "");
  outbox_.erase(id);
  stale_outbox_.erase(id);
  release_outbox_.erase(id);
  ForgetMirrorsOn(id);  // the copies it held for other daemons' outputs
  // Consumers elsewhere fetching from it (a stopped or cut-off daemon accepts and then says
  // nothing) would hold their slots for the data plane's read timeout: their daemons end those
  // fetches now, and the attempts report the input unreachable.
  if (d.spec.data_port != 0) {
    const protocol::JmToDaemon peer_lost = daemon_msg::PeerLost(d.spec.data_host, d.spec.data_port);
    for (const auto& other : daemons_) {
      if (other->alive) sink_.SendToDaemon(other->id, peer_lost);
    }
  }
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
                      "crash its daemon?); the last, " +
                      d.spec.name + ": " + why);
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
        Log(job, VertexId(v),
            "one attempt lost with daemon " + d.spec.name + "; version " + std::to_string(r.version) + " carries on");
        continue;
      }
      std::string error = "daemon " + d.spec.name + " lost: " + why;
      if (unexplained) {
        error += " (" + std::to_string(r.daemon_losses) + " of " + std::to_string(allowed) + " such losses allowed)";
      }
      Fail(job, VertexId(v), protocol::FAILURE_DAEMON_LOST, error, false);
    }
    if (job.state != JobState::kRunning) continue;
    // Outputs stored there are gone: regenerate those still needed, consumers first so that a
    // producer whose consumer is being regenerated is seen as needed too (lineage).
    const auto& order = g.topological_order();
    for (auto it = order.rbegin(); it != order.rend(); ++it) {
      VertexId v = *it;
      Run& r = job.runs[v.value()];
      if (r.state != VertexState::kCompleted || r.daemon != id || r.released) continue;
      if (PromoteMirror(job, v, "was lost with daemon " + d.spec.name)) continue;  // its copy in another daemon's memory serves
      if (hold_files && OutputsInFiles(g, v)) continue;                            // until it is back, or its grace is over
      // Durable channels have their copies: lineage stops at them (a checkpoint).
      if (OutputNeeded(job, v, /*count_durable=*/false)) {
        Regenerate(job, v, "its outputs were on lost daemon " + d.spec.name);
        if (r.state != VertexState::kCompleted) r.lost_with_daemon_version = r.version;
      }
    }
    RecomputePending(job);
  }
  Schedule();
}

}  // namespace copse::jm
