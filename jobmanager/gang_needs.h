#pragma once
// What a job's gangs need of the daemons their affinity groups are pinned to.
//
// A gang runs whole or not at all, and an affinity group runs on the daemon its first vertex
// was placed on. So every group that has members in one gang and is pinned to one daemon must
// fit that daemon's capacity at once, or the gang can never be placed while the daemon lives.
// Placement asks `PinFits` before pinning a group, so that a group placed early (a worker's
// first gradient vertex) does not land where the gang it joins later (that worker's GPU
// all-reduce) cannot follow; `WhyUnplaceable` names the gangs that cannot be placed however
// long they wait on a fixed cluster, so that `copse run` refuses such a job up front.
// Members without an affinity group are free to go anywhere and are not counted here. A
// group's largest single vertex must fit the daemon too, gang or not.
#include <map>
#include <string>
#include <vector>

#include "common/ids.h"
#include "jobmanager/job_graph.h"

namespace copse::jm {

/// The memory a daemon that declares none is taken to have: it is not accounted there.
inline constexpr int64_t kUnaccountedMemoryMb = int64_t{1} << 50;

/// Whether `need` fits within `cpus`, `gpus` and `memory_mb`, on GPUs of `gpu_memory_mb` each
/// (cpus are fractional: a sum of 0.1s must not miss by a rounding; kUnaccountedMemoryMb or
/// more is no bound at all, for either memory).
inline bool Within(const Resources& need, double cpus, int gpus, int64_t memory_mb = kUnaccountedMemoryMb,
                   int64_t gpu_memory_mb = kUnaccountedMemoryMb) {
  return need.cpus <= cpus + 1e-9 && need.gpus <= gpus && (need.memory_mb <= memory_mb || memory_mb >= kUnaccountedMemoryMb) &&
         (need.gpus == 0 || need.gpu_memory_mb <= gpu_memory_mb || gpu_memory_mb >= kUnaccountedMemoryMb);
}

/// A live daemon's whole capacity (not what is free now).
struct DaemonCapacity {
  DaemonId id;
  double cpus = 0;
  int gpus = 0;
  int64_t memory_mb = kUnaccountedMemoryMb;
  int64_t gpu_memory_mb = kUnaccountedMemoryMb;  // of each of its GPUs
};

/// `amount` in the terms `asked` uses: its cpus always, its gpus and its memory where `asked`
/// asks for some ("2 cpus and 1 gpus and 512 MB of memory"). Describing what a daemon offers
/// in the terms of what a vertex asks shows the lack ("2 cpus and 0 gpus") and nothing else.
std::string DescribeResources(const Resources& amount, const Resources& asked);
inline std::string DescribeResources(const Resources& need) { return DescribeResources(need, need); }

class GangNeeds {
 public:
  explicit GangNeeds(const JobGraph& g);

  /// Whether pinning `group` to `daemon`, beside the groups already in `pins`, leaves every
  /// gang with members in `group` within the daemon's capacity, and every vertex of the group
  /// too (a vertex bigger than the daemon its group is pinned to could never run).
  bool PinFits(const std::string& group, const DaemonCapacity& daemon, const std::map<std::string, DaemonId>& pins) const;

  /// What all of `gang`'s members need at once, affinity group or not.
  Resources Whole(GangId gang) const;

  /// The affinity groups whose pins `PinFits(group, …)` looks at: those with members in a gang
  /// that `group` has members in (`group` itself among them, when it is in a gang).
  std::vector<std::string> GroupsSharingAGangWith(const std::string& group) const;

  /// Why `gang` could never be placed on a cluster of just these daemons ("" when it may be):
  /// one of its affinity groups, or of its sets of members joined by shared-memory channels
  /// (with their groups), needs more at once than any of them has. For a cluster no
  /// daemon will join (`copse run`'s); the job manager's may grow, so there a group that fits
  /// no live daemon waits.
  std::string WhyUnplaceable(GangId gang, const std::vector<DaemonCapacity>& daemons) const;

 private:
  const JobGraph& g_;  // outlives this: the job holds both
  /// Per gang: per affinity group, what its members in the gang need together.
  std::vector<std::map<std::string, Resources>> needs_;
  /// Per affinity group: the most cpus and the most gpus one of its vertices needs.
  std::map<std::string, Resources> largest_vertex_;
  /// Per affinity group: the gangs it has members in.
  std::map<std::string, std::vector<GangId>> gangs_of_;
};

}  // namespace copse::jm
