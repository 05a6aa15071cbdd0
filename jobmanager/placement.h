#pragma once
// Placement policies: which daemon a ready vertex runs on. The scheduler filters daemons by
// hard constraints (alive, free cpus and gpus, affinity pins) and hands the policy what it
// knows about where the vertex's inputs are; the policy scores the fitting daemons or asks to
// wait. Policies are pure functions of their arguments (plus the clock-free `waited` input),
// so they are tested directly and swapped by name (`copse jm --placement`).
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/clock.h"
#include "common/ids.h"

namespace copse::jm {

/// A live daemon as placement sees it.
struct PlacementDaemon {
  DaemonId id;
  std::string_view host;  // its "host" label ("" when none); valid during the call
  std::string_view rack;  // its "rack" label
  double free_cpus = 0;
  bool fits = false;  // passes the hard constraints for this vertex now
};

struct PlacementRequest {
  std::map<DaemonId, uint64_t> input_bytes;  // bytes of the vertex's inputs stored on each daemon
  std::vector<std::string> input_hosts;      // hosts the job file says hold its inputs
  Duration waited{0};                        // how long the vertex has been ready
};

class PlacementPolicy {
 public:
  virtual ~PlacementPolicy() = default;
  virtual std::string name() const = 0;
  /// The daemon to use among those with `fits`, or nullopt to wait (for a better slot, or
  /// because none fits).
  virtual std::optional<DaemonId> Choose(const PlacementRequest& request, const std::vector<PlacementDaemon>& daemons) const = 0;
  /// Whether a vertex whose every input is on one daemon goes there when it fits: what
  /// chained dispatch of a vertex without affinity anticipates, before its inputs are complete.
  virtual bool FollowsInputs() const = 0;
};

/// Locality first: input bytes on the daemon, then on the same host label, then on the same
/// rack label (input_hosts count as inputs on those hosts), then the most free cpus, then the
/// lowest id. When the best daemon by locality has no free slot, waits up to `locality_wait`
/// for it before going elsewhere (delay scheduling, as Spark and Tez do).
class LocalityPolicy final : public PlacementPolicy {
 public:
  explicit LocalityPolicy(Duration locality_wait) : locality_wait_(locality_wait) {}
  std::string name() const override { return "locality"; }
  std::optional<DaemonId> Choose(const PlacementRequest& request, const std::vector<PlacementDaemon>& daemons) const override;
  bool FollowsInputs() const override { return true; }

 private:
  Duration locality_wait_;
};

/// Locality-blind: the fitting daemon with the most free cpus (lowest id on ties). The
/// baseline the locality benchmark compares against.
class LoadPolicy final : public PlacementPolicy {
 public:
  std::string name() const override { return "load"; }
  std::optional<DaemonId> Choose(const PlacementRequest& request, const std::vector<PlacementDaemon>& daemons) const override;
  bool FollowsInputs() const override { return false; }
};

/// "locality" or "load"; nullptr for an unknown name.
std::unique_ptr<PlacementPolicy> MakePlacementPolicy(const std::string& name, Duration locality_wait);

}  // namespace copse::jm
