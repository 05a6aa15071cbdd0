#pragma once
// What a model costs where it runs, layer by layer: the table `copse plan` chooses a parallel
// layout from (ml/planner.h), measured by ml/layer_profile.h on each daemon of a profiling job
// (ml/profile_graph.h) and travelling as JSON in that job's outputs (ToJson, CostTableFromJson).
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "common/json_util.h"
#include "common/status.h"

namespace copse::ml {

/// One layer's passes on a micro-batch of one size.
struct LayerTimes {
  double forward = 0;         // Forward with a stash
  double backward = 0;        // Backward: dL/dx and the weight gradients (what ml.grad runs)
  double backward_input = 0;  // BackwardInput: dL/dx only (a pipeline stage's backward vertex)
  double weight_grad = 0;     // WeightGradients of that micro-batch (0 for layers without parameters)
  // The same passes without dL/dx: the model's first layer with parameters computes none (nor
  // do the layers before it run a backward at all), as Sequential's backward skips them.
  double backward_first = 0, backward_input_first = 0;
};

struct LayerCost {
  std::string name;                      // Layer::Describe()
  int64_t parameters = 0;                // parameter elements (float32)
  int64_t out_bytes_per_sample = 0;      // its output: what crosses to the next stage after it
  int64_t stash_bytes_per_sample = 0;    // what its forward keeps for its backward
  bool defers_weight_gradients = false;  // Layer::DefersWeightGradients
  std::map<int64_t, LayerTimes> at;      // by micro-batch size
};

/// Hand-offs between vertices, as the profiling job's hop chain measured them.
struct LinkCost {
  double gap = 50e-6;        // one vertex to the next one it enables on the same daemon
  double hop = 200e-6;       // the same across daemons, for a small message
  double bytes_per_s = 1e9;  // what a larger message adds per byte across daemons
  bool measured = false;     // false: the defaults above, or (one daemon) hop and rate never crossed daemons
};

struct CostTable {
  std::string model;
  int threads = 1;
  std::vector<LayerCost> layers;
  // Seconds per parameter element of one optimizer step as ml.update takes it (out of place, one
  // gradient), and what each further gradient summed into it adds (a parameter server's inputs).
  double optimizer_per_parameter = 0;
  double gradient_sum_per_parameter = 0;
  std::string optimizer = "sgd";
  LinkCost link;
  // What a training vertex costs beyond its layers' passes (reading its inputs, leasing its
  // model, writing its messages, loading a batch), from short calibration runs of real training
  // vertices (Calibrate, ml/planner.h): per pipeline forward or backward, pipeline update,
  // data-parallel gradient vertex and parameter-server update. 0 until calibrated.
  double vertex_overhead = 0, update_overhead = 0, gradient_overhead = 0, server_overhead = 0;
  double tensor_parallel_overhead = 0;  // per tensor-parallel member's step: its all-reduces and the rest
  // Pipeline forwards and backwards: their layers' passes times this, plus vertex_overhead
  // (fitted on two micro-batch sizes).
  double vertex_scale = 1;
  bool calibrated = false;
  std::string measured_on;  // the daemon, or "" when unknown
  // Profiled on a local cluster (copse plan without --costs): the cores its daemons share, which
  // a plan from this table for that cluster counts (PlanRequest::cores). 0: daemons of their own.
  int local_cores = 0;
  // Tensor-parallel shards (gpt models): member 0 of R's layers, by R, measured as `layers` are
  // with the all-reduces left out (what they cost is calibrated, with the rest of a member's
  // step). Same layer count as `layers`.
  std::map<int, std::vector<LayerCost>> shards;

  /// Sizes every layer was measured at, ascending.
  std::vector<int64_t> MicrobatchSizes() const;
  int64_t Parameters(int begin, int end) const;
};

/// The most layers a cost table may have (a 1,000-block gpt has about 2,000).
inline constexpr size_t kMaxLayers = 4096;

Json ToJson(const CostTable& table);
/// InvalidArgument naming the field (`/layers/2/at/64/forward`) when `json` is not a cost table:
/// times from 0 to an hour (a link's gap and hop to 1 s), counts to 2^40, a link rate from 1e3
/// to 1e13 bytes/s, at most kMaxLayers layers.
Result<CostTable> CostTableFromJson(const Json& json);

/// Element-wise medians of tables of the same model measured on several daemons (each layer's
/// times, the optimizer's), so that one slow daemon does not decide the plan alone.
Result<CostTable> MedianTable(const std::vector<CostTable>& tables);

/// The median of `values` (the mean of the middle two for an even count); 0 when empty.
double Median(std::vector<double> values);

}  // namespace copse::ml
