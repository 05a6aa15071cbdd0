#include "vertex/attempt_executor.h"

#include <algorithm>
#include <thread>
#include <vector>

#include "channels/remote_reader.h"
#include "channels/stream_key.h"
#ifdef COPSE_HAVE_NCCL
#include "channels/nccl/nccl_channel.h"
#endif
#include "protocol/keys.h"
#include "vertex/attempt_channels.h"
#include "vertex/protocol_types.h"

namespace copse::vertex {

chan::StreamOptions AttemptExecutor::LiveOptions(const AttemptTask& task) const {
  chan::StreamOptions o;
  o.cancel = task.cancel.get();
  o.peer_timeout = env_.live_peer_timeout;
  return o;
}

Result<std::unique_ptr<chan::ChannelReader>> AttemptExecutor::OpenLiveReader(const protocol::LiveInput& in,
                                                                             AttemptTask& task) const {
  const chan::StreamKey key = FromProtocol(in.key());
  switch (in.kind()) {
    case protocol::CHANNEL_STREAM: return env_.hub->OpenReader(key, LiveOptions(task));
    case protocol::CHANNEL_SHM: return env_.shm->OpenReader(key, LiveOptions(task));
#ifdef COPSE_HAVE_NCCL
    case protocol::CHANNEL_NCCL:
      if (task.nccl) return chan::nccl::MakeNcclReader(*task.nccl, in.peer_rank(), task.device);
      break;
#endif
    default: break;
  }
  return Status::FailedPrecondition("this daemon cannot run " + std::string(protocol::ChannelKindName(in.kind())) +
                                    " channels (built without GPU support)");
}

Result<std::unique_ptr<chan::ChannelWriter>> AttemptExecutor::OpenLiveWriter(const protocol::LiveOutput& out,
                                                                             AttemptTask& task) const {
  std::vector<std::unique_ptr<chan::ChannelWriter>> writers;
  for (const protocol::LiveChannel& ch : out.channels()) {
    const chan::StreamKey key = FromProtocol(ch.key());
    Result<std::unique_ptr<chan::ChannelWriter>> w = Status::FailedPrecondition(
        "this daemon cannot run " + std::string(protocol::ChannelKindName(out.kind())) + " channels (built without GPU support)");
    if (out.kind() == protocol::CHANNEL_STREAM) w = env_.hub->OpenWriter(FromProtocol(ch.peer()), key, LiveOptions(task));
    if (out.kind() == protocol::CHANNEL_SHM) w = env_.shm->OpenWriter(key, LiveOptions(task));
#ifdef COPSE_HAVE_NCCL
    if (out.kind() == protocol::CHANNEL_NCCL && task.nccl)
      w = chan::nccl::MakeNcclWriter(*task.nccl, ch.peer_rank(), task.device);
#endif
    if (!w.ok()) return w.status();
    writers.push_back(std::move(*w));
  }
  if (writers.size() == 1) return std::move(writers.front());
  return std::unique_ptr<chan::ChannelWriter>(std::make_unique<TeeWriter>(std::move(writers)));
}

protocol::AttemptReport AttemptExecutor::Execute(AttemptTask& task) const {
  const protocol::Task& spec = task.spec;
  auto started = std::chrono::steady_clock::now();
  protocol::AttemptReport report;
  report.set_job(spec.job());
  report.set_vertex(spec.vertex());
  report.set_version(spec.version());
  // `code`: why input `lost_input` could not be read; Unavailable (its daemon unreachable)
  // tells the job manager the output itself may be intact (held for a daemon's return).
  auto fail = [&](protocol::FailureClass cls, const std::string& error, int lost_input = -1, StatusCode code = StatusCode::kOk) {
    report.set_ok(false);
    report.set_failure(cls);
    report.set_error(error);
    if (lost_input >= 0) {
      report.set_lost_input(static_cast<uint32_t>(lost_input));
      // Which version of it: one the job manager has since re-run is not lost again.
      const protocol::Input& in = spec.inputs(lost_input);
      if (in.has_stored()) report.set_lost_input_version(in.stored().key().version());
      if (code == StatusCode::kUnavailable) report.set_lost_input_unreachable(true);
    }
    report.set_duration_ms(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - started).count());
    return report;
  };
  try {
    const std::string& name = spec.name();
    if (!spec.inject_failure().empty()) return fail(protocol::FAILURE_PROGRAM_ERROR, spec.inject_failure());
    if (const int64_t delay = spec.delay_ms(); delay > 0) {  // checked: at most a day
      auto until = started + std::chrono::milliseconds(delay);
      while (std::chrono::steady_clock::now() < until && !task.cancel->load()) {
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      }
    }
    auto program = env_.programs->Create(spec.program());
    if (!program.ok()) return fail(protocol::FAILURE_PROGRAM_ERROR, program.status().message());

    const uint64_t job = spec.job();
    const uint32_t vertex = spec.vertex();
    const uint32_t version = spec.version();
    int lost_port = -1;
    const int gpus = static_cast<int>(std::min<uint32_t>(spec.gpus(), 1'000'000));
    const GpuPool::Lease gpu = env_.gpus->Acquire(gpus, *task.cancel);
    if (task.cancel->load()) return fail(protocol::FAILURE_CANCELLED, "cancelled");
    if (gpus > 0 && gpu.device() < 0) {
      // Not charged: the attempt holding it is at fault, if anyone is.
      return fail(protocol::FAILURE_INPUT_LOST, "no GPU of this daemon's " + std::to_string(env_.gpus->size()) +
                                                    " came free within " + std::to_string(GpuPool::kDefaultWait.count()) + " s");
    }
    if (spec.has_nccl()) {
      Status st = env_.join_nccl ? env_.join_nccl(spec.nccl(), gpu.device(), task)
                                 : Status::FailedPrecondition("this daemon cannot join NCCL groups");
      // Charged like the program's own error: no GPU, no NCCL or a failed init will fail the
      // same way again, and a gang restarted for free would do so without end. A peer lost
      // meanwhile usually restarts the gang first (this report is then stale); when NCCL
      // notices first, the member is charged one attempt for it.
      if (task.cancel->load()) return fail(protocol::FAILURE_CANCELLED, "cancelled");
      if (!st.ok()) return fail(protocol::FAILURE_PROGRAM_ERROR, "joining the gang's NCCL group: " + st.message());
    }
    std::vector<std::unique_ptr<chan::ChannelReader>> readers;
    for (int port = 0; port < spec.inputs_size(); ++port) {
      const protocol::Input& in = spec.inputs(port);
      if (in.has_live()) {
        auto reader = OpenLiveReader(in.live(), task);
        if (!reader.ok())
          return fail(protocol::FAILURE_INPUT_LOST, "input " + std::to_string(port) + ": " + reader.status().message(), port);
        readers.push_back(std::make_unique<TrackingReader>(std::move(*reader), port, &lost_port));
        continue;
      }
      if (in.has_empty()) {
        readers.push_back(std::make_unique<EmptyReader>());
        continue;
      }
      const protocol::StoredInput& stored = in.stored();
      const chan::OutputKey key = FromProtocol(stored.key());
      if (auto prefetched = task.prefetched ? task.prefetched->Take(static_cast<size_t>(port)) : nullptr) {
        readers.push_back(std::move(prefetched));
        continue;
      }
      // A durable input comes from its producer's store like a memory one, and from its copy
      // when the job manager sends no store (its daemon is gone, or it was released) or the
      // store cannot deliver it.
      const std::string& copy = stored.durable();
      const bool copy_only = !copy.empty() && !stored.has_store();
      chan::RemoteReaderOptions remote;
      remote.tls = env_.tls;
      auto reader = copy_only ? chan::OutputStore::OpenDurableCopy(copy, key)
                    : stored.store().local()
                        ? env_.store->OpenReader(key)
                        : chan::OpenRemoteReader(stored.store().host(), static_cast<uint16_t>(stored.store().port()), key,
                                                 env_.secret, remote);
      if (!copy.empty() && !copy_only) {
        reader = reader.ok() ? chan::OutputStore::WithDurableFallback(std::move(*reader), copy, key)
                             : chan::OutputStore::OpenDurableCopy(copy, key);
      }
      if (!reader.ok()) {
        return fail(protocol::FAILURE_INPUT_LOST,
                    "input " + std::to_string(port) + " (" + key.ToString() + "): " + reader.status().message(), port,
                    reader.status().code());
      }
      readers.push_back(std::make_unique<TrackingReader>(std::move(*reader), port, &lost_port));
    }
    std::vector<std::unique_ptr<CountingWriter>> writers;
    for (int port = 0; port < spec.outputs_size(); ++port) {
      const protocol::Output& out = spec.outputs(port);
      if (out.has_live()) {
        auto writer = OpenLiveWriter(out.live(), task);
        if (!writer.ok())
          return fail(protocol::FAILURE_INPUT_LOST, "output " + std::to_string(port) + ": " + writer.status().message());
        writers.push_back(std::make_unique<CountingWriter>(std::move(*writer)));
        continue;
      }
      // file, memory, or durable: a memory output with a copy at its path.
      const bool durable = out.has_durable();
      auto kind = durable || out.stored() == protocol::CHANNEL_MEMORY ? chan::StorageKind::kMemory : chan::StorageKind::kFile;
      auto writer = env_.store->CreateWriter({job, vertex, version, static_cast<uint32_t>(port)}, kind,
                                             durable ? std::filesystem::path(out.durable()) : std::filesystem::path());
      if (!writer.ok()) return fail(protocol::FAILURE_PROGRAM_ERROR, writer.status().message());
      writers.push_back(std::make_unique<CountingWriter>(std::move(*writer)));
    }
    // Created on demand (VertexContext::MakeScratchDir): most vertices never touch disk.
    auto scratch =
        env_.work_dir / "scratch" / (std::to_string(job) + "-" + std::to_string(vertex) + "-" + std::to_string(version));
    Json params = Json::object();
    if (!spec.params_json().empty()) {
      auto parsed = ParseJson(spec.params_json(), "params of " + name);
      if (!parsed.ok()) return fail(protocol::FAILURE_PROGRAM_ERROR, parsed.status().message());
      params = std::move(*parsed);
    }
    VertexContext ctx;
    ctx.name = name;
    ctx.replica = static_cast<int>(spec.replica());
    ctx.version = version;
    ctx.params = &params;
    for (auto& r : readers) ctx.inputs.push_back(r.get());
    for (auto& w : writers) ctx.outputs.push_back(w.get());
    ctx.cancel_flag = task.cancel.get();
    ctx.attempt_log = task.log.get();
    ctx.scratch_dir = scratch;
    ctx.job_dir = spec.job_dir();
    ctx.threads = std::max(1u, spec.threads());
    // Its own limit when its stage declares one, else its cpus' share of what this daemon
    // offers: the vertices it can run at once then fit together.
    const int64_t declared_mb = spec.memory_mb();
    ctx.memory_declared = declared_mb > 0;
    ctx.memory_limit_bytes =
        (ctx.memory_declared ? declared_mb
                             : std::max<int64_t>(1, env_.memory_mb * std::max<int64_t>(1, ctx.threads) / std::max(1, env_.cpus)))
        << 20;
    ctx.gpu = gpu.device();
    ctx.collective = task.collective.get();
    Status st;
    try {
      st = (*program)->Run(ctx);
    } catch (const ParamError& e) {
      st = Status::InvalidArgument(name + ": " + e.what());
    } catch (const std::exception& e) {
      st = Status::Internal(name + " threw: " + e.what());
    } catch (...) {
      st = Status::Internal(name + " threw a non-standard exception");
    }
    if (st.ok()) {
      for (auto& w : writers) {
        if (!w->closed()) st = w->Close();
        if (!st.ok()) break;
      }
    }
    std::error_code ec;
    if (ctx.scratch_created()) std::filesystem::remove_all(scratch, ec);
    if (task.cancel->load()) return fail(protocol::FAILURE_CANCELLED, "cancelled");
    if (!st.ok()) {
      if (lost_port >= 0)
        return fail(protocol::FAILURE_INPUT_LOST, "input " + std::to_string(lost_port) + ": " + st.message(), lost_port,
                    st.code());
      fail(protocol::FAILURE_PROGRAM_ERROR, st.message());
      if (IsDeterministicError(st.code())) report.set_deterministic(true);
      return report;
    }
    for (auto& w : writers) {
      report.add_output_bytes(w->bytes());
      report.add_output_messages(w->messages());
    }
    report.set_ok(true);
    if (ctx.progress.is_object()) report.set_progress_json(DumpJson(ctx.progress));
    report.set_duration_ms(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - started).count());
    return report;
  } catch (const std::exception& e) {
    return fail(protocol::FAILURE_PROGRAM_ERROR, std::string("malformed task: ") + e.what());
  }
}

}  // namespace copse::vertex
