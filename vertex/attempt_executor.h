#pragma once
// AttemptExecutor: runs one attempt of a vertex on a daemon — opens its inputs (local store,
// another daemon, a durable copy, what was prefetched while it was held, live channels) and
// its outputs, takes a GPU and joins its gang's NCCL group when it needs them, runs the
// program with its VertexContext, and builds the report the job manager reads: outcome,
// failure class (program_error, input_lost with which input and version, cancelled), output
// sizes, progress figures. The daemon hands it tasks from its worker threads; it keeps no
// state of its own between attempts, so several run at once. Never throws.
#include <atomic>
#include <chrono>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>

#include "common/tls.h"
#include "channels/channel.h"
#include "channels/output_store.h"
#include "channels/shm_registry.h"
#include "channels/stream_hub.h"
#ifdef COPSE_HAVE_NCCL
#include "channels/nccl/nccl_group.h"
#endif
#include "common/json_util.h"
#include "common/status.h"
#include "protocol/daemon.pb.h"
#include "vertex/attempt_log.h"
#include "vertex/gpu_pool.h"
#include "vertex/input_prefetcher.h"
#include "vertex/program.h"
#include "vertex/program_registry.h"

namespace copse::vertex {

/// One attempt: the task the job manager sent, and what the daemon prepared for it.
struct AttemptTask {
  protocol::Task spec;
  std::shared_ptr<std::atomic<bool>> cancel = std::make_shared<std::atomic<bool>>(false);
#ifdef COPSE_HAVE_NCCL
  std::unique_ptr<chan::nccl::NcclGroup> nccl;  // this attempt's group, when it has nccl channels
#endif
  std::unique_ptr<Collective> collective;
  int device = -1;
  std::shared_ptr<PrefetchedInputs> prefetched;  // remote inputs fetched while it was held
  std::shared_ptr<AttemptLog> log;               // what it prints, once it runs
};

/// What an executor runs attempts with: the daemon's stores, channels and settings.
struct ExecutorEnv {
  const ProgramRegistry* programs = nullptr;
  chan::OutputStore* store = nullptr;
  chan::StreamHub* hub = nullptr;
  chan::ShmRegistry* shm = nullptr;
  GpuPool* gpus = nullptr;
  std::filesystem::path work_dir;  // scratch directories go under work_dir/scratch
  int cpus = 1;
  int64_t memory_mb = 1;                    // what the daemon offers: vertices without a limit of their own share it by cpus
  std::string secret;                       // for fetches from other daemons
  std::shared_ptr<const tls::Context> tls;  // and their TLS, when the cluster runs it
  std::chrono::milliseconds live_peer_timeout{300};
  /// Joins the attempt's gang's NCCL group (`nccl`: the task's member), setting its nccl,
  /// collective and device; the daemon relays the group's id through the job manager.
  std::function<Status(const protocol::NcclMember& nccl, int device, AttemptTask& task)> join_nccl;
};

class AttemptExecutor {
 public:
  explicit AttemptExecutor(ExecutorEnv env) : env_(std::move(env)) {}
  /// Runs one attempt and returns its report. Never throws.
  protocol::AttemptReport Execute(AttemptTask& task) const;

 private:
  chan::StreamOptions LiveOptions(const AttemptTask& task) const;
  /// The reading end of a stream or shm channel of this vertex's gang.
  Result<std::unique_ptr<chan::ChannelReader>> OpenLiveReader(const protocol::LiveInput& in, AttemptTask& task) const;
  /// The writing end of a live output port: one channel, or a tee over several.
  Result<std::unique_ptr<chan::ChannelWriter>> OpenLiveWriter(const protocol::LiveOutput& out, AttemptTask& task) const;

  ExecutorEnv env_;
};

}  // namespace copse::vertex
