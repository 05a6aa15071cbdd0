#include "jobmanager/scheduler_state.h"

#include <algorithm>
#include <string_view>

#include "common/text_util.h"
#include "jobmanager/daemon_messages.h"

namespace copse::jm {

namespace {

const std::string kHostLabel = "host";
const std::string kRackLabel = "rack";
constexpr size_t kMaxBlockedScan = 64;  // ready vertices tried per job per pass when slots are short

std::string NameList(const JobGraph& g, const std::vector<VertexId>& vertices) {
  std::string out;
  for (VertexId v : vertices) out += (out.empty() ? "" : ", ") + g.vertex(v).name;
  return out;
}

}  // namespace

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
    return d.alive && Within(need, d.free_cpus, d.free_gpus, d.free_memory_mb, GpuMemoryOf(d.spec)) &&
           d.spec.cpus + 1e-9 >= need.cpus;
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
    std::string host =
        stage.input_hosts.size() == 1 ? stage.input_hosts[0] : stage.input_hosts[replica % stage.input_hosts.size()];
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

void Scheduler::AddNcclInfo(Job& job, VertexId v, uint32_t version, protocol::Task& task) {
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
  task.mutable_nccl()->set_group(group);
  task.mutable_nccl()->set_rank(rank);
  task.mutable_nccl()->set_nranks(static_cast<int32_t>(ranked.size()));
  nccl_groups_[group].insert(job.runs[v.value()].daemon);
  const VertexNode& node = g.vertex(v);
  for (size_t port = 0; port < node.inputs.size(); ++port) {
    const ChannelEdge& c = g.channel(node.inputs[port]);
    if (c.kind == ChannelKind::kNccl) task.mutable_inputs(static_cast<int>(port))->mutable_live()->set_peer_rank(rank_of(c.from));
  }
  for (size_t port = 0; port < node.outputs.size(); ++port) {
    if (node.outputs[port].empty() || g.channel(node.outputs[port].front()).kind != ChannelKind::kNccl) continue;
    for (size_t i = 0; i < node.outputs[port].size(); ++i) {
      task.mutable_outputs(static_cast<int>(port))
          ->mutable_live()
          ->mutable_channels(static_cast<int>(i))
          ->set_peer_rank(rank_of(g.channel(node.outputs[port][i]).to));
    }
  }
}

void Scheduler::RelayNcclId(const std::string& group, const std::string& id, DaemonId from) {
  auto it = nccl_groups_.find(group);
  if (it == nccl_groups_.end()) return;
  for (DaemonId d : it->second) {
    if (d != from && daemons_[d.value()]->alive) sink_.SendToDaemon(d, daemon_msg::NcclId(group, id));
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
    const TimePoint end = clock_.Now();
    wait.epoch = capacity_epoch_ + 1;
    wait.retry_after = end + std::min<Duration>(100 * (end - start), std::chrono::seconds(1));
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
  for (size_t i = 0; i < members.size(); ++i)
    Dispatch(job, members[i], *daemons_[placement.daemons[i].value()], /*duplicate=*/false);
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
                       idle ? d->spec.gpus : d->free_gpus, d->spec.cpus, d->spec.gpus,
                       idle ? MemoryOf(d->spec) : d->free_memory_mb, MemoryOf(d->spec), GpuMemoryOf(d->spec)});
  }
  return PlaceGang(request, daemons, *job.gang_needs, *policy_);
}

bool Scheduler::PinFits(const Job& job, const StageSpec& stage, const Daemon& d,
                        const std::map<std::string, DaemonId>& pins) const {
  return stage.affinity.empty() ||
         job.gang_needs->PinFits(stage.affinity, {d.id, d.spec.cpus, d.spec.gpus, MemoryOf(d.spec), GpuMemoryOf(d.spec)}, pins);
}

