#include "jobmanager/gang_placement.h"

#include <algorithm>
#include <chrono>
#include <set>
#include <tuple>

#include <fmt/format.h>

#include "jobmanager/disjoint_sets.h"

namespace copse::jm {
namespace {

/// Members that must share a daemon, placed together.
struct Unit {
  std::vector<size_t> members;
  Resources need{0, 0, 0};
  std::optional<DaemonId> pinned;     // where one of its affinity groups is placed already
  std::string pinned_group;           // that group
  std::vector<std::string> unpinned;  // its groups not placed yet: this placement pins them
  PlacementRequest request;           // its members' stored inputs together
};

std::string Names(const GangRequest& r, const std::vector<size_t>& members) {
  std::string names;
  for (size_t i = 0; i < members.size() && i < 3; ++i) names += (i ? ", " : "") + r.members[members[i]].name;
  if (members.size() > 3) names += ", …";
  return names;
}

class Search {
 public:
  Search(const GangRequest& r, const std::vector<GangDaemon>& daemons, const GangNeeds& needs, const PlacementPolicy& policy,
         size_t max_steps)
      : r_(r), daemons_(daemons), needs_(needs), policy_(policy), budget_(max_steps), pins_(r.pins) {
    for (size_t i = 0; i < daemons.size(); ++i) {
      index_[daemons[i].id] = i;
      free_cpus_.push_back(daemons[i].free_cpus);
      free_gpus_.push_back(daemons[i].free_gpus);
      free_memory_.push_back(daemons[i].free_memory_mb);
    }
  }

  GangPlacement Run() {
    GangPlacement out;
    out.why_not = FormUnits();
    if (!out.why_not.empty()) return out;
    chosen_.assign(units_.size(), 0);
    CountMarks();
    budget_ += units_.size() * (daemons_.size() + 1);  // one pass without backtracking always completes
    if (!Place(0)) {
      out.gave_up = steps_ > budget_;
      out.why_not =
          out.gave_up ? fmt::format("no placement of its members on the live daemons' free slots was found in {} steps", budget_)
                      : "its members do not fit the live daemons' free slots together";
      return out;
    }
    out.daemons.resize(r_.members.size());
    for (size_t u = 0; u < units_.size(); ++u) {
      for (size_t m : units_[u].members) out.daemons[m] = daemons_[chosen_[u]].id;
    }
    return out;
  }

