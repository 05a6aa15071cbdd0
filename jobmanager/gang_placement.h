#pragma once
// Where a gang's members run: all of them at once, or none.
//
// Members joined by an shm channel, or in one affinity group, must share a daemon, so they are
// placed as one unit whose need is their sum; a unit whose group is pinned already goes where
// the pin says. Units are tried pinned ones first, then largest first, scarce GPUs before cpus
// (first-fit decreasing, as Ray's bundle scheduling orders a placement group), and with
// backtracking: a greedy pass member by member misses placements that exist (units needing 1
// and 2 GPUs on daemons with 2 and 1 free: the 1 lands on the 2 and the 2 then fits nowhere),
// and a gang so missed waited for ever. For each unit the placement policy's choice among the
// daemons it fits is tried first, then the others by most free cpus. A gang needing more than
// the live daemons have free in all is settled before any search; daemons that look alike to
// the search (same free and whole capacity, no pin there that the rest of the search can see)
// are tried once per step; and the search gives up after `max_steps` steps (a daemon looked
// at, or a unit tried on one) beyond what one pass without backtracking takes, so a gang that
// cannot fit costs a bounded part of the job manager's thread.
//
// A pure function of its arguments: the scheduler calls it with what is free now to place a
// gang, and with what each daemon has in all to say whether waiting can ever help.
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/ids.h"
#include "jobmanager/gang_needs.h"
#include "jobmanager/job_spec.h"
#include "jobmanager/placement.h"

namespace copse::jm {

/// A live daemon as gang placement sees it.
struct GangDaemon {
  DaemonId id;
  std::string_view host;  // its labels, for the policy; valid during the call
  std::string_view rack;
  double free_cpus = 0;  // what the search may use
  int free_gpus = 0;
  double cpus = 0;  // what it has in all (affinity pins must fit that: GangNeeds::PinFits)
  int gpus = 0;
  int64_t free_memory_mb = kUnaccountedMemoryMb;
  int64_t memory_mb = kUnaccountedMemoryMb;
  int64_t gpu_memory_mb = kUnaccountedMemoryMb;  // of each of its GPUs
};

/// A member of the gang being placed.
struct GangMember {
  std::string name;  // for the reasons given when it cannot be placed
  Resources need;
  std::string affinity;                      // its stage's affinity group ("": none)
  std::map<DaemonId, uint64_t> input_bytes;  // where its stored inputs are, for the policy
};

struct GangRequest {
  std::vector<GangMember> members;
  std::vector<std::pair<size_t, size_t>> share_daemon;  // indices of members joined by shm channels
  std::map<std::string, DaemonId> pins;                 // the job's affinity groups placed already
};

/// Per member (in the request's order), its daemon; or, when none was found, why.
struct GangPlacement {
  std::vector<DaemonId> daemons;  // empty when not placed
  std::string why_not;
  bool gave_up = false;  // the search ran out of steps: a placement may exist
  bool placed() const { return !daemons.empty(); }
};

/// Steps per gang and scheduling pass for backtracking, beyond one pass without it (a gang of
/// 8 units on 1,024 daemons takes about 8,200 steps to place at once).
constexpr size_t kGangSearchSteps = size_t{1} << 16;

GangPlacement PlaceGang(const GangRequest& request, const std::vector<GangDaemon>& daemons, const GangNeeds& needs,
                        const PlacementPolicy& policy, size_t max_steps = kGangSearchSteps);

}  // namespace copse::jm
