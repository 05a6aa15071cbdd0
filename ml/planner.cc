#include "ml/planner.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <optional>
#include <set>

#include <fmt/format.h>

#include "ml/graph_gen.h"

namespace copse::ml {
namespace {

constexpr double kNever = std::numeric_limits<double>::infinity();

std::string Mib(int64_t bytes) { return fmt::format("{:.1f} MiB", static_cast<double>(bytes) / (1 << 20)); }

/// Bytes computed in double (tables allow counts to 2^40, batches to 2^20), saturated.
int64_t Bytes(double bytes) { return bytes >= 9e18 ? int64_t{9'000'000'000'000'000'000} : static_cast<int64_t>(bytes); }

/// Layers [begin, end) at one micro-batch size.
struct StageCost {
  double forward = 0, backward = 0;  // one micro-batch
  double update = 0;                 // once a step: batched weight gradients and the optimizer
  double boundary_bytes = 0;         // what crosses to the next stage per micro-batch
  int64_t parameters = 0;
  double stash_bytes_per_sample = 0;   // what a micro-batch's forward keeps for the update
  double output_bytes_per_sample = 0;  // the layers' outputs: dL/dy of each, kept beside the stash
};

/// Costs of layouts on a table. Sizes a layout reads must have been measured (Measured).
class CostModel {
 public:
  CostModel(const CostTable& table, const PlanRequest& request) : t_(table), r_(request) {}

  const LayerTimes* At(size_t layer, int64_t size) const {
    auto it = t_.layers[layer].at.find(size);
    return it == t_.layers[layer].at.end() ? nullptr : &it->second;
  }
  bool Measured(int64_t size) const {
    for (size_t i = 0; i < t_.layers.size(); ++i) {
      if (!At(i, size)) return false;
    }
    return true;
  }
  int StateTensors() const { return t_.optimizer == "adam" || t_.optimizer == "adamw" ? 2 : 1; }
  double Transfer(double bytes) const { return t_.link.hop + bytes / t_.link.bytes_per_s; }
  double Gap() const { return t_.link.gap; }
  // Value, gradient, the update's new copy and the optimizer state, float32 each.
  double ParameterBytes(int64_t parameters) const { return 4.0 * static_cast<double>(parameters) * (3 + StateTensors()); }

  /// The model's first layer with parameters (layers.size() when none has any).
  int FirstTrainable() const {
    int i = 0;
    while (i < static_cast<int>(t_.layers.size()) && t_.layers[static_cast<size_t>(i)].parameters == 0) ++i;
    return i;
  }

  /// Layer `i`'s backward at `mb` in a stage (or worker) whose layers start at `begin`: dL/dx
  /// only (`input_only`) or with its weight gradients. The first stage computes no dL/dx for
  /// the model's first layer with parameters and runs no backward before it, as Sequential's
  /// backward does; later stages compute dL/dx through all their layers, for the stage before.
  double Backward(int i, int64_t mb, bool input_only, int begin) const {
    const LayerTimes& x = *At(static_cast<size_t>(i), mb);
    if (begin == 0) {
      const int first = FirstTrainable();
      if (i < first) return 0;
      if (i == first) return input_only ? x.backward_input_first : x.backward_first;
    }
    return input_only ? x.backward_input : x.backward;
  }

  /// A pipeline stage of layers [begin, end) at micro-batch size `mb`, `microbatches` a step.
  StageCost Stage(int begin, int end, int64_t mb, int microbatches) const {
    StageCost c;
    bool defers = true;
    for (int i = begin; i < end; ++i) defers = defers && t_.layers[static_cast<size_t>(i)].defers_weight_gradients;
    double weight_grads = 0;
    for (int i = begin; i < end; ++i) {
      const size_t l = static_cast<size_t>(i);
      const LayerTimes& x = *At(l, mb);
      c.forward += x.forward;
      c.backward += Backward(i, mb, defers, begin);
      // The update's one product over every micro-batch's rows: as measured at the whole batch
      // when it was, else M products of one micro-batch.
      const LayerTimes* whole = At(l, mb * microbatches);
      if (defers) weight_grads += whole ? whole->weight_grad : microbatches * x.weight_grad;
      c.parameters += t_.layers[l].parameters;
      c.stash_bytes_per_sample += static_cast<double>(t_.layers[l].stash_bytes_per_sample);
      c.output_bytes_per_sample += static_cast<double>(t_.layers[l].out_bytes_per_sample);
    }
    c.update = weight_grads + t_.optimizer_per_parameter * static_cast<double>(c.parameters) + t_.update_overhead;
    c.forward = t_.vertex_scale * c.forward + t_.vertex_overhead;
    c.backward = t_.vertex_scale * c.backward + t_.vertex_overhead;
    c.boundary_bytes =
        static_cast<double>(t_.layers[static_cast<size_t>(end - 1)].out_bytes_per_sample) * static_cast<double>(mb);
    return c;
  }