void Scheduler::Dispatch(Job& job, VertexId v, Daemon& d, bool duplicate, const std::vector<VertexId>& after) {
  const JobGraph& g = job.g();
  const VertexNode& node = g.vertex(v);
  const StageSpec& stage = g.stage_of(v);
  Run& r = job.runs[v.value()];
  uint32_t version = std::max(r.version, r.dup_version) + 1;
  if (node.gang.valid()) version = job.gang_version[node.gang.value()];  // one version per gang attempt
  ++(duplicate ? counters_.duplicates_dispatched : counters_.attempts_dispatched);
  if (!duplicate && r.state == VertexState::kReady) {
    counters_.scheduling_latency_s.Observe(std::chrono::duration<double>(clock_.Now() - r.ready_since).count());
  }
  if (duplicate) {
    r.dup_version = version;
    r.dup_daemon = d.id;
    r.dup_started = clock_.Now();
  } else {
    r.state = VertexState::kRunning;
    r.version = version;
    r.daemon = d.id;
    r.started = clock_.Now();
    r.dispatched_after_moves = mirror_moves_;  // the input locations it was sent (scheduler_mirrors.cc)
    r.chained_after = after;
    job.running.insert(v.value());
  }
  d.free_cpus -= stage.resources.cpus;
  d.free_gpus -= stage.resources.gpus;
  d.free_memory_mb -= stage.resources.memory_mb;
  ++d.running;

  protocol::JmToDaemon& batch = outbox_[d.id];
  protocol::Task& task = *batch.mutable_run()->add_tasks();
  task.set_job(job.id.value());
  task.set_vertex(v.value());
  task.set_version(version);
  task.set_name(node.name);
  task.set_program(stage.program);
  task.set_replica(node.replica);
  task.set_params_json(*node.params);
  task.set_job_dir(job.job_dir);
  task.set_threads(static_cast<uint32_t>(std::max(1, static_cast<int>(stage.resources.cpus))));
  task.set_gpus(static_cast<uint32_t>(stage.resources.gpus));
  task.set_memory_mb(stage.resources.memory_mb);
  for (ChannelId ch : node.inputs) {
    const ChannelEdge& c = g.channel(ch);
    const Run& p = job.runs[c.from.value()];
    protocol::Input& in = *task.add_inputs();
    if (IsLive(c.kind)) {
      in.mutable_live()->set_kind(daemon_msg::ToProtocol(c.kind));
      *in.mutable_live()->mutable_key() = protocol::MakeStreamKey(job.id.value(), ch.value(), version);
      continue;
    }
    // A producer still running (v is chained after it) has no counts yet: those it has are an
    // earlier attempt's.
    if (p.state == VertexState::kCompleted && static_cast<size_t>(c.from_port) < p.output_messages.size() &&
        p.output_messages[c.from_port] == 0) {
      in.mutable_empty();  // nothing to fetch: the reader ends at once
      continue;
    }
    const Daemon& pd = *daemons_[p.daemon.value()];
    protocol::StoredInput& stored = *in.mutable_stored();
    *stored.mutable_key() = protocol::MakeOutputKey(job.id.value(), c.from.value(), p.version, c.from_port);
    // A durable input names its copy too: the only source once the producer's store cannot
    // serve it (its daemon is gone, or the memory output was released after its consumers
    // completed), else the daemon's fallback.
    const bool durable = c.kind == ChannelKind::kDurable;
    if (durable) stored.set_durable(DurablePath(job, c.from, p.version, c.from_port));
    const bool store_serves = pd.alive && !(p.state == VertexState::kCompleted && OutputReleased(g, c.from, p, c.from_port));
    if (!durable || store_serves) {
      protocol::StoreLocation& at = *stored.mutable_store();
      at.set_local(p.daemon == d.id);
      at.set_host(pd.spec.data_host);
      at.set_port(pd.spec.data_port);
    }
  }
  for (const auto& port : node.outputs) {
    protocol::Output& out = *task.add_outputs();
    const ChannelKind kind = PortKind(g, port);
    if (kind == ChannelKind::kDurable) {  // a memory output with a copy there
      out.set_durable(DurablePath(job, v, version, task.outputs_size() - 1));
      continue;
    }
    if (!IsLive(kind)) {
      out.set_stored(daemon_msg::ToProtocol(kind));
      continue;
    }
    // A live output goes straight to each consumer (placed with this gang): where and as what.
    protocol::LiveOutput& live = *out.mutable_live();
    live.set_kind(daemon_msg::ToProtocol(kind));
    for (ChannelId ch : port) {
      const Daemon& to = *daemons_[job.runs[g.channel(ch).to.value()].daemon.value()];
      protocol::LiveChannel& channel = *live.add_channels();
      *channel.mutable_key() = protocol::MakeStreamKey(job.id.value(), ch.value(), version);
      *channel.mutable_peer() = to.spec.stream_endpoints;
    }
  }
  if (node.gang.valid()) AddNcclInfo(job, v, version, task);
  for (VertexId a : after) {
    const Run& p = job.runs[a.value()];
    protocol::ChainedAfter& chained = *task.add_after();
    chained.set_vertex(a.value());
    chained.set_version(p.version);
    chained.set_remote(p.daemon != d.id);
  }
  ArmInjectedFaults(job, v, version, task);
  if (job.spans.size() < kMaxSpans) {
    job.open_spans[{v.value(), version}] = job.spans.size();
    job.spans.push_back({v.value(), version, d.id, ElapsedMs(job), -1, ""});
  }
  Log(job, v,
      "version " + std::to_string(version) + (duplicate ? " (straggler duplicate)" : "") + " placed on " + d.spec.name +
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
    if (!releases_due_ && static_cast<size_t>(batch.msg.release().keys_size()) < kReleaseBatchKeys &&
        batch.bytes < kReleaseBatchBytes) {
      ++it;
      continue;
    }
    if (daemons_[daemon.value()]->alive && batch.msg.release().keys_size() > 0) sink_.SendToDaemon(daemon, batch.msg);
    it = release_outbox_.erase(it);
  }
  releases_due_ = false;
}

}  // namespace copse::jm
