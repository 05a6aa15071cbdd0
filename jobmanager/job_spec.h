#pragma once
// JobSpec: a job file as the user wrote it, parsed and type-checked but not yet expanded into
// vertices (see job_graph.h for that). Every element remembers its JSON pointer so later
// checks can name the place. Plain data; thread-compatible.
#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/json_util.h"

namespace copse::jm {

/// How data moves along an edge. `kOrder` carries no data: it only sequences two vertices.
/// `kDurable` is a memory channel whose producer also writes a copy under the job's durable
/// directory (shared storage): the copy outlives the producer's daemon, so recovery reads it
/// instead of re-running the producer, and lineage stops there (a checkpoint).
/// `kMirrored` is a memory channel whose output the job manager has copied into another
/// daemon's memory once it completed (scheduler_mirrors.cc): should the producer's daemon be
/// lost while that copy lives, the copy serves, and nothing re-runs (an in-memory checkpoint
/// that survives one daemon).
enum class ChannelKind : uint8_t { kFile, kMemory, kStream, kShm, kNccl, kOrder, kDurable, kMirrored };
inline constexpr size_t kChannelKinds = 8;
/// How the replicas of two stages are joined by an edge.
enum class EdgePattern : uint8_t { kPointwise, kAllToAll, kBroadcast, kGather };

std::string_view ChannelKindName(ChannelKind kind);
std::optional<ChannelKind> ParseChannelKind(std::string_view name);
std::string_view EdgePatternName(EdgePattern pattern);
std::optional<EdgePattern> ParseEdgePattern(std::string_view name);
/// Live channels need producer and consumer running at once, so their ends form a gang.
inline bool IsLive(ChannelKind k) { return k == ChannelKind::kStream || k == ChannelKind::kShm || k == ChannelKind::kNccl; }
/// Channels that carry data (every kind but `order`).
inline bool CarriesData(ChannelKind k) { return k != ChannelKind::kOrder; }

/// Why `name` cannot name a daemon ("" when it can): 1 to 128 letters, digits and . _ - : @ + =
/// (a host name, host:slot, user@host), so that it reads plainly in tables, logs and `copse
/// chaos kill NAME`.
std::string DaemonNameProblem(const std::string& name);

struct Resources {
  double cpus = 1;
  int gpus = 0;
  int64_t memory_mb = 0;
  /// The device memory each of the vertex's GPUs must have (0: any). A GPU is leased whole, so
  /// this is a bound on where the vertex may go, not an amount it takes from a daemon.
  int64_t gpu_memory_mb = 0;

  /// What several vertices need at once: the sum (start from `Resources{0, 0, 0}`), and GPUs
  /// of the largest memory any of them asks.
  Resources& operator+=(const Resources& other) {
    cpus += other.cpus;
    gpus += other.gpus;
    memory_mb += other.memory_mb;
    gpu_memory_mb = std::max(gpu_memory_mb, other.gpu_memory_mb);
    return *this;
  }
};

struct StageSpec {
  std::string pointer;  // "/stages/3"
  std::string name;
  std::string program;
  int replicas = 1;
  Json params = Json::object();
  Resources resources;
  int max_attempts = 4;
  /// Losses of the daemon running an attempt, with no injected fault to explain them, before
  /// the job fails: a vertex that crashes its daemon (in-process, or by killing its parent)
  /// must not take the cluster down one daemon at a time. Dask's `allowed-failures`.
  int max_daemon_losses = 3;
  double timeout_s = 0;  // 0: no timeout
  std::string affinity;  // "" when none
  /// Keep this stage's outputs until the job ends instead of releasing them once consumed, so
  /// recovery can re-run consumers from them without walking further upstream: every port
  /// (`"retain": true`) or the listed ones (`"retain": [1]`, e.g. only what crosses to another
  /// daemon, since a lost daemon's own outputs are gone anyway).
  bool retain_all = false;
  std::vector<int> retain_ports;
  bool Retains(size_t port) const {
    return retain_all || std::find(retain_ports.begin(), retain_ports.end(), static_cast<int>(port)) != retain_ports.end();
  }
  bool RetainsAny() const { return retain_all || !retain_ports.empty(); }
  /// Hosts holding each replica's input: one entry (may contain {replica}) or one per replica.
  std::vector<std::string> input_hosts;
};

/// "stage" (every replica) or "stage[i]" (one vertex).
struct EndpointRef {
  std::string stage;
  std::optional<int> replica;
  std::string ToString() const;
};

/// Parses "name" or "name[3]"; nullopt when malformed.
std::optional<EndpointRef> ParseEndpointRef(std::string_view text);

struct EdgeSpec {
  std::string pointer;
  EndpointRef from;
  EndpointRef to;
  std::optional<EdgePattern> pattern;  // nullopt: pointwise when replica counts are equal
  ChannelKind channel = ChannelKind::kFile;
  std::optional<int> from_port;
  std::optional<int> to_port;
};

struct OutputSpec {
  std::string pointer;
  EndpointRef from;
  int port = 0;
  std::string path;
};

enum class FaultKind : uint8_t {
  kKillDaemonOf,     // SIGKILL the daemon that runs (or ran) a vertex
  kKillDaemon,       // SIGKILL a daemon by name
  kFail,             // make given attempts of a vertex fail
  kDelay,            // make a vertex slow
  kCorruptOutputOf,  // damage a vertex's stored output
  kDropOutputOf,     // delete a vertex's stored output
};
std::string_view FaultKindName(FaultKind kind);

struct FaultTrigger {
  std::optional<int64_t> completed;  // after N vertex completions in the job
  std::optional<int64_t> after_ms;   // since the job started
};

struct FaultSpec {
  std::string pointer;
  FaultKind kind = FaultKind::kFail;
  std::optional<EndpointRef> vertex;  // every kind but kKillDaemon
  std::string daemon;                 // kKillDaemon
  std::vector<int> attempts;          // kFail: 1-based attempt numbers
  int64_t ms = 0;                     // kDelay
  FaultTrigger when;
};

struct JobDefaults {
  ChannelKind channel = ChannelKind::kFile;
  int max_attempts = 4;
  int max_daemon_losses = 3;
  double timeout_s = 0;
};

struct JobSpec {
  int version = 1;
  std::string name;
  /// Where `durable` channels keep their copies, relative to the job file's directory; every
  /// daemon must be able to read and write it (a shared filesystem on a multi-host cluster).
  std::string durable_dir = "durable";
  JobDefaults defaults;
  std::vector<StageSpec> stages;
  std::vector<EdgeSpec> edges;
  std::vector<OutputSpec> outputs;
  std::vector<FaultSpec> faults;
  Json source;  // the document as submitted, for journaling and resubmission

  /// Index of the stage called `name`, or -1.
  int FindStage(std::string_view name) const;
};

}  // namespace copse::jm