  /// Alpa's per-stage quantity for every range [a, b): a micro-batch's forward and backward plus
  /// the boundary's two transfers (none after the last layer), as Stage(a, b, mb, 1) gives them;
  /// O(layers²), each range extending the one before.
  std::vector<std::vector<double>> StageTimes(int64_t mb) const {
    const int n = static_cast<int>(t_.layers.size());
    std::vector<std::vector<double>> time(static_cast<size_t>(n) + 1, std::vector<double>(static_cast<size_t>(n) + 1, kNever));
    for (int a = 0; a < n; ++a) {
      double forward = 0, input_only = 0, full = 0;
      bool defers = true;
      for (int b = a + 1; b <= n; ++b) {
        const int i = b - 1;
        forward += At(static_cast<size_t>(i), mb)->forward;
        input_only += Backward(i, mb, true, a);
        full += Backward(i, mb, false, a);
        defers = defers && t_.layers[static_cast<size_t>(i)].defers_weight_gradients;
        const double boundary =
            static_cast<double>(t_.layers[static_cast<size_t>(i)].out_bytes_per_sample) * static_cast<double>(mb);
        time[static_cast<size_t>(a)][static_cast<size_t>(b)] = t_.vertex_scale * (forward + (defers ? input_only : full)) +
                                                               2 * t_.vertex_overhead + (b == n ? 0.0 : 2 * Transfer(boundary));
      }
    }
    return time;
  }

  Result<Prediction> Pipeline(const Layout& l) const;
  Result<Prediction> DataParallel(const Layout& l) const;
  Result<Prediction> TensorParallel(const Layout& l) const;
  /// One member's step of a tensor-parallel group of `ranks` without calibration: its shard's
  /// forward and backward over the whole batch, and the optimizer over its shard.
  double MemberStep(int ranks) const;
  void CheckMemory(Prediction& p, const char* what) const;