 private:
  /// Groups members into units, pinned ones first, then the largest; "" or why the gang cannot
  /// be placed as it is.
  std::string FormUnits() {
    const size_t n = r_.members.size();
    DisjointSets sets(n);
    std::map<std::string, size_t> first_of_group;
    for (size_t m = 0; m < n; ++m) {
      const std::string& group = r_.members[m].affinity;
      if (group.empty()) continue;
      auto [it, added] = first_of_group.try_emplace(group, m);
      if (!added) sets.Union(m, it->second);
    }
    for (auto [a, b] : r_.share_daemon) sets.Union(a, b);
    std::map<size_t, size_t> unit_of_root;
    for (size_t m = 0; m < n; ++m) {
      auto [it, added] = unit_of_root.try_emplace(sets.Find(m), units_.size());
      if (added) units_.emplace_back();
      Unit& u = units_[it->second];
      const GangMember& member = r_.members[m];
      u.members.push_back(m);
      u.need += member.need;
      for (const auto& [d, bytes] : member.input_bytes) u.request.input_bytes[d] += bytes;
      if (member.affinity.empty()) continue;
      auto pin = r_.pins.find(member.affinity);
      if (pin == r_.pins.end()) {
        if (std::find(u.unpinned.begin(), u.unpinned.end(), member.affinity) == u.unpinned.end())
          u.unpinned.push_back(member.affinity);
      } else if (u.pinned && *u.pinned != pin->second) {
        return fmt::format(
            "{} must share a daemon (an shm channel or an affinity group joins them), but their affinity "
            "groups are placed on two daemons",
            Names(r_, u.members));
      } else {
        u.pinned = pin->second;
        u.pinned_group = member.affinity;
      }
    }
    for (Unit& u : units_) {
      u.request.waited = std::chrono::hours(1);  // a gang does not wait for locality
      if (u.pinned && !index_.count(*u.pinned)) {
        return fmt::format("{} run where affinity group {} was placed, and that daemon is not live", Names(r_, u.members),
                           u.pinned_group);
      }
    }
    Resources all{0, 0, 0};
    double free_cpus = 0;
    int free_gpus = 0;
    int64_t free_memory = 0;
    for (const Unit& u : units_) all += u.need;
    // Below zero where tasks are chained ahead of a slot (Scheduler::Dispatch): none to give.
    for (size_t i = 0; i < daemons_.size(); ++i) {
      free_cpus += std::max(0.0, free_cpus_[i]);
      free_gpus += std::max(0, free_gpus_[i]);
      free_memory = std::min(kUnaccountedMemoryMb, free_memory + std::max<int64_t>(0, free_memory_[i]));
    }
    if (!Within(all, free_cpus, free_gpus, free_memory)) {
      return fmt::format("its members need {} together, and the live daemons have {} free", DescribeResources(all),
                         DescribeResources({free_cpus, free_gpus, free_memory}, all));
    }
    // Needs of unpinned units seen to fit (units are often alike).
    std::set<std::tuple<double, int, int64_t, int64_t>> fit_somewhere;
    for (const Unit& u : units_) {
      const auto need = std::make_tuple(u.need.cpus, u.need.gpus, u.need.memory_mb, u.need.gpu_memory_mb);
      bool somewhere = !u.pinned && fit_somewhere.count(need);
      for (size_t i = 0; i < daemons_.size() && !somewhere; ++i) somewhere = FreeFits(u, i);
      if (!u.pinned && somewhere) fit_somewhere.insert(need);
      if (!somewhere) {
        return fmt::format("{} need {} on one daemon{}, and no live daemon has that free", Names(r_, u.members),
                           DescribeResources(u.need),
                           u.members.size() > 1 ? " (an shm channel or an affinity group joins them)" : "");
      }
    }
    // Fixed units first (they have no choice), then scarce GPUs, then cpus.
    std::stable_sort(units_.begin(), units_.end(), [](const Unit& a, const Unit& b) {
      return std::make_tuple(!a.pinned, -a.need.gpus, -a.need.cpus) < std::make_tuple(!b.pinned, -b.need.gpus, -b.need.cpus);
    });
    return "";
  }

  bool FreeFits(const Unit& u, size_t i) const {
    if (u.pinned && daemons_[i].id != *u.pinned) return false;
    return Within(u.need, free_cpus_[i], free_gpus_[i], free_memory_[i], daemons_[i].gpu_memory_mb);
  }

  /// Whether pinning the unit's unplaced groups to daemon i leaves room for the gangs they join.
  bool PinsFit(const Unit& u, size_t i) {
    if (u.unpinned.empty()) return true;
    const GangDaemon& d = daemons_[i];
    for (const auto& g : u.unpinned) pins_[g] = d.id;
    bool fits = true;
    for (const auto& g : u.unpinned)
      fits = fits && needs_.PinFits(g, {d.id, d.cpus, d.gpus, d.memory_mb, d.gpu_memory_mb}, pins_);
    for (const auto& g : u.unpinned) pins_.erase(g);
    return fits;
  }

