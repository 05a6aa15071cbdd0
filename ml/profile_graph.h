#pragma once
// The profiling job `copse plan` runs on the daemons a training job will run on (docs/ml-graphs.md,
// "Planning"): one ml.profile vertex per daemon, each taking a whole daemon so that the
// measurement runs alone and the daemons are distinct; then, one after another, three chains of
// ml.profile_hop vertices — on one daemon (the gap between a vertex and the next it enables),
// alternating between two daemons with a small message (a hop across daemons) and with a large
// one (the link's bandwidth) —, and ml.profile_collect, whose output `costs.json` is the cost
// table (ml/layer_profile.h) the planner reads. Stateless.
#include <cstdint>
#include <string>
#include <vector>

#include "common/json_util.h"
#include "common/status.h"

namespace copse::ml {

struct ProfileGraphOptions {
  std::string model = "mlp";
  std::vector<int64_t> microbatch_sizes = {128};
  std::string optimizer = "sgd";
  std::vector<int> tensor_parallel;  // gpt models: tensor-parallel group sizes to measure shards of
  int daemons = 2;                   // profiled in parallel, one vertex each
  int daemon_cpus = 2;               // what one daemon offers: each ml.profile vertex takes all of it
  int threads = 1;                   // CPU threads of the training job's compute vertices
  int repeats = 5;
  int hops = 16;  // hand-offs per chain (even: a clock offset between two daemons cancels)
  // Hop payloads: about a micro-batch's activations, and a larger message for the link's rate.
  int64_t small_bytes = 256 << 10, large_bytes = 4 << 20;
};

/// The job file. InvalidArgument names the option that is out of range.
Result<Json> GenerateProfileGraph(const ProfileGraphOptions& options);

}  // namespace copse::ml
