#pragma once
// Measures what a model's layers cost on this machine: the CostTable (ml/cost_table.h) `copse
// plan` chooses a parallel layout from. The `ml.profile` vertex program runs it on the daemon it
// runs on; `ml.profile_hop` vertices measure what a hand-off between daemons costs
// (ml/programs/profile.cc).
//
//   ProfileOptions o;  o.model = "mlp";  o.microbatch_sizes = {16, 32, 64, 128};
//   Result<CostTable> t = ProfileModel(o);
//
// Times are medians of `repeats` runs after one warm-up, in seconds, on the calling thread with
// the process's CPU thread count (SetCpuThreads). Each layer is timed alone, then the times at
// each size are scaled so that they add up to the whole model's forward and backward passes
// timed as a vertex runs them (a layer timed alone finds its weights in the cache; in a real
// pass the layers before it evicted them). A gpt model's samples are windows of its context.
#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"
#include "ml/cost_table.h"

namespace copse::ml {

struct ProfileOptions {
  std::string model = "mlp";
  std::vector<int64_t> microbatch_sizes = {128};
  std::string optimizer = "sgd";
  int repeats = 5;
  uint64_t seed = 1;
  // gpt models: also measure member 0 of each of these tensor-parallel group sizes (CostTable::
  // shards). Each must divide the model's heads.
  std::vector<int> tensor_parallel;
};

/// Measures every layer of `model` at every micro-batch size, and one optimizer step.
Result<CostTable> ProfileModel(const ProfileOptions& options);

}  // namespace copse::ml