  /// Daemons unit `u` may go to now, the policy's choice first, then the most free cpus.
  std::vector<size_t> Candidates(const Unit& u) {
    std::vector<size_t> out;
    std::vector<PlacementDaemon> view;  // every daemon: inputs on a full one still score its host and rack
    steps_ += daemons_.size();
    for (size_t i = 0; i < daemons_.size(); ++i) {
      bool fits = FreeFits(u, i) && PinsFit(u, i);
      if (fits) out.push_back(i);
      view.push_back({daemons_[i].id, daemons_[i].host, daemons_[i].rack, free_cpus_[i], fits});
    }
    if (out.size() < 2) return out;
    std::stable_sort(out.begin(), out.end(), [&](size_t a, size_t b) { return free_cpus_[a] > free_cpus_[b]; });
    if (auto best = policy_.Choose(u.request, view)) {
      auto it = std::find_if(out.begin(), out.end(), [&](size_t i) { return daemons_[i].id == *best; });
      if (it != out.end()) std::rotate(out.begin(), it, it + 1);
    }
    return out;
  }

  /// Counts, per daemon, the pins there that the rest of the search can see: of this gang's
  /// groups (a unit forced there), and of groups sharing a gang with one of them (they weigh
  /// in GangNeeds::PinFits). A daemon with none is interchangeable with any other of the same
  /// capacities, for what the rest of the search can do.
  void CountMarks() {
    std::set<std::string> seen;
    for (const Unit& u : units_) {
      if (u.pinned) seen.insert(u.pinned_group);
      for (const auto& g : u.unpinned) {
        seen.insert(g);
        for (auto& other : needs_.GroupsSharingAGangWith(g)) seen.insert(std::move(other));
      }
    }
    marks_.assign(daemons_.size(), 0);
    for (const auto& [group, daemon] : pins_) {
      auto it = index_.find(daemon);
      if (it != index_.end() && seen.count(group)) ++marks_[it->second];
    }
  }

  bool Place(size_t k) {
    if (k == units_.size()) return true;
    const Unit& u = units_[k];
    std::set<std::tuple<double, int, int64_t, double, int, int64_t, int64_t>> failed_alike;
    for (size_t i : Candidates(u)) {
      const GangDaemon& d = daemons_[i];
      auto alike = std::make_tuple(free_cpus_[i], free_gpus_[i], free_memory_[i], d.cpus, d.gpus, d.memory_mb, d.gpu_memory_mb);
      const bool unmarked = marks_[i] == 0;
      if (unmarked && failed_alike.count(alike)) continue;
      if (++steps_ > budget_) return false;
      chosen_[k] = i;
      const double cpus_before = free_cpus_[i];  // restored as it was: sums of fractions drift
      free_cpus_[i] -= u.need.cpus;
      free_gpus_[i] -= u.need.gpus;
      free_memory_[i] -= u.need.memory_mb;
      for (const auto& g : u.unpinned) pins_[g] = d.id;
      marks_[i] += u.unpinned.size();
      bool placed = Place(k + 1);
      marks_[i] -= u.unpinned.size();
      for (const auto& g : u.unpinned) pins_.erase(g);
      free_cpus_[i] = cpus_before;
      free_gpus_[i] += u.need.gpus;
      free_memory_[i] += u.need.memory_mb;
      if (placed) return true;
      if (steps_ > budget_) return false;
      if (unmarked) failed_alike.insert(alike);
    }
    return false;
  }

  const GangRequest& r_;
  const std::vector<GangDaemon>& daemons_;
  const GangNeeds& needs_;
  const PlacementPolicy& policy_;
  size_t budget_;  // steps: daemons looked at, and units tried on one
  std::map<DaemonId, size_t> index_;
  std::vector<double> free_cpus_;
  std::vector<int> free_gpus_;
  std::vector<int64_t> free_memory_;
  std::map<std::string, DaemonId> pins_;  // the request's, and those the search has made so far
  std::vector<Unit> units_;
  std::vector<size_t> chosen_;  // per unit, an index into daemons_
  std::vector<size_t> marks_;   // per daemon (CountMarks)
  size_t steps_ = 0;
};

}  // namespace

GangPlacement PlaceGang(const GangRequest& request, const std::vector<GangDaemon>& daemons, const GangNeeds& needs,
                        const PlacementPolicy& policy, size_t max_steps) {
  return Search(request, daemons, needs, policy, max_steps).Run();
}

}  // namespace copse::jm
