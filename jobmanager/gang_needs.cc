#include "jobmanager/gang_needs.h"

#include <algorithm>

#include <fmt/format.h>

namespace copse::jm {
namespace {

std::string Describe(double cpus, int gpus) { return fmt::format("{:g} cpus and {} gpus", cpus, gpus); }

std::string GangName(const JobGraph& g, GangId gang) {
  const auto& members = g.gangs()[gang.value()].members;
  std::string names;
  for (size_t i = 0; i < members.size() && i < 3; ++i) names += (i ? ", " : "") + g.vertex(members[i]).name;
  if (members.size() > 3) names += ", …";
  return fmt::format("gang of {} ({})", members.size(), names);
}

}  // namespace

GangNeeds::GangNeeds(const JobGraph& g) : g_(g), needs_(g.gangs().size()) {
  for (const StageSpec& stage : g.spec().stages) {
    if (stage.affinity.empty()) continue;
    auto [it, added] = largest_vertex_.try_emplace(stage.affinity, stage.resources);
    it->second.cpus = std::max(it->second.cpus, stage.resources.cpus);
    it->second.gpus = std::max(it->second.gpus, stage.resources.gpus);
  }
  for (const Gang& gang : g.gangs()) {
    auto& by_group = needs_[gang.id.value()];
    for (VertexId m : gang.members) {
      const StageSpec& stage = g.stage_of(m);
      if (stage.affinity.empty()) continue;
      auto [it, added] = by_group.try_emplace(stage.affinity, Resources{0, 0, 0});
      it->second.cpus += stage.resources.cpus;
      it->second.gpus += stage.resources.gpus;
      if (added) gangs_of_[stage.affinity].push_back(gang.id);
    }
  }
}

bool GangNeeds::PinFits(const std::string& group, const DaemonCapacity& daemon,
                        const std::map<std::string, DaemonId>& pins) const {
  if (auto largest = largest_vertex_.find(group); largest != largest_vertex_.end() &&
                                                  !Within(largest->second, daemon.cpus, daemon.gpus)) {
    return false;
  }
  auto gangs = gangs_of_.find(group);
  if (gangs == gangs_of_.end()) return true;
  for (GangId gang : gangs->second) {
    Resources together{0, 0, 0};
    for (const auto& [other, need] : needs_[gang.value()]) {
      auto pin = pins.find(other);
      if (other != group && (pin == pins.end() || pin->second != daemon.id)) continue;
      together.cpus += need.cpus;
      together.gpus += need.gpus;
    }
    if (!Within(together, daemon.cpus, daemon.gpus)) return false;
  }
  return true;
}

Resources GangNeeds::Whole(GangId gang) const {
  Resources whole{0, 0, 0};
  for (VertexId m : g_.gangs()[gang.value()].members) {
    whole.cpus += g_.stage_of(m).resources.cpus;
    whole.gpus += g_.stage_of(m).resources.gpus;
  }
  return whole;
}

std::vector<std::string> GangNeeds::GroupsSharingAGangWith(const std::string& group) const {
  std::vector<std::string> out;
  auto gangs = gangs_of_.find(group);
  if (gangs == gangs_of_.end()) return out;
  for (GangId gang : gangs->second) {
    for (const auto& [other, need] : needs_[gang.value()]) out.push_back(other);
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

std::string GangNeeds::WhyUnplaceable(GangId gang, const std::vector<DaemonCapacity>& daemons) const {
  double most_cpus = 0;
  int most_gpus = 0;
  for (const auto& d : daemons) {
    most_cpus = std::max(most_cpus, d.cpus);
    most_gpus = std::max(most_gpus, d.gpus);
  }
  for (const auto& [group, need] : needs_[gang.value()]) {
    bool somewhere = false;
    for (const auto& d : daemons) somewhere = somewhere || Within(need, d.cpus, d.gpus);
    if (!somewhere) {
      return fmt::format("{} cannot be placed: its members in affinity group {} need {} on one daemon at once, "
                         "and the largest daemon has {}",
                         GangName(g_, gang), group, Describe(need.cpus, need.gpus), Describe(most_cpus, most_gpus));
    }
  }
  return "";
}

}  // namespace copse::jm