 private:
  const CostTable& t_;
  const PlanRequest& r_;
};

void CostModel::CheckMemory(Prediction& p, const char* what) const {
  if (r_.memory_per_daemon <= 0) return;
  for (size_t s = 0; s < p.memory_bytes.size(); ++s) {
    const int64_t need = p.memory_bytes[s];
    if (need <= r_.memory_per_daemon) continue;
    p.fits = false;
    p.why_not = fmt::format("{} {} needs {}, {} more than the {} a daemon offers", what, s, Mib(need),
                            Mib(need - r_.memory_per_daemon), Mib(r_.memory_per_daemon));
    return;
  }
}

Result<Prediction> CostModel::Pipeline(const Layout& l) const {
  // P daemons of V model chunks each (V > 1: interleaved 1F1B): virtual stage k * P + d is chunk
  // k of daemon d, as the generator places them.
  const int P = l.degree, V = l.schedule == "interleaved" ? l.virtual_stages : 1, M = l.microbatches;
  const int S = P * V;
  const int64_t mb = r_.batch / M;
  std::vector<StageCost> stage;
  for (int s = 0; s < S; ++s) stage.push_back(Stage(l.split[static_cast<size_t>(s)], l.split[static_cast<size_t>(s) + 1], mb, M));
  // More daemons than cores to run them: their vertices share the cores, each as much slower.
  if (r_.cores > 0 && P > r_.cores) {
    const double share = static_cast<double>(P) / r_.cores;
    for (StageCost& c : stage) c.forward *= share, c.backward *= share, c.update *= share;
  }
  // Each daemon's vertices in order over kSteps steps: its schedule's forwards and backwards,
  // then its chunks' updates.
  constexpr int kSteps = 3;
  struct Op {
    char kind;  // F, B, U
    int step, stage, microbatch;
  };
  std::vector<std::vector<Op>> order(static_cast<size_t>(P));
  for (int d = 0; d < P; ++d) {
    for (int k = 0; k < kSteps; ++k) {
      if (V > 1) {
        for (const ChunkOp& op : InterleavedOrder(d, P, V, M))
          order[static_cast<size_t>(d)].push_back({op.kind, k, op.chunk * P + d, op.microbatch});
      } else {
        for (const auto& [kind, m] : ScheduleOrder(l.schedule, d, P, M)) order[static_cast<size_t>(d)].push_back({kind, k, d, m});
      }
      for (int c = 0; c < V; ++c) order[static_cast<size_t>(d)].push_back({'U', k, c * P + d, 0});
    }
  }
  auto index = [&](int k, int s, int m) { return (static_cast<size_t>(k) * S + s) * M + m; };
  std::vector<double> f_start(static_cast<size_t>(kSteps * S * M), -1), f_end(f_start.size(), -1), b_end(f_start.size(), -1);
  std::vector<double> u_end(static_cast<size_t>(kSteps * S), -1);
  std::vector<size_t> next(static_cast<size_t>(P), 0);
  std::vector<double> free_at(static_cast<size_t>(P), 0);
  std::vector<bool> started(static_cast<size_t>(P), false);
  for (bool progress = true; progress;) {
    progress = false;
    for (int d = 0; d < P; ++d) {
      const size_t dev = static_cast<size_t>(d);
      while (next[dev] < order[dev].size()) {
        const Op op = order[dev][next[dev]];
        const size_t s = static_cast<size_t>(op.stage);
        double ready = started[dev] ? free_at[dev] + Gap() : 0;
        double duration = 0;
        if (op.kind == 'F') {
          if (op.stage > 0) {
            const double dep = f_end[index(op.step, op.stage - 1, op.microbatch)];
            if (dep < 0) break;
            ready = std::max(ready, dep + Transfer(stage[s - 1].boundary_bytes));
          }
          duration = stage[s].forward;
        } else if (op.kind == 'B') {
          if (op.stage + 1 < S) {
            const double dep = b_end[index(op.step, op.stage + 1, op.microbatch)];
            if (dep < 0) break;
            ready = std::max(ready, dep + Transfer(stage[s].boundary_bytes));
          } else if (f_end[index(op.step, op.stage, op.microbatch)] < 0) {
            return Status::Internal("planner: schedule " + l.schedule + " runs a backward before its forward");
          }
          duration = stage[s].backward;
        } else {
          duration = stage[s].update;
        }
        const double end = ready + duration;
        if (op.kind == 'F')
          f_start[index(op.step, op.stage, op.microbatch)] = ready, f_end[index(op.step, op.stage, op.microbatch)] = end;
        if (op.kind == 'B') b_end[index(op.step, op.stage, op.microbatch)] = end;
        if (op.kind == 'U') u_end[static_cast<size_t>(op.step * S + op.stage)] = end;
        free_at[dev] = end;
        started[dev] = true;
        ++next[dev];
        progress = true;
      }
    }
  }
  for (int d = 0; d < P; ++d) {
    if (next[static_cast<size_t>(d)] != order[static_cast<size_t>(d)].size())
      return Status::Internal("planner: schedule " + l.schedule + " deadlocks in the replay");
  }
  auto step_end = [&](int k) {
    double e = 0;
    for (int s = 0; s < S; ++s) e = std::max(e, u_end[static_cast<size_t>(k * S + s)]);
    return e;
  };
  Prediction p;
  p.step_s = step_end(kSteps - 1) - step_end(kSteps - 2);
  // The last step's bubble, as MeasuredBubble takes it: per daemon, over its chunks.
  const int k = kSteps - 1;
  double first = kNever, last = 0;
  std::vector<double> busy(static_cast<size_t>(P), 0);
  std::vector<int64_t> parameters(static_cast<size_t>(P), 0);
  std::vector<double> kept(static_cast<size_t>(P), 0);  // bytes per sample a step keeps
  for (int s = 0; s < S; ++s) {
    const size_t d = static_cast<size_t>(s % P);
    for (int m = 0; m < M; ++m) {
      first = std::min(first, f_start[index(k, s, m)]);
      last = std::max(last, b_end[index(k, s, m)]);
      busy[d] += stage[static_cast<size_t>(s)].forward + stage[static_cast<size_t>(s)].backward;
    }
    parameters[d] += stage[static_cast<size_t>(s)].parameters;
    kept[d] += stage[static_cast<size_t>(s)].stash_bytes_per_sample + stage[static_cast<size_t>(s)].output_bytes_per_sample;
  }
  double idle = 0;
  for (int d = 0; d < P; ++d) {
    const size_t i = static_cast<size_t>(d);
    idle += last > first ? 1 - busy[i] / (last - first) : 0;
    // Every micro-batch's stash, and the dL/dy beside it, waits for the update (batched weight
    // gradients): the whole batch's.
    p.memory_bytes.push_back(Bytes(ParameterBytes(parameters[i]) + kept[i] * static_cast<double>(r_.batch)));
  }
  p.bubble = idle / P;
  CheckMemory(p, "stage");
  return p;
}

Result<Prediction> CostModel::DataParallel(const Layout& l) const {
  const int D = l.degree;
  const int64_t mb = r_.batch / D;
  double compute = 0, stash = 0;
  for (size_t i = 0; i < t_.layers.size(); ++i) {
    compute += At(i, mb)->forward + Backward(static_cast<int>(i), mb, /*input_only=*/false, /*begin=*/0);
    stash += static_cast<double>(t_.layers[i].stash_bytes_per_sample);
  }
  compute *= t_.vertex_scale;
  // More workers than cores to run them: they share the cores, each as much slower.
  if (r_.cores > 0 && D > r_.cores) compute *= static_cast<double>(D) / r_.cores;
  const int64_t parameters = t_.Parameters(0, static_cast<int>(t_.layers.size()));
  const double gradient_bytes = 4.0 * static_cast<double>(parameters);
  compute += t_.gradient_overhead;
  const double update = (t_.optimizer_per_parameter + (D - 1) * t_.gradient_sum_per_parameter) * static_cast<double>(parameters) +
                        t_.server_overhead;
  // Workers beside the update hand over in memory; the others' gradients cross to it one after
  // another, and the new parameters back to them in parallel.
  const int local = std::min(D, std::max(1, r_.slots_per_daemon));
  const int remote = D - local;
  const double gather = remote > 0 ? t_.link.hop + remote * gradient_bytes / t_.link.bytes_per_s : Gap();
  const double scatter = remote > 0 ? Transfer(gradient_bytes) : Gap();
  Prediction p;
  p.step_s = compute + gather + update + scatter;
  // Per daemon, beside its workers' stashes: the update's holds the parameters, optimizer state
  // and new copy (ParameterBytes) and the other workers' gradients; another holds a copy of
  // the parameters and its workers' gradients.
  for (int d = 0, placed = 0; placed < D; ++d) {
    const int here = std::min(D - placed, local);
    placed += here;
    const double state = d == 0 ? ParameterBytes(parameters) + (D - 1) * gradient_bytes : (1 + here) * gradient_bytes;
    p.memory_bytes.push_back(Bytes(state + here * stash * static_cast<double>(mb)));
  }
  CheckMemory(p, "daemon");
  return p;
}

double CostModel::MemberStep(int ranks) const {
  CostTable shard = t_;
  shard.layers = t_.shards.at(ranks);
  shard.shards.clear();
  const CostModel m(shard, r_);
  double step = 0;
  for (size_t i = 0; i < shard.layers.size(); ++i) {
    step += m.At(i, r_.batch)->forward + m.Backward(static_cast<int>(i), r_.batch, /*input_only=*/false, /*begin=*/0);
  }
  return step + t_.optimizer_per_parameter * static_cast<double>(shard.Parameters(0, static_cast<int>(shard.layers.size())));
}

Result<Prediction> CostModel::TensorParallel(const Layout& l) const {
  const int R = l.degree;
  auto it = t_.shards.find(R);
  if (it == t_.shards.end())
    return Status::InvalidArgument(l.Describe() + ": the cost table has no shards of " + std::to_string(R));
  for (const LayerCost& layer : it->second) {
    if (!layer.at.count(r_.batch))
      return Status::InvalidArgument(
          fmt::format("{}: the cost table has no shard times at the batch of {}", l.Describe(), r_.batch));
  }
  // The members share one daemon (their live channels are shm) and the step: each computes its
  // shard over the whole batch, all-reducing each block's partial sums with the others (what
  // that costs is in the calibrated overhead).
  // The overhead was calibrated on a group of 2, whose members each sum one other's partials:
  // a group of R sums R - 1.
  double step = t_.vertex_scale * MemberStep(R);
  if (r_.cores > 0 && R > r_.cores) step *= static_cast<double>(R) / r_.cores;
  Prediction p;
  p.step_s = step + (R - 1) * t_.tensor_parallel_overhead + Gap();
  double stash = 0;
  int64_t parameters = 0;
  for (const LayerCost& layer : it->second) {
    stash += static_cast<double>(layer.stash_bytes_per_sample);
    parameters += layer.parameters;
  }
  p.memory_bytes.push_back(Bytes(R * (ParameterBytes(parameters) + stash * static_cast<double>(r_.batch))));
  CheckMemory(p, "daemon");
  return p;
}

/// Every increasing split of `layers` into `stages` non-empty ranges, in lexicographic order.
template <typename Visit>
void ForEachSplit(int layers, int stages, Visit&& visit) {
  std::vector<int> split(static_cast<size_t>(stages) + 1);
  split.front() = 0;
  split.back() = layers;
  for (int s = 1; s < stages; ++s) split[static_cast<size_t>(s)] = s;
  while (true) {
    visit(split);
    int s = stages - 1;
    while (s >= 1 && split[static_cast<size_t>(s)] == layers - (stages - s)) --s;
    if (s < 1) return;
    ++split[static_cast<size_t>(s)];
    for (int t = s + 1; t < stages; ++t) split[static_cast<size_t>(t)] = split[static_cast<size_t>(t) - 1] + 1;
  }
}

int64_t Splits(int layers, int stages) {  // C(layers - 1, stages - 1), saturating
  int64_t c = 1;
  for (int i = 1; i < stages; ++i) {
    c = c * (layers - i) / i;
    if (c > (int64_t{1} << 40)) return c;
  }
  return c;
}

}  // namespace

VertexTimes StageVertexTimes(const CostTable& table, int begin, int end, int64_t mb, int microbatches) {
  CostTable bare = table;  // the layers' passes alone, whatever an earlier calibration added
  bare.vertex_overhead = bare.update_overhead = bare.gradient_overhead = bare.server_overhead = 0;
  bare.vertex_scale = 1;
  const PlanRequest request;
  const CostModel model(bare, request);
  const StageCost c = model.Stage(begin, end, mb, microbatches);
  VertexTimes v{c.forward, c.backward, c.update, c.forward};
  for (int i = begin; i < end; ++i) v.gradient += model.Backward(i, mb, /*input_only=*/false, begin);
  return v;
}

Result<double> TensorParallelMemberStep(const CostTable& table, int ranks, int64_t batch) {
  auto it = table.shards.find(ranks);
  if (it == table.shards.end()) return Status::InvalidArgument(fmt::format("the cost table has no shards of {}", ranks));
  for (const LayerCost& layer : it->second) {
    if (!layer.at.count(batch)) return Status::InvalidArgument(fmt::format("the cost table has no shard times at {}", batch));
  }
  PlanRequest request;
  request.batch = batch;
  return CostModel(table, request).MemberStep(ranks);
}

namespace {

/// measured = a x predicted + b over the samples of `kind` by least squares, when they were
/// taken at two micro-batch sizes or more (else nothing tells a from b), at least 4 of them,
/// and a lands in [0.5, 4] and b >= 0.
std::optional<std::pair<double, double>> FitLine(const std::vector<VertexSample>& samples, VertexSample::Kind kind) {
  double n = 0, sx = 0, sy = 0, sxx = 0, sxy = 0;
  std::set<int64_t> sizes;
  for (const VertexSample& s : samples) {
    if (s.kind != kind) continue;
    n += 1, sx += s.predicted, sy += s.measured, sxx += s.predicted * s.predicted, sxy += s.predicted * s.measured;
    sizes.insert(s.microbatch);
  }
  const double spread = n * sxx - sx * sx;
  if (n < 4 || sizes.size() < 2 || !(spread > 0)) return std::nullopt;
  const double a = (n * sxy - sx * sy) / spread;
  const double b = (sy - a * sx) / n;
  if (!std::isfinite(a) || a < 0.5 || a > 4 || !(b >= 0)) return std::nullopt;
  return std::make_pair(a, b);
}

}  // namespace

Status Calibrate(CostTable& table, const std::vector<VertexSample>& samples) {
  // Each kind's excess over the prediction, layer passes scaled by the pipeline fit.
  table.vertex_scale = 1;
  const auto fit = FitLine(samples, VertexSample::kStage);
  if (fit) table.vertex_scale = fit->first;
  std::vector<double> excess[5];
  for (const VertexSample& s : samples) {
    const bool passes = s.kind != VertexSample::kStageUpdate && s.kind != VertexSample::kServerUpdate;
    excess[s.kind].push_back(s.measured - (passes ? table.vertex_scale : 1.0) * s.predicted);
  }
  auto median = [](const std::vector<double>& v) { return std::max(0.0, Median(v)); };
  auto& stage = excess[VertexSample::kStage];
  auto& stage_update = excess[VertexSample::kStageUpdate];
  auto& gradient = excess[VertexSample::kGradient];
  auto& server = excess[VertexSample::kServerUpdate];
  auto& tensor_parallel = excess[VertexSample::kTensorParallel];
  if ((stage.empty() && gradient.empty()) || (stage_update.empty() && server.empty()))
    return Status::InvalidArgument("calibration: the run timed no compute vertex or no update");
  table.vertex_overhead = fit ? fit->second : median(stage.empty() ? gradient : stage);
  table.update_overhead = median(stage_update.empty() ? server : stage_update);
  table.gradient_overhead = gradient.empty() ? table.vertex_overhead : median(gradient);
  table.server_overhead = server.empty() ? table.update_overhead : median(server);
  table.tensor_parallel_overhead = tensor_parallel.empty() ? 0 : median(tensor_parallel);
  table.calibrated = true;
  return Status::OK();
}

std::string Layout::Describe() const {
  if (kind == "tensor-parallel") return fmt::format("tensor-parallel {}", degree);
  if (kind != "pipeline") return fmt::format("data-parallel {}", degree);
  const std::string chunks = schedule == "interleaved" ? fmt::format(" V={}", virtual_stages) : "";
  return fmt::format("pipeline {} {}{} M={} split {}", degree, schedule, chunks, microbatches, fmt::join(split, ","));
}

double SplitObjective(const CostTable& table, const std::vector<int>& split, int microbatches, int64_t microbatch_size) {
  const PlanRequest request;
  const auto time = CostModel(table, request).StageTimes(microbatch_size);
  double sum = 0, most = 0;
  for (size_t s = 0; s + 1 < split.size(); ++s) {
    const double t = time[static_cast<size_t>(split[s])][static_cast<size_t>(split[s + 1])];
    sum += t;
    most = std::max(most, t);
  }
  return sum + (microbatches - 1) * most;
}

std::vector<int> BestSplit(const CostTable& table, int stages, int microbatches, int64_t microbatch_size) {
  const PlanRequest request;
  const CostModel model(table, request);
  const int n = static_cast<int>(table.layers.size());
  if (stages < 1 || stages > n || !model.Measured(microbatch_size)) return {};
  const auto time = model.StageTimes(microbatch_size);
  std::vector<double> caps;
  for (int a = 0; a < n; ++a) {
    for (int b = a + 1; b <= n; ++b) caps.push_back(time[static_cast<size_t>(a)][static_cast<size_t>(b)]);
  }
  std::sort(caps.begin(), caps.end());
  caps.erase(std::unique(caps.begin(), caps.end()), caps.end());
  // least[k][i]: the least Σ t_s of layers [i, n) in k stages of at most `cap` each; end[k][i]
  // the first stage's end that reaches it (the smallest, so equal costs always split alike).
  using Table = std::vector<std::vector<double>>;
  Table least;
  std::vector<std::vector<int>> end;
  auto solve = [&](double cap) {
    least.assign(static_cast<size_t>(stages) + 1, std::vector<double>(static_cast<size_t>(n) + 1, kNever));
    end.assign(static_cast<size_t>(stages) + 1, std::vector<int>(static_cast<size_t>(n) + 1, -1));
    least[0][static_cast<size_t>(n)] = 0;
    for (int k = 1; k <= stages; ++k) {
      for (int i = n - k; i >= 0; --i) {
        for (int e = i + 1; e <= n - (k - 1); ++e) {
          const double t = time[static_cast<size_t>(i)][static_cast<size_t>(e)];
          const double rest = least[static_cast<size_t>(k) - 1][static_cast<size_t>(e)];
          if (t > cap || rest == kNever) continue;
          if (t + rest < least[static_cast<size_t>(k)][static_cast<size_t>(i)]) {
            least[static_cast<size_t>(k)][static_cast<size_t>(i)] = t + rest;
            end[static_cast<size_t>(k)][static_cast<size_t>(i)] = e;
          }
        }
      }
    }
    return least[static_cast<size_t>(stages)][0];
  };
  const double least_sum = solve(kNever);
  if (!std::isfinite(least_sum)) return {};  // a stage time that is not finite
  // The smallest cap that can be met (feasibility only grows with the cap): a binary search,
  // then caps upward until (M-1) x cap plus the least sum can no longer win.
  size_t lo = 0, hi = caps.size() - 1;
  while (lo < hi) {
    const size_t mid = (lo + hi) / 2;
    if (std::isfinite(solve(caps[mid]))) {
      hi = mid;
    } else {
      lo = mid + 1;
    }
  }
  double best = kNever, best_cap = kNever;
  for (size_t c = lo; c < caps.size(); ++c) {
    const double cap = caps[c];
    if ((microbatches - 1) * cap + least_sum >= best) break;
    const double sum = solve(cap);
    if (std::isfinite(sum) && sum + (microbatches - 1) * cap < best) best = sum + (microbatches - 1) * cap, best_cap = cap;
  }
  solve(best_cap);
  std::vector<int> split = {0};
  for (int k = stages; k >= 1; --k) split.push_back(end[static_cast<size_t>(k)][static_cast<size_t>(split.back())]);
  return split;
}

Result<Prediction> Predict(const CostTable& table, const Layout& layout, const PlanRequest& request) {
  const CostModel model(table, request);
  if (layout.degree < 1 || layout.microbatches < 1 ||
      (layout.kind != "tensor-parallel" && request.batch % (layout.kind == "pipeline" ? layout.microbatches : layout.degree)))
    return Status::InvalidArgument(layout.Describe() + ": the batch of " + std::to_string(request.batch) + " does not divide so");
  const int64_t size = layout.kind == "tensor-parallel"
                           ? request.batch
                           : request.batch / (layout.kind == "pipeline" ? layout.microbatches : layout.degree);
  if (!model.Measured(size))
    return Status::InvalidArgument(
        fmt::format("{}: the cost table has no times at micro-batch size {}", layout.Describe(), size));
  if (layout.kind == "pipeline") {
    const int n = static_cast<int>(table.layers.size());
    const int chunks = layout.schedule == "interleaved" ? layout.virtual_stages : 1;
    if (chunks < 1 || (chunks > 1 && layout.microbatches % layout.degree))
      return Status::InvalidArgument(layout.Describe() + ": interleaved takes micro-batches a multiple of the stages");
    if (static_cast<int>(layout.split.size()) != layout.degree * chunks + 1 || layout.split.front() != 0 ||
        layout.split.back() != n ||
        std::adjacent_find(layout.split.begin(), layout.split.end(), std::greater_equal<int>()) != layout.split.end())
      return Status::InvalidArgument(layout.Describe() + ": not a split of " + std::to_string(n) + " layers");
  }
  COPSE_ASSIGN_OR_RETURN(Prediction p, layout.kind == "pipeline"          ? model.Pipeline(layout)
                                       : layout.kind == "tensor-parallel" ? model.TensorParallel(layout)
                                                                          : model.DataParallel(layout));
  if (!std::isfinite(p.step_s) || p.step_s <= 0)
    return Status::InvalidArgument(layout.Describe() + ": the cost table predicts no finite, positive step time");
  return p;
}

Result<Plan> MakePlan(const CostTable& table, const PlanRequest& request) {
  if (request.batch < 1) return Status::InvalidArgument("batch: expected at least 1");
  if (request.daemons < 1) return Status::InvalidArgument("daemons: expected at least 1");
  if (table.layers.empty()) return Status::InvalidArgument("the cost table has no layers");
  const CostModel model(table, request);
  const int n = static_cast<int>(table.layers.size());
  Plan plan;
  auto add = [&](const Layout& l) -> Status {
    COPSE_ASSIGN_OR_RETURN(Prediction p, Predict(table, l, request));
    plan.candidates.push_back({l, std::move(p)});
    return Status::OK();
  };
  const int most_workers = request.daemons * std::max(1, request.slots_per_daemon);
  for (int d = 1; d <= most_workers; d *= 2) {
    if (request.batch % d || !model.Measured(request.batch / d)) continue;
    COPSE_RETURN_NOT_OK(add({"data-parallel", d, 1, "", {}}));
  }
  // Tensor-parallel groups of the sizes the table has shards of, on one daemon's slots.
  for (const auto& [ranks, layers] : table.shards) {
    if (ranks > std::max(1, request.slots_per_daemon) || !TensorParallelMemberStep(table, ranks, request.batch).ok()) continue;
    COPSE_RETURN_NOT_OK(add({"tensor-parallel", ranks, 1, "", {}}));
  }
  std::map<std::pair<int, int>, std::vector<int>> best_splits;  // by (stages, micro-batches)
  for (int stages = 2; stages <= std::min(request.daemons, n); ++stages) {
    for (int m = 1; m <= request.max_microbatches; m *= 2) {
      if (request.batch % m || !model.Measured(request.batch / m)) continue;
      for (const std::string& schedule : request.schedules) {
        Layout l{"pipeline", stages, m, schedule, {}};
        if (schedule == "interleaved") {
          l.virtual_stages = request.virtual_stages;
          if (m % stages || stages * l.virtual_stages > n) continue;
        }
        const int virtual_stages = stages * (schedule == "interleaved" ? l.virtual_stages : 1);
        if (Splits(n, virtual_stages) <= kExhaustiveSplits) {
          // Few splits: replay every one and keep the fastest (the first of equals) that fits.
          std::optional<Candidate> fastest;
          Status failed;
          ForEachSplit(n, virtual_stages, [&](const std::vector<int>& split) {
            l.split = split;
            auto p = Predict(table, l, request);
            if (!p.ok()) {
              failed = p.status();
              return;
            }
            // The fastest of those that fit, or of all when none does.
            const bool better = !fastest || (p->fits && !fastest->prediction.fits) ||
                                (p->fits == fastest->prediction.fits && p->step_s < fastest->prediction.step_s);
            if (better) fastest = Candidate{l, std::move(*p)};
          });
          COPSE_RETURN_NOT_OK(failed);
          plan.candidates.push_back(std::move(*fastest));
        } else {
          // The same for every schedule of these stages and micro-batches: found once.
          auto& split = best_splits[{virtual_stages, m}];
          if (split.empty()) split = BestSplit(table, virtual_stages, m, request.batch / m);
          l.split = split;
          if (!l.split.empty()) COPSE_RETURN_NOT_OK(add(l));
        }
      }
    }
  }
  if (plan.candidates.empty())
    return Status::InvalidArgument(fmt::format("the cost table has no times at a size a layout of batch {} needs (sizes {})",
                                               request.batch, fmt::join(table.MicrobatchSizes(), ", ")));
  std::stable_sort(plan.candidates.begin(), plan.candidates.end(), [](const Candidate& a, const Candidate& b) {
    if (a.prediction.fits != b.prediction.fits) return a.prediction.fits;
    return a.prediction.step_s < b.prediction.step_s;
  });
  if (plan.candidates.front().prediction.fits) plan.best = 0;
  return plan;
}

}  // namespace copse::ml
