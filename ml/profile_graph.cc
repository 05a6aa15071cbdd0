#include "ml/profile_graph.h"

#include <fmt/format.h>

namespace copse::ml {

Result<Json> GenerateProfileGraph(const ProfileGraphOptions& o) {
  if (o.daemons < 1 || o.daemons > 64) return Status::InvalidArgument("--daemons: expected 1..64");
  if (o.daemon_cpus < 1) return Status::InvalidArgument("--cpus: expected at least 1");
  if (o.threads < 1 || o.threads > o.daemon_cpus)
    return Status::InvalidArgument(fmt::format("--threads: expected 1..{} (a daemon's cpus)", o.daemon_cpus));
  if (o.repeats < 1 || o.repeats > 1000) return Status::InvalidArgument("--repeats: expected 1..1000");
  if (o.hops < 2 || o.hops % 2 || o.hops > 1000) return Status::InvalidArgument("--hops: expected an even number, 2..1000");
  if (o.microbatch_sizes.empty()) return Status::InvalidArgument("no micro-batch size to profile");
  if (o.small_bytes < 0 || o.large_bytes <= o.small_bytes || o.large_bytes > (int64_t{256} << 20))
    return Status::InvalidArgument("hop payloads: expected 0 <= small < large <= 256 MiB");
  Json stages = Json::array(), edges = Json::array();
  auto group = [](int d) { return "plan" + std::to_string(d); };
  const Json profile_params = {{"model", o.model},     {"sizes", o.microbatch_sizes}, {"optimizer", o.optimizer},
                               {"repeats", o.repeats}, {"threads", o.threads},        {"tensor_parallel", o.tensor_parallel}};
  for (int d = 0; d < o.daemons; ++d) {
    stages.push_back({{"name", "profile" + std::to_string(d)},
                      {"program", "ml.profile"},
                      {"params", profile_params},
                      {"resources", {{"cpus", o.daemon_cpus}}},
                      {"affinity", group(d)}});
    edges.push_back({{"from", "profile" + std::to_string(d)}, {"to", "costs"}, {"to_port", d}});
  }
  // The chains run after every profile (which pinned the groups to distinct daemons) and one
  // after another, so that no measurement shares the machine with another.
  std::string previous_end;
  const struct {
    const char* name;
    bool across;
    int64_t bytes;
  } chains[] = {{"gap", false, o.small_bytes}, {"hop", true, o.small_bytes}, {"bulk", true, o.large_bytes}};
  int port = o.daemons;
  for (const auto& chain : chains) {
    for (int k = 0; k <= o.hops; ++k) {
      const std::string name = chain.name + std::to_string(k);
      const int d = chain.across && o.daemons > 1 ? k % 2 : 0;
      stages.push_back({{"name", name},
                        {"program", "ml.profile_hop"},
                        {"params", {{"payload_bytes", chain.bytes}}},
                        {"resources", {{"cpus", 1}}},
                        {"affinity", group(d)}});
      if (k > 0) {
        edges.push_back({{"from", chain.name + std::to_string(k - 1)}, {"to", name}});
      } else if (!previous_end.empty()) {
        edges.push_back({{"from", previous_end}, {"to", name}, {"channel", "order"}});
      } else {
        for (int p = 0; p < o.daemons; ++p) {
          edges.push_back({{"from", "profile" + std::to_string(p)}, {"to", name}, {"channel", "order"}});
        }
      }
    }
    previous_end = chain.name + std::to_string(o.hops);
    edges.push_back({{"from", previous_end}, {"to", "costs"}, {"to_port", port++}});
  }
  stages.push_back({{"name", "costs"},
                    {"program", "ml.profile_collect"},
                    {"params", {{"profiles", o.daemons}, {"small_bytes", o.small_bytes}, {"large_bytes", o.large_bytes}}},
                    {"resources", {{"cpus", 1}}}});
  return Json{{"version", 1},
              {"name", "profile-" + o.model},
              {"description", fmt::format("copse plan: {}'s layers measured on {} daemon(s), and the hand-offs between them",
                                          o.model, o.daemons)},
              {"defaults", {{"channel", "memory"}, {"max_attempts", 2}}},
              {"stages", std::move(stages)},
              {"edges", std::move(edges)},
              {"outputs", Json::array({{{"from", "costs"}, {"port", 0}, {"path", "costs.json"}}})}};
}

}  // namespace copse::ml
