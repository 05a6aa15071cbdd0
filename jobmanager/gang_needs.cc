#include "jobmanager/gang_needs.h"

#include <algorithm>

#include <fmt/format.h>

#include "jobmanager/disjoint_sets.h"

namespace copse::jm {
namespace {

std::string GangName(const JobGraph& g, GangId gang) {
  const auto& members = g.gangs()[gang.value()].members;
  std::string names;
  for (size_t i = 0; i < members.size() && i < 3; ++i) names += (i ? ", " : "") + g.vertex(members[i]).name;
  if (members.size() > 3) names += ", …";
  return fmt::format("gang of {} ({})", members.size(), names);
}

}  // namespace

std::string DescribeResources(const Resources& amount, const Resources& asked) {
  std::string text = fmt::format("{:g} cpus", amount.cpus);
  if (asked.gpus > 0) text += fmt::format(" and {} gpus", amount.gpus);
  if (asked.gpus > 0 && asked.gpu_memory_mb > 0) {
    text += amount.gpu_memory_mb >= kUnaccountedMemoryMb ? " of memory not accounted"
                                                         : fmt::format(" of {} MB each", amount.gpu_memory_mb);
  }
  if (asked.memory_mb > 0) {
    text += amount.memory_mb >= kUnaccountedMemoryMb ? " and memory not accounted"
                                                     : fmt::format(" and {} MB of memory", amount.memory_mb);
  }
  return text;
}

GangNeeds::GangNeeds(const JobGraph& g) : g_(g), needs_(g.gangs().size()) {
  for (const StageSpec& stage : g.spec().stages) {
    if (stage.affinity.empty()) continue;
    auto [it, added] = largest_vertex_.try_emplace(stage.affinity, stage.resources);
    it->second.cpus = std::max(it->second.cpus, stage.resources.cpus);
    it->second.gpus = std::max(it->second.gpus, stage.resources.gpus);
    it->second.memory_mb = std::max(it->second.memory_mb, stage.resources.memory_mb);
    it->second.gpu_memory_mb = std::max(it->second.gpu_memory_mb, stage.resources.gpu_memory_mb);
  }
  for (const Gang& gang : g.gangs()) {
    auto& by_group = needs_[gang.id.value()];
    for (VertexId m : gang.members) {
      const StageSpec& stage = g.stage_of(m);
      if (stage.affinity.empty()) continue;
      auto [it, added] = by_group.try_emplace(stage.affinity, Resources{0, 0, 0});
      it->second += stage.resources;
      if (added) gangs_of_[stage.affinity].push_back(gang.id);
    }
  }
}

bool GangNeeds::PinFits(const std::string& group, const DaemonCapacity& daemon,
                        const std::map<std::string, DaemonId>& pins) const {
  if (auto largest = largest_vertex_.find(group);
      largest != largest_vertex_.end() &&
      !Within(largest->second, daemon.cpus, daemon.gpus, daemon.memory_mb, daemon.gpu_memory_mb)) {
    return false;
  }
  auto gangs = gangs_of_.find(group);
  if (gangs == gangs_of_.end()) return true;
  for (GangId gang : gangs->second) {
    Resources together{0, 0, 0};
    for (const auto& [other, need] : needs_[gang.value()]) {
      auto pin = pins.find(other);
      if (other != group && (pin == pins.end() || pin->second != daemon.id)) continue;
      together += need;
    }
    if (!Within(together, daemon.cpus, daemon.gpus, daemon.memory_mb, daemon.gpu_memory_mb)) return false;
  }
  return true;
}

Resources GangNeeds::Whole(GangId gang) const {
  Resources whole{0, 0, 0};
  for (VertexId m : g_.gangs()[gang.value()].members) whole += g_.stage_of(m).resources;
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
  int64_t most_memory = 0, most_gpu_memory = 0;
  for (const auto& d : daemons) {
    most_cpus = std::max(most_cpus, d.cpus);
    most_gpus = std::max(most_gpus, d.gpus);
    most_memory = std::max(most_memory, d.memory_mb);
    most_gpu_memory = std::max(most_gpu_memory, d.gpu_memory_mb);
  }
  const Resources largest{most_cpus, most_gpus, most_memory, most_gpu_memory};
  auto fits_somewhere = [&](const Resources& need) {
    return std::any_of(daemons.begin(), daemons.end(),
                       [&](const DaemonCapacity& d) { return Within(need, d.cpus, d.gpus, d.memory_mb, d.gpu_memory_mb); });
  };
  for (const auto& [group, need] : needs_[gang.value()]) {
    if (!fits_somewhere(need)) {
      return fmt::format(
          "{} cannot be placed: its members in affinity group {} need {} on one daemon at once, "
          "and the largest daemon has {}",
          GangName(g_, gang), group, DescribeResources(need), DescribeResources(largest, need));
    }
  }
  // Members joined by a shared-memory channel share a daemon too, and with them the rest of
  // each one's affinity group: the sets that must share one are the components of both ties.
  const auto& members = g_.gangs()[gang.value()].members;
  std::map<VertexId, size_t> index;
  for (size_t i = 0; i < members.size(); ++i) index[members[i]] = i;
  DisjointSets sets(members.size());
  std::vector<char> shm(members.size(), 0);
  std::map<std::string, size_t> first_of_group;
  for (size_t i = 0; i < members.size(); ++i) {
    const std::string& group = g_.stage_of(members[i]).affinity;
    if (!group.empty()) {
      auto [it, added] = first_of_group.try_emplace(group, i);
      if (!added) sets.Union(i, it->second);
    }
    for (ChannelId ch : g_.vertex(members[i]).inputs) {
      const ChannelEdge& c = g_.channel(ch);
      auto from = index.find(c.from);
      if (c.kind != ChannelKind::kShm || from == index.end()) continue;
      sets.Union(i, from->second);
      shm[i] = shm[from->second] = 1;
    }
  }
  std::map<size_t, std::vector<size_t>> components;
  for (size_t i = 0; i < members.size(); ++i) components[sets.Find(i)].push_back(i);
  for (const auto& [root, component] : components) {
    if (std::none_of(component.begin(), component.end(), [&](size_t i) { return shm[i]; })) continue;  // checked above
    Resources need{0, 0, 0};
    std::string names;
    for (size_t k = 0; k < component.size(); ++k) {
      need += g_.stage_of(members[component[k]]).resources;
      if (k < 3) names += (k ? ", " : "") + g_.vertex(members[component[k]]).name;
    }
    if (component.size() > 3) names += ", …";
    if (!fits_somewhere(need)) {
      return fmt::format(
          "{} cannot be placed: its members joined by shared-memory channels ({}) need {} on one daemon "
          "at once, and the largest daemon has {}",
          GangName(g_, gang), names, DescribeResources(need), DescribeResources(largest, need));
    }
  }
  return "";
}

}  // namespace copse::jm
