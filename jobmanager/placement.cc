#include "jobmanager/placement.h"

#include <tuple>
#include <unordered_map>

namespace copse::jm {
namespace {

/// Input bytes per host and per rack label, summed once per call: scoring each daemon against
/// every other one cost O(daemons²) a placement, milliseconds on a thousand daemons.
struct LabelBytes {
  LabelBytes(const PlacementRequest& r, const std::vector<PlacementDaemon>& all) {
    if (r.input_bytes.empty()) return;
    for (const auto& d : all) {
      auto it = r.input_bytes.find(d.id);
      if (it == r.input_bytes.end()) continue;
      if (!d.host.empty()) host[d.host] += it->second;
      if (!d.rack.empty()) rack[d.rack] += it->second;
    }
  }
  std::unordered_map<std::string_view, uint64_t> host, rack;
};

/// Locality of a daemon for a request: (bytes on it, bytes on its host, bytes on its rack).
std::tuple<uint64_t, uint64_t, uint64_t> Score(const PlacementRequest& r, const PlacementDaemon& d, const LabelBytes& labels) {
  constexpr uint64_t kNamedHost = uint64_t{1} << 40;  // a named input host outweighs measured bytes
  uint64_t local = 0, host = 0, rack = 0;
  if (auto it = r.input_bytes.find(d.id); it != r.input_bytes.end()) local = it->second;
  if (auto it = labels.host.find(d.host); !d.host.empty() && it != labels.host.end()) host = it->second;
  if (auto it = labels.rack.find(d.rack); !d.rack.empty() && it != labels.rack.end()) rack = it->second;
  // A daemon on a host the job file names reads those inputs from its own disks: local.
  for (const auto& h : r.input_hosts) {
    if (!h.empty() && h == d.host) local += kNamedHost;
  }
  return {local, host, rack};
}

}  // namespace

std::optional<DaemonId> LocalityPolicy::Choose(const PlacementRequest& request,
                                               const std::vector<PlacementDaemon>& daemons) const {
  const PlacementDaemon* best_fit = nullptr;
  const PlacementDaemon* best_any = nullptr;
  std::tuple<uint64_t, uint64_t, uint64_t> fit_score{}, any_score{};
  const LabelBytes labels(request, daemons);
  for (const auto& d : daemons) {
    auto s = Score(request, d, labels);
    if (!best_any || s > any_score) {
      best_any = &d;
      any_score = s;
    }
    if (!d.fits) continue;
    if (!best_fit || s > fit_score || (s == fit_score && d.free_cpus > best_fit->free_cpus)) {
      best_fit = &d;
      fit_score = s;
    }
  }
  if (!best_fit) return std::nullopt;
  // The most local daemon is busy: give it a bounded chance to free a slot.
  bool has_locality = any_score != std::tuple<uint64_t, uint64_t, uint64_t>{};
  if (has_locality && any_score > fit_score && request.waited < locality_wait_) return std::nullopt;
  return best_fit->id;
}

std::optional<DaemonId> LoadPolicy::Choose(const PlacementRequest& request, const std::vector<PlacementDaemon>& daemons) const {
  const PlacementDaemon* best = nullptr;
  for (const auto& d : daemons) {
    if (d.fits && (!best || d.free_cpus > best->free_cpus)) best = &d;
  }
  if (!best) return std::nullopt;
  return best->id;
}

std::unique_ptr<PlacementPolicy> MakePlacementPolicy(const std::string& name, Duration locality_wait) {
  if (name == "locality") return std::make_unique<LocalityPolicy>(locality_wait);
  if (name == "load") return std::make_unique<LoadPolicy>();
  return nullptr;
}

}  // namespace copse::jm
