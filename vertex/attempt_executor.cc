#include "vertex/attempt_executor.h"

#include <algorithm>
#include <thread>
#include <vector>

#include "channels/remote_reader.h"
#include "channels/stream_key.h"
#ifdef COPSE_HAVE_NCCL
#include "channels/nccl/nccl_channel.h"
#endif
#include "vertex/attempt_channels.h"

namespace copse::vertex {

chan::StreamOptions AttemptExecutor::LiveOptions(const AttemptTask& task) const {
  chan::StreamOptions o;
  o.cancel = task.cancel.get();
  o.peer_timeout = env_.live_peer_timeout;
  return o;
}

Result<std::unique_ptr<chan::ChannelReader>> AttemptExecutor::OpenLiveReader(const Json& in, AttemptTask& task) const {
  COPSE_ASSIGN_OR_RETURN(auto key, chan::StreamKey::FromJson(in.at("key")));
  std::string kind = in.at("live");
  if (kind == "stream") return env_.hub->OpenReader(key, LiveOptions(task));
  if (kind == "shm") return env_.shm->OpenReader(key, LiveOptions(task));
#ifdef COPSE_HAVE_NCCL
  if (kind == "nccl" && task.nccl) return chan::nccl::MakeNcclReader(*task.nccl, in.at("peer_rank"), task.device);
#endif
  return Status::FailedPrecondition("this daemon cannot run " + kind + " channels (built without GPU support)");
}

Result<std::unique_ptr<chan::ChannelWriter>> AttemptExecutor::OpenLiveWriter(const Json& out, AttemptTask& task) const {
  std::string kind = out.at("live");
  std::vector<std::unique_ptr<chan::ChannelWriter>> writers;
  for (const auto& ch : out.at("channels")) {
    COPSE_ASSIGN_OR_RETURN(auto key, chan::StreamKey::FromJson(ch.at("key")));
    Result<std::unique_ptr<chan::ChannelWriter>> w =
        kind == "stream" ? env_.hub->OpenWriter(ch.at("peer"), key, LiveOptions(task))
        : kind == "shm"  ? env_.shm->OpenWriter(key, LiveOptions(task))
                         : Result<std::unique_ptr<chan::ChannelWriter>>(Status::FailedPrecondition(
                               "this daemon cannot run " + kind + " channels (built without GPU support)"));
#ifdef COPSE_HAVE_NCCL
    if (kind == "nccl" && task.nccl) w = chan::nccl::MakeNcclWriter(*task.nccl, ch.at("peer_rank"), task.device);
#endif
    if (!w.ok()) return w.status();
    writers.push_back(std::move(*w));
  }
  if (writers.size() == 1) return std::move(writers.front());
  return std::unique_ptr<chan::ChannelWriter>(std::make_unique<TeeWriter>(std::move(writers)));
}

Json AttemptExecutor::Execute(AttemptTask& task) const {
  const Json& spec = task.spec;
  auto started = std::chrono::steady_clock::now();
  Json report = {{"job", spec["job"]}, {"vertex", spec["vertex"]}, {"version", spec["version"]}, {"ok", false}};
  // `code`: why input `lost_input` could not be read; Unavailable (its daemon unreachable)
  // tells the job manager the output itself may be intact (held for a daemon's return).
  auto fail = [&](const std::string& cls, const std::string& error, int lost_input = -1, StatusCode code = StatusCode::kOk) {
    report["class"] = cls;
    report["error"] = error;
    if (lost_input >= 0) {
      report["lost_input"] = lost_input;
      // Which version of it: one the job manager has since re-run is not lost again.
      const Json& in = spec["inputs"][lost_input];
      if (const Json* key = in.is_object() && in.contains("key") ? &in["key"] : nullptr;
          key && key->is_object() && key->contains("version") && (*key)["version"].is_number_unsigned()) {
        report["lost_input_version"] = (*key)["version"];
      }
    }
    if (lost_input >= 0 && code == StatusCode::kUnavailable) report["lost_input_unreachable"] = true;
    report["duration_ms"] = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - started).count();
    return report;
  };
  try {
    const std::string name = spec["name"].get<std::string>();
    if (spec.contains("inject_failure")) return fail("program_error", spec["inject_failure"].get<std::string>());
    if (const int64_t delay = std::clamp<int64_t>(spec.value("delay_ms", int64_t{0}), 0, 86'400'000); delay > 0) {
      auto until = started + std::chrono::milliseconds(delay);
      while (std::chrono::steady_clock::now() < until && !task.cancel->load()) {
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      }
    }
    auto program = env_.programs->Create(spec["program"].get<std::string>());
    if (!program.ok()) return fail("program_error", program.status().message());

    uint64_t job = spec["job"].get<uint64_t>();
    uint32_t vertex = spec["vertex"].get<uint32_t>();
    uint32_t version = spec["version"].get<uint32_t>();
    int lost_port = -1;
    const int gpus = spec.value("gpus", 0);
    const GpuPool::Lease gpu = env_.gpus->Acquire(gpus, *task.cancel);
    if (task.cancel->load()) return fail("cancelled", "cancelled");
    if (gpus > 0 && gpu.device() < 0) {
      // Not charged: the attempt holding it is at fault, if anyone is.
      return fail("input_lost", "no GPU of this daemon's " + std::to_string(env_.gpus->size()) + " came free within " +
                                    std::to_string(GpuPool::kDefaultWait.count()) + " s");
    }
    if (spec.contains("nccl")) {
      Status st = env_.join_nccl ? env_.join_nccl(spec["nccl"], gpu.device(), task)
                                 : Status::FailedPrecondition("this daemon cannot join NCCL groups");
      // Charged like the program's own error: no GPU, no NCCL or a failed init will fail the
      // same way again, and a gang restarted for free would do so without end. A peer lost
      // meanwhile usually restarts the gang first (this report is then stale); when NCCL
      // notices first, the member is charged one attempt for it.
      if (task.cancel->load()) return fail("cancelled", "cancelled");
      if (!st.ok()) return fail("program_error", "joining the gang's NCCL group: " + st.message());
    }
    std::vector<std::unique_ptr<chan::ChannelReader>> readers;
    for (size_t port = 0; port < spec["inputs"].size(); ++port) {
      const Json& in = spec["inputs"][port];
      if (in.contains("live")) {
        auto reader = OpenLiveReader(in, task);
        if (!reader.ok())
          return fail("input_lost", "input " + std::to_string(port) + ": " + reader.status().message(), static_cast<int>(port));
        readers.push_back(std::make_unique<TrackingReader>(std::move(*reader), static_cast<int>(port), &lost_port));
        continue;
      }
      if (in.value("empty", false)) {
        readers.push_back(std::make_unique<EmptyReader>());
        continue;
      }
      auto key = chan::OutputKey::FromJson(in["key"]);
      if (!key.ok()) return fail("program_error", key.status().message());
      if (auto prefetched = task.prefetched ? task.prefetched->Take(port) : nullptr) {
        readers.push_back(std::move(prefetched));
        continue;
      }
      // A durable input comes from its producer's store like a memory one, and from its copy
      // when the job manager sends no store (its daemon is gone, or it was released) or the
      // store cannot deliver it.
      const std::string copy = in.value("durable", std::string());
      const bool copy_only = !copy.empty() && !in.contains("local");
      auto reader = copy_only ? chan::OutputStore::OpenDurableCopy(copy, *key)
                    : in["local"].get<bool>()
                        ? env_.store->OpenReader(*key)
                        : chan::OpenRemoteReader(in["host"].get<std::string>(), in["port"].get<uint16_t>(), *key, env_.secret);
      if (!copy.empty() && !copy_only) {
        reader = reader.ok() ? chan::OutputStore::WithDurableFallback(std::move(*reader), copy, *key)
                             : chan::OutputStore::OpenDurableCopy(copy, *key);
      }
      if (!reader.ok()) {
        return fail("input_lost", "input " + std::to_string(port) + " (" + key->ToString() + "): " + reader.status().message(),
                    static_cast<int>(port), reader.status().code());
      }
      readers.push_back(std::make_unique<TrackingReader>(std::move(*reader), static_cast<int>(port), &lost_port));
    }
    std::vector<std::unique_ptr<CountingWriter>> writers;
    for (size_t port = 0; port < spec["outputs"].size(); ++port) {
      const Json& out = spec["outputs"][port];
      if (out.is_object() && out.contains("live")) {
        auto writer = OpenLiveWriter(out, task);
        if (!writer.ok()) return fail("input_lost", "output " + std::to_string(port) + ": " + writer.status().message());
        writers.push_back(std::make_unique<CountingWriter>(std::move(*writer)));
        continue;
      }
      // "file", "memory", or {"durable": path}: a memory output with a copy at path.
      const bool durable = out.is_object() && out.contains("durable");
      auto kind = durable || out == "memory" ? chan::StorageKind::kMemory : chan::StorageKind::kFile;
      auto writer =
          env_.store->CreateWriter({job, vertex, version, static_cast<uint32_t>(port)}, kind,
                                   durable ? std::filesystem::path(out["durable"].get<std::string>()) : std::filesystem::path());
      if (!writer.ok()) return fail("program_error", writer.status().message());
      writers.push_back(std::make_unique<CountingWriter>(std::move(*writer)));
    }
    // Created on demand (VertexContext::MakeScratchDir): most vertices never touch disk.
    auto scratch =
        env_.work_dir / "scratch" / (std::to_string(job) + "-" + std::to_string(vertex) + "-" + std::to_string(version));
    Json params = spec["params"];
    VertexContext ctx;
    ctx.name = name;
    ctx.replica = spec.value("replica", 0);
    ctx.version = version;
    ctx.params = &params;
    for (auto& r : readers) ctx.inputs.push_back(r.get());
    for (auto& w : writers) ctx.outputs.push_back(w.get());
    ctx.cancel_flag = task.cancel.get();
    ctx.attempt_log = task.log.get();
    ctx.scratch_dir = scratch;
    ctx.job_dir = spec.value("job_dir", std::string());
    ctx.threads = spec.value("threads", 1u);
    // Its own limit when its stage declares one, else its cpus' share of what this daemon
    // offers: the vertices it can run at once then fit together.
    const int64_t declared_mb = spec.value("memory_mb", int64_t{0});
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
    if (task.cancel->load()) return fail("cancelled", "cancelled");
    if (!st.ok()) {
      if (lost_port >= 0)
        return fail("input_lost", "input " + std::to_string(lost_port) + ": " + st.message(), lost_port, st.code());
      fail("program_error", st.message());
      if (IsDeterministicError(st.code())) report["deterministic"] = true;
      return report;
    }
    Json bytes = Json::array(), messages = Json::array();
    for (auto& w : writers) {
      bytes.push_back(w->bytes());
      messages.push_back(w->messages());
    }
    report["ok"] = true;
    if (ctx.progress.is_object()) report["progress"] = std::move(ctx.progress);
    report["output_bytes"] = std::move(bytes);
    report["output_messages"] = std::move(messages);
    report["duration_ms"] = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - started).count();
    return report;
  } catch (const std::exception& e) {
    return fail("program_error", std::string("malformed task: ") + e.what());
  }
}

}  // namespace copse::vertex
