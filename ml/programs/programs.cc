// The ML vertex programs (see register.h for the list, docs/ml-graphs.md for the graphs).
//
// Messages (all tensor sets, ml/tensor_message.h: objects for consumers on the producer's daemon,
// ml/serialize.h bytes, checksummed, for everyone else):
//   params   the parameters of one stage, named as in Sequential ("3.weight")
//   chain    three messages: params, optimizer state, stats {"__stats": [epoch loss sum,
//            epoch images, epoch, total images]}; flows update(t-1) -> update(t) -> eval
//   grads    gradients of one stage plus "__loss" [loss sum, images]; sums of grads are grads
//   log      a pipeline stage's gradient log of micro-batches 0..m plus "__loss": what rebuilds
//            their accumulated grads (gradient_log.h); backward m -> backward m+1
//   stash    what backward needs of one forward: per layer "s<i>.<j>" tensors, "s<i>.shape",
//            "s<i>.seed"; or "x" alone with recomputation; the last stage adds "dy", "__loss"
//   act      one tensor set {"x": activation} (forward) or {"dx": gradient} (backward)
#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <fstream>

#include <nlohmann/json.hpp>

#include "ml/language_model.h"
#include "ml/loss.h"
#include "ml/models.h"
#include "ml/philox.h"
#include "ml/programs/allreduce.h"
#include "ml/programs/gradient_log.h"
#include "ml/programs/profile.h"
#include "ml/programs/register.h"
#include "ml/programs/tensor_parallel.h"
#include "ml/programs/support.h"
#include "ml/serialize.h"
#include "ml/tensor_message.h"
#include "ml/trainer.h"
#include "ml/transformer.h"

namespace copse::ml {
namespace programs {
namespace {

using vertex::VertexContext;
using vertex::VertexProgram;

/// Layers [begin, end) of the whole model from params (end = -1: to the last layer).
/// The layer count of `model`, built once per process.
Result<int> LayerCount(const std::string& model) {
  static std::mutex mu;
  static std::map<std::string, int> layers;
  std::lock_guard<std::mutex> lock(mu);
  auto it = layers.find(model);
  if (it == layers.end()) {
    COPSE_ASSIGN_OR_RETURN(Sequential m, BuildModelLayers(model));
    it = layers.emplace(model, static_cast<int>(m.size())).first;
  }
  return it->second;
}

Result<std::pair<int, int>> LayerRange(const VertexContext& ctx, const TrainSettings& s) {
  int begin = ctx.param<int>("begin", 0);
  int end = ctx.param<int>("end", -1);
  if (end < 0) {
    COPSE_ASSIGN_OR_RETURN(end, LayerCount(s.model));
  }
  return std::make_pair(begin, end);
}

/// Sets the process-wide CPU thread count to the vertex's grant: its resources.cpus, fixed by the
/// job file, so a re-executed vertex computes with the same count and writes the same bits.
void UseThreads(const VertexContext& ctx) { SetCpuThreads(static_cast<int>(std::max(1u, ctx.threads))); }

/// Writes the chain (params, state, stats) to outputs [0, params.chain_ports) (default 1) and
/// `params` alone to the others. A checkpoint step's output 0 is a durable channel that every
/// consumer reads (see ReadParams).
Status WriteChainAndParams(VertexContext& ctx, const chan::Buffer& params, const chan::Buffer& state, const chan::Buffer& stats,
                           const std::vector<size_t>& extra_skip = {}) {
  const size_t chain_ports = static_cast<size_t>(ctx.param<int>("chain_ports", 1));
  for (size_t p = 0; p < ctx.num_outputs(); ++p) {
    if (std::find(extra_skip.begin(), extra_skip.end(), p) != extra_skip.end()) continue;
    COPSE_RETURN_NOT_OK(ctx.output(p).Write(params));
    if (p < chain_ports) {
      COPSE_RETURN_NOT_OK(ctx.output(p).Write(state));
      COPSE_RETURN_NOT_OK(ctx.output(p).Write(stats));
    }
  }
  return Status::OK();
}

/// The batch part this vertex trains on: from a loader vertex's message on `port`, or read
/// from the dataset directly.
Result<Batch> LoadPart(VertexContext& ctx, const TrainSettings& s, int64_t step, int part, int parts, int loader_port,
                       int64_t* batch_size) {
  if (loader_port >= 0) {
    COPSE_ASSIGN_OR_RETURN(chan::Buffer msg, ReadOne(ctx, static_cast<size_t>(loader_port)));
    COPSE_ASSIGN_OR_RETURN(NamedTensors set, ReadTensorMessage(msg));
    const Tensor* x = FindTensor(set, "images");
    const Tensor* y = FindTensor(set, "labels");
    const Tensor* n = FindTensor(set, "batch");
    if (!x || !y || !n || n->numel() < 1) return Status::DataLoss(ctx.name + ": loader message lacks images/labels/batch");
    Batch b;
    b.images = OnDevice(*x, s.device);
    for (const float label : y->ToVector()) b.labels.push_back(static_cast<int32_t>(label));
    *batch_size = static_cast<int64_t>(n->ToVector()[0]);
    return b;
  }
  COPSE_ASSIGN_OR_RETURN(auto train, CachedDataset(s.model, s.data_dir, Split::kTrain, s.limit));
  COPSE_ASSIGN_OR_RETURN(auto idx, StepIndices(s, step, part, parts, batch_size));
  return train->Gather(idx, s.device);
}

// ---- stash encoding -----------------------------------------------------------------------

void AddStash(NamedTensors& out, const Stash& stash) {
  for (size_t i = 0; i < stash.layers.size(); ++i) {
    const LayerStash& ls = stash.layers[i];
    const std::string p = "s" + std::to_string(i) + ".";
    for (size_t j = 0; j < ls.tensors.size(); ++j) {  // undefined tensors keep their slot
      if (ls.tensors[j].defined()) {
        out.emplace_back(p + std::to_string(j), ls.tensors[j]);
      } else {
        out.emplace_back(p + std::to_string(j) + ".undefined", Scalars({0}));
      }
    }
    std::vector<float> shape(ls.shape.begin(), ls.shape.end());
    out.emplace_back(p + "shape", Scalars(shape.empty() ? std::vector<float>{-1.0f} : shape));
    std::vector<float> seed(4);
    for (int k = 0; k < 4; ++k) seed[k] = static_cast<float>((ls.seed >> (16 * k)) & 0xffff);
    out.emplace_back(p + "seed", Scalars(seed));
  }
}

/// The stash of `layers` layers in `set`, its tensors on `device` (a stash that crossed daemons,
/// or a re-run's, comes as host copies).
Result<Stash> ReadStash(const NamedTensors& set, size_t layers, Device* device) {
  Stash stash;
  stash.layers.resize(layers);
  for (size_t i = 0; i < layers; ++i) {
    LayerStash& ls = stash.layers[i];
    const std::string p = "s" + std::to_string(i) + ".";
    for (size_t j = 0;; ++j) {
      const Tensor* t = FindTensor(set, p + std::to_string(j));
      if (t) {
        ls.tensors.push_back(OnDevice(*t, device));
      } else if (FindTensor(set, p + std::to_string(j) + ".undefined")) {
        ls.tensors.emplace_back();
      } else {
        break;
      }
    }
    const Tensor* shape = FindTensor(set, p + "shape");
    const Tensor* seed = FindTensor(set, p + "seed");
    if (!shape || !seed || seed->numel() != 4 || shape->numel() < 1)
      return Status::DataLoss("stash lacks layer " + std::to_string(i) + "'s shape or seed");
    const std::vector<float> dims = shape->ToVector(), seed_parts = seed->ToVector();
    if (!(dims.size() == 1 && dims[0] < 0))
      for (const float d : dims) ls.shape.push_back(static_cast<int64_t>(d));
    for (int k = 0; k < 4; ++k) ls.seed |= static_cast<uint64_t>(seed_parts[static_cast<size_t>(k)]) << (16 * k);
  }
  return stash;
}

// ---- programs -----------------------------------------------------------------------------

/// Parameters (and empty optimizer state) of layers [begin, end), from the seed. With
/// params.clock the last output gets the wall time (for eval's images/s; not deterministic,
/// and only read by eval).
class InitProgram final : public VertexProgram {
 public:
  Status Run(VertexContext& ctx) override {
    TraceSpan span(ctx);
    COPSE_ASSIGN_OR_RETURN(TrainSettings s, SettingsFromParams(ctx));
    const int64_t t0 = WallMicros();  // training starts now (the dataset is loaded)
    COPSE_ASSIGN_OR_RETURN(auto range, LayerRange(ctx, s));
    COPSE_ASSIGN_OR_RETURN(Sequential full, BuildModel(s.model, s.seed));
    Sequential stage = full.Slice(range.first, range.second);
    // A member of a tensor-parallel group (params.tensor_parallel > 1) starts from its shard.
    const int tp = ctx.param<int>("tensor_parallel", 1), tp_rank = ctx.param<int>("tp_rank", 0);
    if (tp > 1) COPSE_RETURN_NOT_OK(BuildModelShardLayers(s.model, tp_rank, tp).status().WithContext(ctx.name));
    const chan::Buffer params = TensorMessage(tp > 1 ? ShardParameters(stage.ExportParameters(), tp_rank, tp)
                                                     : ParameterHandles(stage));  // `stage` dies here
    const chan::Buffer state = TensorMessage({});
    const chan::Buffer stats = TensorMessage({{"__stats", Scalars({0, 0, 0, 0})}});
    std::vector<size_t> skip;
    if (ctx.param<bool>("clock", false) && ctx.num_outputs() > 0) {
      skip.push_back(ctx.num_outputs() - 1);
      COPSE_RETURN_NOT_OK(ctx.output(ctx.num_outputs() - 1).Write(chan::Buffer(std::to_string(t0))));
    }
    COPSE_RETURN_NOT_OK(WriteChainAndParams(ctx, params, state, stats, skip));
    return ctx.CloseOutputs();
  }
};

/// Part params.worker of params.workers of the global batch of step first_step + replica:
/// {"images", "labels", "batch"} (a shard loader feeding ml.grad with params.loader).
class LoadProgram final : public VertexProgram {
 public:
  Status Run(VertexContext& ctx) override {
    TraceSpan span(ctx);
    COPSE_ASSIGN_OR_RETURN(TrainSettings s, SettingsFromParams(ctx));
    const int parts = ctx.param<int>("workers", 1);
    const int64_t step = ctx.param<int64_t>("first_step", 0) + ctx.replica;
    int64_t batch_size = 0;
    COPSE_ASSIGN_OR_RETURN(Batch b, LoadPart(ctx, s, step, ctx.param<int>("worker", 0), parts, -1, &batch_size));
    std::vector<float> labels(b.labels.begin(), b.labels.end());
    const chan::Buffer msg =
        TensorMessage({{"images", b.images}, {"labels", Scalars(labels)}, {"batch", Scalars({static_cast<float>(batch_size)})}});
    COPSE_RETURN_NOT_OK(ctx.WriteAll(msg));
    return ctx.CloseOutputs();
  }
};

/// Forward + backward of data-parallel worker params.worker (of params.workers) on its shard
/// of the global batch of step first_step + replica. Input 0: params (input 1: a loader's batch
/// when params.loader). Output: grads (normalized by the global batch, so they sum up).
class GradProgram final : public VertexProgram {
 public:
  Status Run(VertexContext& ctx) override {
    TraceSpan span(ctx);
    UseThreads(ctx);
    COPSE_ASSIGN_OR_RETURN(TrainSettings s, SettingsFromParams(ctx));
    COPSE_ASSIGN_OR_RETURN(auto range, LayerRange(ctx, s));
    const int workers = ctx.param<int>("workers", 1);
    const int64_t step = ctx.param<int64_t>("first_step", 0) + ctx.replica;
    const int w = ctx.param<int>("worker", 0);
    COPSE_ASSIGN_OR_RETURN(chan::Buffer params, ReadParams(ctx, 0));
    int64_t batch_size = 0;
    COPSE_ASSIGN_OR_RETURN(Batch b, LoadPart(ctx, s, step, w, workers, ctx.param<bool>("loader", false) ? 1 : -1, &batch_size));
    COPSE_ASSIGN_OR_RETURN(ModelLease lease, LeaseModel(s, range.first, range.second, params));
    Sequential& m = lease->model;
    lease->grads_key = 0;
    m.FreshGradients();  // the last ones went out as a message
    double loss_sum = 0;
    if (b.size() > 0) {
      Stash stash;
      const ForwardContext fc = StepContext(s, step, w);
      COPSE_ASSIGN_OR_RETURN(Tensor logits, m.Forward(b.images, fc, &stash));
      COPSE_ASSIGN_OR_RETURN(LossOutput loss, CrossEntropyLoss(logits, b.labels, batch_size));
      if (s.precision == Precision::kFloat16) ScaleLossGradient(loss.grad, LossScale{lease->loss_scale, 0});
      COPSE_RETURN_NOT_OK(m.Backward(loss.grad, stash, false, /*accumulate=*/false).status());
      loss_sum = loss.loss * static_cast<double>(b.size());
    } else {
      m.ZeroGrad();
    }
    NamedTensors grads = GradientHandles(m);  // no copies: renewed before the next write
    grads.emplace_back("__loss", Scalars({static_cast<float>(loss_sum), static_cast<float>(b.size())}));
    const chan::Buffer out = TensorMessage(std::move(grads));
    lease->grads_key = TensorMessageKey(out);
    lease->grads_loss = {static_cast<float>(loss_sum), static_cast<float>(b.size())};
    lease.Commit();
    COPSE_RETURN_NOT_OK(ctx.WriteAll(out));
    return ctx.CloseOutputs();
  }
};

/// Adds gradient sets on `device` in order: the result of input 0, + input 1, + ... (fixed
/// order, so the sum is the same bits on every run).
Result<NamedTensors> SumGradients(const std::vector<chan::Buffer>& msgs, Device* device) {
  if (msgs.empty()) return Status::InvalidArgument("no gradients to sum");
  COPSE_ASSIGN_OR_RETURN(NamedTensors acc, ReadTensorMessage(msgs[0]));
  acc = OnDevice(acc, device);
  for (size_t i = 1; i < msgs.size(); ++i) {
    COPSE_ASSIGN_OR_RETURN(NamedTensors g, ReadTensorMessage(msgs[i]));
    g = OnDevice(g, device);
    if (g.size() != acc.size()) return Status::DataLoss("gradient sets of different sizes");
    for (size_t k = 0; k < acc.size(); ++k) {
      if (g[k].first != acc[k].first || g[k].second.shape() != acc[k].second.shape())
        return Status::DataLoss("gradient sets disagree at '" + acc[k].first + "'");
      Tensor& sum = acc[k].second;
      const Tensor& b = g[k].second;
      const size_t n = static_cast<size_t>(b.numel());
      if (i == 1 && sum.is_cpu()) {  // the inputs' tensors are read-only: the first sum goes to a fresh one
        Tensor fresh = Tensor::Empty(sum.shape());
        const float* __restrict x = sum.data();
        const float* __restrict y = b.data();
        float* __restrict out = fresh.data();
        for (size_t j = 0; j < n; ++j) out[j] = x[j] + y[j];  // Axpy(1, b, a)'s bits
        sum = std::move(fresh);
      } else {
        if (i == 1) sum = sum.Clone();  // a fresh sum on the device, likewise
        sum.device()->Axpy(1.0f, b.data(), n, sum.data());
      }
    }
  }
  return acc;
}

/// SumGradients straight into the model's gradients (the same sums in the same order, without
/// an intermediate set); returns the summed "__loss".
Result<std::vector<float>> SumGradientsInto(Sequential& m, const std::vector<chan::Buffer>& msgs) {
  if (msgs.empty()) return Status::InvalidArgument("no gradients to sum");
  COPSE_ASSIGN_OR_RETURN(NamedTensors first, ReadTensorMessage(msgs[0]));
  m.FreshGradients();  // the model's may be a message's
  COPSE_RETURN_NOT_OK(m.ImportGradients(first));
  std::vector<float> loss = ReadScalars(FindTensor(first, "__loss"), 2);
  const NamedTensors mine = GradientHandles(m);
  for (size_t i = 1; i < msgs.size(); ++i) {
    COPSE_ASSIGN_OR_RETURN(NamedTensors g, ReadTensorMessage(msgs[i]));
    for (const auto& [name, dst] : mine) {
      const Tensor* src = FindTensor(g, name);
      if (!src || src->shape() != dst.shape()) return Status::DataLoss("gradient sets disagree at '" + name + "'");
      const Tensor there = OnDevice(*src, dst.device());
      dst.device()->Axpy(1.0f, there.data(), static_cast<size_t>(there.numel()), dst.data());
    }
    const auto l = ReadScalars(FindTensor(g, "__loss"), 2);
    loss[0] += l[0], loss[1] += l[1];
  }
  return loss;
}

/// SGD's update in one pass over memory: each parameter's gradient is the sum of the messages'
/// tensors in port order (as SumGradientsInto adds them, read in place), stepped out of place
/// (Sgd::StepOutOfPlace). Returns the summed "__loss".
Result<std::vector<float>> SgdStepOnGradients(const Sequential& m, Sgd& sgd, const std::vector<chan::Buffer>& msgs) {
  const auto names = m.ParameterNames();
  const auto params = m.Parameters();
  std::vector<NamedTensors> sets;  // holds the tensors the pointers below point into
  std::vector<std::vector<const float*>> grads(params.size());
  std::vector<float> loss;
  for (size_t k = 0; k < msgs.size(); ++k) {
    COPSE_ASSIGN_OR_RETURN(NamedTensors g, ReadTensorMessage(msgs[k]));
    g = OnDevice(g, m.device());
    for (size_t i = 0; i < params.size(); ++i) {
      const Tensor* t = FindTensor(g, names[i]);
      if (!t || t->shape() != params[i]->value.shape() || t->device() != params[i]->value.device())
        return Status::DataLoss("gradient set " + std::to_string(k) + " lacks '" + names[i] + "' of shape " +
                                ShapeToString(params[i]->value.shape()));
      grads[i].push_back(t->data());
    }
    const auto l = ReadScalars(FindTensor(g, "__loss"), 2);
    if (k == 0) {
      loss = l;
    } else {
      loss[0] += l[0], loss[1] += l[1];
    }
    sets.push_back(std::move(g));
  }
  sgd.StepOutOfPlace(grads);
  return loss;
}

/// The gradients of `m` from the gradient logs of a pipeline stage that batches its weight
/// gradients (every message of `msgs` a log whose entries carry the layers' "w<i>" parts, see
/// BackwardProgram): one Sequential::WeightGradients over every micro-batch of every log, in port
/// and entry order. Returns the summed "__loss".
Result<std::vector<float>> WeightGradientsFromLogs(const Sequential& m, const std::vector<chan::Buffer>& msgs) {
  std::vector<NamedTensors> logs;
  for (size_t k = 0; k < msgs.size(); ++k) {
    COPSE_ASSIGN_OR_RETURN(NamedTensors set, ReadTensorMessage(msgs[k]));
    if (!IsGradientLog(set))
      return Status::DataLoss("input " + std::to_string(k + 1) + " is not a gradient log (params.weight_grads is \"batched\")");
    logs.push_back(std::move(set));
  }
  std::vector<float> loss(2, 0.0f);
  std::vector<Stash> stashes;
  std::vector<std::vector<Tensor>> wgrads;
  for (size_t k = 0; k < logs.size(); ++k) {
    auto counted = GradientLogEntries(logs[k]);
    if (!counted.ok()) return counted.status().WithContext("input " + std::to_string(k + 1));
    for (size_t i = 0; i < *counted; ++i) {
      const NamedTensors entry = GradientLogEntry(logs[k], i);
      if (FindTensor(entry, "dy")->dim(0) == 0) continue;  // an empty micro-batch adds nothing
      const std::string where = "input " + std::to_string(k + 1) + ", entry " + std::to_string(i);
      auto stash = ReadStash(entry, m.size(), m.device());
      if (!stash.ok()) return stash.status().WithContext(where);
      std::vector<Tensor> parts(m.size());
      for (size_t l = 0; l < m.size(); ++l) {
        if (m.layer(l).parameters().empty()) continue;
        const Tensor* w = FindTensor(entry, "w" + std::to_string(l));
        if (!w) return Status::DataLoss(where + " lacks layer " + std::to_string(l) + "'s weight-gradient part");
        parts[l] = OnDevice(*w, m.device());
      }
      stashes.push_back(std::move(stash).value());
      wgrads.push_back(std::move(parts));
    }
    const auto l = ReadScalars(FindTensor(logs[k], "__loss"), 2);
    loss[0] += l[0], loss[1] += l[1];
  }
  std::vector<const Stash*> stash_ptrs;
  std::vector<const std::vector<Tensor>*> wgrad_ptrs;
  for (size_t i = 0; i < stashes.size(); ++i) stash_ptrs.push_back(&stashes[i]), wgrad_ptrs.push_back(&wgrads[i]);
  COPSE_RETURN_NOT_OK(m.WeightGradients(stash_ptrs, wgrad_ptrs));
  return loss;
}

/// params.weight_grads of a pipeline stage's backward and update: true for "batched", false
/// for "per-microbatch" (the default); anything else is an error naming the vertex.
Result<bool> BatchedWeightGradients(const VertexContext& ctx) {
  const auto v = ctx.param<std::string>("weight_grads", "per-microbatch");
  if (v == "batched" || v == "per-microbatch") return v == "batched";
  return Status::InvalidArgument(ctx.name + ": params.weight_grads is \"" + v + "\"; expected \"batched\" or \"per-microbatch\"");
}

Result<std::vector<chan::Buffer>> ReadEveryInput(VertexContext& ctx, size_t from) {
  std::vector<chan::Buffer> msgs;
  for (size_t p = from; p < ctx.num_inputs(); ++p) {
    COPSE_ASSIGN_OR_RETURN(chan::Buffer m, ReadOne(ctx, p));
    msgs.push_back(std::move(m));
  }
  return msgs;
}

/// A node of a reduction tree: the sum of its inputs, in port order, to every output.
class ReduceProgram final : public VertexProgram {
 public:
  Status Run(VertexContext& ctx) override {
    TraceSpan span(ctx);
    COPSE_ASSIGN_OR_RETURN(Device* const device, ProgramDevice(ctx));
    COPSE_ASSIGN_OR_RETURN(auto msgs, ReadEveryInput(ctx, 0));
    if (msgs.size() == 1) {
      COPSE_RETURN_NOT_OK(ctx.WriteAll(msgs[0]));
    } else {
      COPSE_ASSIGN_OR_RETURN(NamedTensors sum, SumGradients(msgs, device));
      COPSE_RETURN_NOT_OK(ctx.WriteAll(TensorMessage(std::move(sum))));
    }
    return ctx.CloseOutputs();
  }
};

/// One round of a ring all-reduce over params.workers replicas, unrolled as vertices:
/// round k of worker w (stage of worker params.worker; replica r is round r % rounds of step
/// r / rounds, rounds = 2 (workers - 1)) reads its own buffer (input 0: the gradients at k = 0, else its round k-1)
/// and what its left neighbour sent (input 1), adds (reduce-scatter, k < workers-1) or copies
/// (all-gather) that chunk, and writes its buffer (output 0) and the chunk it sends next
/// (output 1; after the last round output 1 is absent). Chunks are ranges of the flattened
/// gradients; chunk c is summed in ring order starting at worker c+1.
class RingReduceProgram final : public VertexProgram {
 public:
  Status Run(VertexContext& ctx) override {
    TraceSpan span(ctx);
    const int workers = ctx.param<int>("workers", 1);
    const int rounds = 2 * (workers - 1);
    if (workers < 2) return Status::InvalidArgument(ctx.name + ": a ring needs params.workers >= 2");
    COPSE_RETURN_NOT_OK(CheckPartition(ctx));
    const int k = ctx.replica % rounds;
    const int w = ctx.param<int>("worker", 0);
    COPSE_ASSIGN_OR_RETURN(chan::Buffer own_msg, ReadOne(ctx, 0));
    COPSE_ASSIGN_OR_RETURN(chan::Buffer recv_msg, ReadOne(ctx, 1));
    // The rounds add and copy on the host: GPU workers' gradients come over first.
    bool shared = false;
    COPSE_ASSIGN_OR_RETURN(NamedTensors own, ReadTensorMessage(own_msg, &shared));
    if (shared) own = HostCopies(own);  // written below; the producer's tensors are read-only (decoded ones are on the host)
    COPSE_ASSIGN_OR_RETURN(NamedTensors recv, ReadTensorMessage(recv_msg));
    recv = OnDevice(recv, CpuDevice());
    std::vector<std::pair<float*, int64_t>> flat;
    int64_t total = 0;
    for (auto& [n, t] : own) flat.emplace_back(t.data(), t.numel()), total += t.numel();
    auto chunk_range = [&](int c) { return std::make_pair(total * c / workers, total * (c + 1) / workers); };
    auto for_range = [&](int64_t lo, int64_t hi, const std::function<void(float*, int64_t, int64_t)>& fn) {
      int64_t base = 0;  // fn(pointer into own, offset in flat space, count)
      for (auto& [p, n] : flat) {
        const int64_t a = std::max(lo, base), b = std::min(hi, base + n);
        if (a < b) fn(p + (a - base), a, b - a);
        base += n;
      }
    };
    // The chunk received this round, and the flat values it carries.
    const int recv_chunk =
        k < workers - 1 ? ((w - k - 1) % workers + workers) % workers : ((w - (k - (workers - 1))) % workers + workers) % workers;
    const auto [rlo, rhi] = chunk_range(recv_chunk);
    std::vector<float> incoming(static_cast<size_t>(rhi - rlo));
    if (k == 0) {  // the neighbour's whole gradients
      int64_t base = 0;
      for (auto& [n, t] : recv) {
        const int64_t a = std::max(rlo, base), b = std::min(rhi, base + t.numel());
        if (a < b) std::memcpy(incoming.data() + (a - rlo), t.data() + (a - base), sizeof(float) * (b - a));
        base += t.numel();
      }
    } else {
      const Tensor* c = FindTensor(recv, "chunk");
      if (!c || c->numel() != rhi - rlo) return Status::DataLoss(ctx.name + ": bad ring chunk");
      std::memcpy(incoming.data(), c->data(), incoming.size() * sizeof(float));
    }
    const bool add = k < workers - 1;
    for_range(rlo, rhi, [&](float* p, int64_t off, int64_t n) {
      const float* src = incoming.data() + (off - rlo);
      if (add) {
        for (int64_t i = 0; i < n; ++i) p[i] += src[i];
      } else {
        std::memcpy(p, src, sizeof(float) * n);
      }
    });
    // What this worker sends in round k+1: the chunk it just completed.
    COPSE_RETURN_NOT_OK(ctx.output(0).Write(TensorMessage(std::move(own))));
    if (k + 1 < rounds && ctx.num_outputs() > 1) {
      const auto [slo, shi] = chunk_range(recv_chunk);
      std::vector<float> send(static_cast<size_t>(shi - slo));
      for_range(slo, shi,
                [&](float* p, int64_t off, int64_t n) { std::memcpy(send.data() + (off - slo), p, sizeof(float) * n); });
      COPSE_RETURN_NOT_OK(ctx.output(1).Write(TensorMessage({{"chunk", Scalars(send)}})));
    }
    return ctx.CloseOutputs();
  }
};

/// A pipeline step's check of its gradients (params.step_check, for fp16's overflow check and
/// --clip-norm's global norm): whether every gradient of the stages it covers is finite, and the
/// sum of their squares (unscaled). The last micro-batch's backward of stage s adds its stage's
/// accumulated gradients to what stage s + 1 sent with dL/dx (the stages above s) and passes
/// the result down with its own dL/dx; stage 0's then covers the whole model and goes to every
/// stage's update ("__check" [finite, norm]: the L2 norm, not its square, which a float would
/// overflow first), so all of them make the same decision.
struct StepCheck {
  bool finite = true;
  double sum_squares = 0;

  Tensor AsTensor() const { return Scalars({finite ? 1.0f : 0.0f, static_cast<float>(std::sqrt(sum_squares))}); }
  static Result<StepCheck> From(const NamedTensors& set, const std::string& where) {
    const Tensor* t = FindTensor(set, "__check");
    if (!t || t->numel() != 2) return Status::DataLoss(where + " carries no step check (\"__check\" [finite, norm])");
    const std::vector<float> v = t->ToVector();
    if (!(v[1] >= 0)) return Status::DataLoss(where + ": the step check's norm is " + std::to_string(v[1]));
    return StepCheck{v[0] != 0.0f, double{v[1]} * double{v[1]}};
  }
  /// This stage's accumulated gradients, unscaled by fp16's `loss_scale` (1 otherwise).
  static StepCheck Of(const Sequential& m, float loss_scale, bool need_norm) {
    const auto params = m.Parameters();
    StepCheck c;
    c.finite = GradientsFinite(params);
    if (c.finite && need_norm) c.sum_squares = GradSumSquares(params) / (double{loss_scale} * loss_scale);
    return c;
  }
  StepCheck And(const StepCheck& above) const {
    return finite && above.finite ? StepCheck{true, sum_squares + above.sum_squares} : StepCheck{false, 0};
  }
};

/// Optimizer step of one stage at step first_step + replica. Input 0: the chain (params,
/// state, stats); inputs 1..: gradient sets, summed in port order (a parameter server when they
/// come straight from the workers), or with params.weight_grads "batched" the gradient logs of a
/// stage that batches its weight gradients (WeightGradientsFromLogs); with params.step_checks
/// C, the last C inputs are a pipeline's StepChecks (one from each of its C data-parallel
/// copies), which decide fp16's skip and give --clip-norm's norm. Outputs: the chain to output 0 (and to output 1 when a
/// checkpoint is due, see WriteChainAndParams), the new parameters to the others.
class UpdateProgram final : public VertexProgram {
 public:
  Status Run(VertexContext& ctx) override {
    TraceSpan span(ctx);
    UseThreads(ctx);
    COPSE_ASSIGN_OR_RETURN(const bool batched, BatchedWeightGradients(ctx));
    COPSE_ASSIGN_OR_RETURN(TrainSettings s, SettingsFromParams(ctx));
    COPSE_ASSIGN_OR_RETURN(auto range, LayerRange(ctx, s));
    const int64_t step = ctx.param<int64_t>("first_step", 0) + ctx.replica;
    if (s.precision == Precision::kFloat16 && ctx.param<int>("step_checks", 0) == 0) {
      COPSE_ASSIGN_OR_RETURN(const int layers, LayerCount(s.model));
      if (range.first != 0 || range.second != layers)
        return Status::InvalidArgument(ctx.name + ": params.precision fp16 for layers [" + std::to_string(range.first) + ", " +
                                       std::to_string(range.second) +
                                       ") needs params.step_checks (a pipeline's stages must skip overflowed steps together)");
    }
    COPSE_ASSIGN_OR_RETURN(auto chain, ReadAll(ctx, 0));
    if (chain.size() != 3) return Status::DataLoss(ctx.name + ": the chain input needs params, state, stats");
    COPSE_ASSIGN_OR_RETURN(auto grads, ReadEveryInput(ctx, 1));
    // The pipeline's verdict on this step's gradients, when its stages check them together.
    const int checks = ctx.param<int>("step_checks", 0);
    std::optional<StepCheck> verdict;
    if (checks < 0 || static_cast<size_t>(checks) >= grads.size())
      return Status::InvalidArgument(ctx.name + ": params.step_checks " + std::to_string(checks) +
                                     " leaves no gradient input of " + std::to_string(grads.size()));
    for (int k = 0; k < checks; ++k) {
      const std::string where = ctx.name + ": input " + std::to_string(1 + grads.size() - checks + k);
      COPSE_ASSIGN_OR_RETURN(NamedTensors set, ReadTensorMessage(grads[grads.size() - checks + k]));
      COPSE_ASSIGN_OR_RETURN(StepCheck c, StepCheck::From(set, where));
      verdict = verdict ? verdict->And(c) : c;
    }
    grads.resize(grads.size() - checks);
    if (grads.empty()) return Status::InvalidArgument(ctx.name + ": no gradient inputs");
    const uint64_t grads_key = grads.size() == 1 ? TensorMessageKey(grads[0]) : 0;
    COPSE_ASSIGN_OR_RETURN(ModelLease lease, LeaseModel(s, range.first, range.second, chain[0], grads_key));
    Sequential& m = lease->model;
    // Optimizer state: reuse the cached optimizer when it holds exactly the chain's state.
    const uint64_t state_key = TensorMessageKey(chain[1]);
    COPSE_ASSIGN_OR_RETURN(NamedTensors stats_set, ReadTensorMessage(chain[2]));
    std::vector<float> stats = ReadScalars(FindTensor(stats_set, "__stats"), 4);
    if (!lease->optimizer || lease->state_key != state_key) {
      COPSE_ASSIGN_OR_RETURN(NamedTensors state, ReadTensorMessage(chain[1]));
      lease->state_key = 0;
      lease->optimizer = MakeOptimizer(s, m);
      if (!state.empty()) COPSE_RETURN_NOT_OK(lease->optimizer->ImportState(state));
    }
    lease->optimizer->set_lr(StepLr(s, step, ctx.param<int64_t>("steps", 0)));
    auto* sgd = dynamic_cast<Sgd*>(lease->optimizer.get());
    // A stage that batches its weight gradients sends its gradient log; they are computed here,
    // into the model's own gradient tensors (so are the sums a clipped step needs): own_loss.
    std::optional<std::vector<float>> own_loss;
    if (batched) {
      auto l = WeightGradientsFromLogs(m, grads);
      if (!l.ok()) return l.status().WithContext(ctx.name);
      own_loss = std::move(l).value();
      lease->grads_key = 0;
    }
    // fp16 (ml/loss_scaler.h): the workers' gradients are S times too large; divided by S in the
    // model's own tensors (summed there first: message tensors are never written), or, when one
    // overflowed, the step is skipped. The scale's state travels in the chain's stats.
    // A pipeline's stages skip together: the verdict covers every stage's gradients.
    const bool fp16 = s.precision == Precision::kFloat16;
    LossScale scale = LossScaleIn(stats_set, s.initial_loss_scale);
    bool finite = true;
    if (fp16) {
      if (!own_loss) {
        COPSE_ASSIGN_OR_RETURN(own_loss, SumGradientsInto(m, grads));
      }
      lease->grads_key = 0;
      finite = verdict ? verdict->finite : UnscaleGradients(m.Parameters(), scale);
      if (verdict && finite && !UnscaleGradients(m.Parameters(), scale))
        return Status::DataLoss(ctx.name + ": the sum of this stage's finite gradients overflowed float32");
      scale = scale.Next(finite);
    }
    if (s.clip_norm > 0 && finite) {
      // The global norm needs every gradient of the model: an update of the whole model
      // (data-parallel) has them, a pipeline's stages have the verdict's sum of squares (of one
      // pipeline: the norm of several pipelines' summed gradients is not gathered). Gradients
      // are summed into the model's own tensors first.
      COPSE_ASSIGN_OR_RETURN(const int layers, LayerCount(s.model));
      if (verdict ? checks != 1 : (range.first != 0 || range.second != layers))
        return Status::InvalidArgument(ctx.name +
                                       ": params.clip_norm needs an update of the whole model or one pipeline's "
                                       "step checks, not layers [" +
                                       std::to_string(range.first) + ", " + std::to_string(range.second) + ") with " +
                                       std::to_string(checks) + " check(s)");
      if (!own_loss) {
        COPSE_ASSIGN_OR_RETURN(own_loss, SumGradientsInto(m, grads));
      }
      lease->grads_key = 0;
      if (verdict) {
        ClipGradsToNorm(m.Parameters(), std::sqrt(verdict->sum_squares), s.clip_norm);
      } else {
        ClipGradNorm(m.Parameters(), s.clip_norm);
      }
    }
    std::vector<float> loss;
    if (!finite) {
      loss = *own_loss;  // skipped: parameters and optimizer state stay as they were
    } else if (sgd && own_loss) {
      loss = *own_loss;
      std::vector<std::vector<const float*>> own;
      for (const Parameter* p : m.Parameters()) own.push_back({p->grad.data()});
      sgd->StepOutOfPlace(own);
    } else if (sgd) {
      COPSE_ASSIGN_OR_RETURN(loss, SgdStepOnGradients(m, *sgd, grads));
    } else {
      if (own_loss) {
        loss = *own_loss;
      } else if (grads_key == 0 || lease->grads_key != grads_key) {
        lease->grads_key = 0;
        COPSE_ASSIGN_OR_RETURN(loss, SumGradientsInto(m, grads));
      } else {
        loss = lease->grads_loss;  // the entry holds exactly these gradients
      }
      // An in-place step: first copies of the values, which messages may share.
      COPSE_RETURN_NOT_OK(m.ShareParameters(m.ExportParameters(/*host=*/false)));
      lease->optimizer->Step();
    }
    AddToStats(s, step, loss, stats);
    // No copies: the next update replaces the values and SGD's momentum instead of writing them
    // (the sharing contract in support.h); Adam's state is stepped in place, so it is copied.
    NamedTensors params_set = ParameterHandles(m), stats_set_out = {{"__stats", Scalars(stats)}};
    if (fp16) {  // the next step's gradients are computed at the new scale
      params_set.emplace_back("__loss_scale", Scalars({scale.scale}));
      stats_set_out.emplace_back("__loss_scale", Scalars({scale.scale, static_cast<float>(scale.good_steps)}));
    }
    const chan::Buffer params_out = TensorMessage(std::move(params_set));
    const chan::Buffer state_out = TensorMessage(sgd ? sgd->StateHandles() : lease->optimizer->ExportState());
    const chan::Buffer stats_out = TensorMessage(std::move(stats_set_out));
    lease->params_key = TensorMessageKey(params_out);
    lease->state_key = TensorMessageKey(state_out);
    lease->loss_scale = scale.scale;
    if (stats[1] > 0) {  // the stage that computes the loss reports the run's progress
      ctx.progress = StepProgress(s, step, ctx.param<int64_t>("steps", 0), stats);
      if (fp16) ctx.progress["loss_scale"] = scale.scale, ctx.progress["step_skipped"] = !finite;
    }
    lease.Commit();
    COPSE_RETURN_NOT_OK(WriteChainAndParams(ctx, params_out, state_out, stats_out));
    return ctx.CloseOutputs();
  }
};

/// Position of a forward/backward vertex: replica r of the stage of pipeline params.worker (of
/// params.workers data-parallel pipelines) is step first_step + r / M, micro-batch r % M; it
/// trains on part w*M + m of W*M of the global batch.
struct MicroPos {
  int64_t step;
  int w, m, W, M;
  int part() const { return w * M + m; }
  int parts() const { return W * M; }
};

MicroPos PosOf(const VertexContext& ctx) {
  MicroPos p;
  p.W = ctx.param<int>("workers", 1);
  p.M = ctx.param<int>("microbatches", 1);
  p.w = ctx.param<int>("worker", 0);
  p.step = ctx.param<int64_t>("first_step", 0) + ctx.replica / p.M;
  p.m = ctx.replica % p.M;
  return p;
}

/// Forward of pipeline stage params.stage (of params.stages) on one micro-batch. Inputs:
/// 0 params, 1 the previous stage's activation (not on stage 0, which reads its micro-batch).
/// Outputs: 0 the stash for this micro-batch's backward, 1 the activation (not on the last).
/// The last stage also computes the loss and dL/dlogits into the stash.
class ForwardProgram final : public VertexProgram {
 public:
  Status Run(VertexContext& ctx) override {
    TraceSpan span(ctx);
    UseThreads(ctx);
    COPSE_ASSIGN_OR_RETURN(TrainSettings s, SettingsFromParams(ctx));
    COPSE_ASSIGN_OR_RETURN(auto range, LayerRange(ctx, s));
    const int stage = ctx.param<int>("stage", 0), stages = ctx.param<int>("stages", 1);
    const bool recompute = ctx.param<bool>("recompute", false);
    const MicroPos pos = PosOf(ctx);
    COPSE_ASSIGN_OR_RETURN(chan::Buffer params, ReadParams(ctx, 0));
    Tensor x;
    Batch b;
    int64_t batch_size = 0;
    if (stage == 0) {
      COPSE_ASSIGN_OR_RETURN(
          b, LoadPart(ctx, s, pos.step, pos.part(), pos.parts(), ctx.param<bool>("loader", false) ? 1 : -1, &batch_size));
      x = b.images;
    } else {
      COPSE_ASSIGN_OR_RETURN(chan::Buffer act, ReadOne(ctx, 1));
      COPSE_ASSIGN_OR_RETURN(x, ReadSingleTensor(act));
      x = OnDevice(x, s.device);
    }
    if (stage == stages - 1 && stage != 0) {  // labels of this micro-batch (no images)
      COPSE_ASSIGN_OR_RETURN(auto idx, StepIndices(s, pos.step, pos.part(), pos.parts(), &batch_size));
      COPSE_ASSIGN_OR_RETURN(b.labels, TrainLabelsOf(s, idx));
    }
    COPSE_ASSIGN_OR_RETURN(ModelLease lease, LeaseModel(s, range.first, range.second, params));
    COPSE_ASSIGN_OR_RETURN(auto tp, TensorParallelScope::Open(ctx, s.tp_rank, s.tp_ranks, lease->model));
    Stash stash;
    const ForwardContext fc = StepContext(s, pos.step, pos.part());
    NamedTensors out;
    Tensor y = Tensor::Zeros({0});  // an empty micro-batch (a short last step) sends an empty activation
    if (x.dim(0) > 0) {
      COPSE_ASSIGN_OR_RETURN(y, lease->model.Forward(x, fc, &stash));
    }
    if (recompute) {
      out.emplace_back("x", x);
    } else {
      AddStash(out, stash);
    }
    if (stage == stages - 1) {
      double loss_sum = 0;
      Tensor dy;
      if (x.dim(0) > 0) {
        COPSE_ASSIGN_OR_RETURN(LossOutput loss, CrossEntropyLoss(y, b.labels, batch_size));
        loss_sum = loss.loss * static_cast<double>(b.size());
        // fp16: dL/dlogits x S (ml/loss_scaler.h), S as the stage's parameters carry it.
        if (s.precision == Precision::kFloat16) ScaleLossGradient(loss.grad, LossScale{lease->loss_scale, 0});
        dy = loss.grad;
      } else {
        dy = Tensor::Zeros({0, 10});
      }
      out.emplace_back("dy", dy);
      out.emplace_back("__loss", Scalars({static_cast<float>(loss_sum), static_cast<float>(b.size())}));
    }
    lease.Commit();  // forward changes no parameters or gradients
    // The stash and y are this forward's own tensors: handed over as they are.
    COPSE_RETURN_NOT_OK(ctx.output(0).Write(TensorMessage(std::move(out))));
    if (stage < stages - 1) {
      if (ctx.num_outputs() < 2) return Status::InvalidArgument(ctx.name + ": needs an activation output");
      COPSE_RETURN_NOT_OK(ctx.output(1).Write(SingleTensorMessage(BoundaryTensor(s, range.second, y))));
    }
    COPSE_RETURN_NOT_OK(ctx.CloseOutputs());
    return tp ? tp->group().Finish() : Status::OK();
  }
};

/// Adds one micro-batch's parameter gradients to `m`'s (overwrites them when !accumulate) from
/// what its backward reads: `stash_set` (the forward's stash message, or "x" alone when
/// `recompute`: the forward runs again here with `fc`) and `dy`. Returns dL/dx when need_dx.
/// Used for the micro-batch at hand and to replay a gradient log (gradient_log.h): the same
/// calls in the same order, so a replay gives the same bits.
Result<Tensor> MicroBatchBackward(Sequential& m, const NamedTensors& stash_set, const Tensor& dy, bool recompute,
                                  const ForwardContext& fc, bool need_dx, bool accumulate) {
  if (dy.dim(0) == 0) {  // an empty micro-batch (a short last step): its forward stashed nothing
    if (!accumulate) m.ZeroGrad();
    return need_dx ? Tensor::Zeros({0}) : Tensor();
  }
  Stash stash;
  if (recompute) {
    const Tensor* x = FindTensor(stash_set, "x");
    if (!x) return Status::DataLoss("the stash lacks x");
    COPSE_RETURN_NOT_OK(m.Forward(OnDevice(*x, m.device()), fc, &stash).status());
  } else {
    COPSE_ASSIGN_OR_RETURN(stash, ReadStash(stash_set, m.size(), m.device()));
  }
  return m.Backward(OnDevice(dy, m.device()), stash, need_dx, accumulate);
}

/// Backward of pipeline stage params.stage on one micro-batch. Inputs: 0 params, 1 the stash
/// (from this micro-batch's forward), then dL/dy from the next stage's backward (not on the
/// last stage), then the previous micro-batch's gradient log (not for m = 0). Outputs: 0 the
/// gradient log of micro-batches 0..m (gradient_log.h) to backward m+1 — or, after the last
/// micro-batch, the accumulated gradients to the update/reducer (with params.weight_grads
/// "batched", the log again: see BatchedRun); 1 dL/dx to the previous stage (not on stage 0).
/// With params.step_check (StepCheck) the last micro-batch's dL/dx comes and goes as {"dx",
/// "__check"}, and stage 0's last writes the check to each of its outputs 1.. (every update).
class BackwardProgram final : public VertexProgram {
 public:
  Status Run(VertexContext& ctx) override {
    TraceSpan span(ctx);
    UseThreads(ctx);
    COPSE_ASSIGN_OR_RETURN(const bool batched, BatchedWeightGradients(ctx));
    COPSE_ASSIGN_OR_RETURN(TrainSettings s, SettingsFromParams(ctx));
    COPSE_ASSIGN_OR_RETURN(auto range, LayerRange(ctx, s));
    const int stage = ctx.param<int>("stage", 0), stages = ctx.param<int>("stages", 1);
    const bool recompute = ctx.param<bool>("recompute", false);
    const MicroPos pos = PosOf(ctx);
    if (s.precision == Precision::kFloat16 && stages > 1 && !ctx.param<bool>("step_check", false))
      return Status::InvalidArgument(ctx.name +
                                     ": params.precision fp16 in a pipeline needs params.step_check (its "
                                     "stages must skip overflowed steps together)");
    size_t port = 0;
    COPSE_ASSIGN_OR_RETURN(chan::Buffer params, ReadParams(ctx, port++));
    COPSE_ASSIGN_OR_RETURN(chan::Buffer stash_msg, ReadOne(ctx, port++));
    COPSE_ASSIGN_OR_RETURN(NamedTensors stash_set, ReadTensorMessage(stash_msg));
    const bool step_check = ctx.param<bool>("step_check", false) && pos.m == pos.M - 1;
    if (step_check && (batched || s.tp_ranks > 1))
      return Status::InvalidArgument(ctx.name + ": params.step_check needs per-micro-batch weight gradients of one member");
    Tensor dy;
    StepCheck check;  // of the stages above this one
    if (stage < stages - 1) {
      COPSE_ASSIGN_OR_RETURN(chan::Buffer dy_msg, ReadOne(ctx, port++));
      if (step_check) {
        COPSE_ASSIGN_OR_RETURN(NamedTensors set, ReadTensorMessage(dy_msg));
        const std::string where = ctx.name + ": input " + std::to_string(port - 1);
        COPSE_ASSIGN_OR_RETURN(check, StepCheck::From(set, where));
        const Tensor* dx = FindTensor(set, "dx");
        if (!dx) return Status::DataLoss(where + " carries no \"dx\"");
        dy = *dx;
      } else {
        COPSE_ASSIGN_OR_RETURN(dy, ReadSingleTensor(dy_msg));
      }
      dy = OnDevice(dy, s.device);
    } else {
      const Tensor* t = FindTensor(stash_set, "dy");
      if (!t) return Status::DataLoss(ctx.name + ": the last stage's stash lacks dy");
      dy = OnDevice(*t, s.device);
    }
    std::optional<chan::Buffer> acc_msg;
    NamedTensors log;  // the previous micro-batches' gradient log
    if (pos.m > 0) {
      COPSE_ASSIGN_OR_RETURN(chan::Buffer a, ReadOne(ctx, port++));
      acc_msg = std::move(a);
      COPSE_ASSIGN_OR_RETURN(log, ReadTensorMessage(*acc_msg));
      const std::string input = ctx.name + ": input " + std::to_string(port - 1);
      if (s.tp_ranks == 1) {  // a tensor-parallel member's are the gradients themselves (TensorParallelRun)
        if (!IsGradientLog(log)) return Status::DataLoss(input + " is not a gradient log");
        auto counted = GradientLogEntries(log);
        if (!counted.ok()) return counted.status().WithContext(input);
        if (*counted != static_cast<size_t>(pos.m))
          return Status::DataLoss(input + ": the gradient log has " + std::to_string(*counted) + " entries, expected " +
                                  std::to_string(pos.m));
      }
    }
    std::vector<float> loss = ReadScalars(FindTensor(stash_set, "__loss"), 2);
    if (acc_msg) {
      const auto prev = ReadScalars(FindTensor(log, "__loss"), 2);
      loss[0] += prev[0], loss[1] += prev[1];
    }
    if (s.tp_ranks > 1) {
      return TensorParallelRun(ctx, s, range, stage, recompute, pos, params, stash_set, dy, acc_msg ? &log : nullptr, loss);
    }
    if (batched) {
      return BatchedRun(ctx, s, range, stage, recompute, params, stash_set, dy, log, loss);
    }
    const uint64_t acc_key = acc_msg ? TensorMessageKey(*acc_msg) : 0;
    COPSE_ASSIGN_OR_RETURN(ModelLease lease, LeaseModel(s, range.first, range.second, params, acc_key));
    Sequential& m = lease->model;
    if (!acc_msg) {
      m.FreshGradients();  // overwritten below; the entry's may be a message's
    } else if (lease->grads_key != acc_key) {
      // Not the entry the previous micro-batch left (a re-run, a cold daemon): replay the log.
      lease->grads_key = 0;
      m.FreshGradients();  // the entry's may be a message's
      for (size_t i = 0; i < static_cast<size_t>(pos.m); ++i) {
        if (ctx.cancelled()) return Status::Cancelled(ctx.name + " cancelled");  // a long replay
        const NamedTensors entry = GradientLogEntry(log, i);
        const ForwardContext fc = StepContext(s, pos.step, pos.w * pos.M + static_cast<int>(i));
        const Status st = MicroBatchBackward(m, entry, *FindTensor(entry, "dy"), recompute, fc, false, i > 0).status();
        if (!st.ok()) return st.WithContext(ctx.name + ": replaying gradient log entry " + std::to_string(i));
      }
    }  // else the entry holds exactly the log's sum (it made it) and accumulates on in place
    lease->grads_key = 0;
    const ForwardContext fc = StepContext(s, pos.step, pos.part());
    auto backward = MicroBatchBackward(m, stash_set, dy, recompute, fc, /*need_dx=*/stage > 0,
                                       /*accumulate=*/acc_msg.has_value());
    if (!backward.ok()) return backward.status().WithContext(ctx.name);
    const Tensor dx = std::move(backward).value();
    if (step_check)
      check = StepCheck::Of(m, s.precision == Precision::kFloat16 ? lease->loss_scale : 1.0f, s.clip_norm > 0).And(check);
    NamedTensors out_set;
    if (pos.m == pos.M - 1) {
      out_set = GradientHandles(m);  // no copies: the next step renews them before writing
    } else {
      COPSE_RETURN_NOT_OK(AppendGradientLog(log, stash_set, &dy, out_set));
    }
    out_set.emplace_back("__loss", Scalars(loss));
    const chan::Buffer out = TensorMessage(std::move(out_set));
    lease->grads_key = TensorMessageKey(out);
    lease->grads_loss = loss;
    lease.Commit();
    return WriteOutputs(ctx, s, range.first, stage, out, dx, step_check ? &check : nullptr);
  }

 private:
  /// A member of a tensor-parallel group: the gradients summed over micro-batches 0..m travel
  /// whole to micro-batch m + 1 (`sum_so_far`), not as a gradient log, whose replay on a cold
  /// daemon would need the other members' all-reduces again.
  static Status TensorParallelRun(VertexContext& ctx, const TrainSettings& s, std::pair<int, int> range, int stage,
                                  bool recompute, const MicroPos& pos, const chan::Buffer& params, const NamedTensors& stash_set,
                                  const Tensor& dy, const NamedTensors* sum_so_far, const std::vector<float>& loss) {
    COPSE_ASSIGN_OR_RETURN(ModelLease lease, LeaseModel(s, range.first, range.second, params));
    Sequential& m = lease->model;
    COPSE_ASSIGN_OR_RETURN(auto tp, TensorParallelScope::Open(ctx, s.tp_rank, s.tp_ranks, m));
    m.FreshGradients();  // the entry's may be a message's
    if (sum_so_far) COPSE_RETURN_NOT_OK(m.ImportGradients(*sum_so_far).WithContext(ctx.name));
    const ForwardContext fc = StepContext(s, pos.step, pos.part());
    auto backward = MicroBatchBackward(m, stash_set, dy, recompute, fc, /*need_dx=*/stage > 0, sum_so_far != nullptr);
    if (!backward.ok()) return backward.status().WithContext(ctx.name);
    NamedTensors out_set = GradientHandles(m);  // the next micro-batch renews them before writing
    out_set.emplace_back("__loss", Scalars(loss));
    lease->grads_key = 0;
    lease.Commit();
    COPSE_RETURN_NOT_OK(WriteOutputs(ctx, s, range.first, stage, TensorMessage(std::move(out_set)), *backward));
    return tp->group().Finish();
  }

  /// params.weight_grads "batched": dL/dx only (Sequential::BackwardInputs); the weight
  /// gradients of every micro-batch are computed together by the update, from the gradient log
  /// this backward extends with its stash, dy and each layer's weight-gradient part ("w<i>").
  /// Nothing accumulates in the cached model, so a re-run anywhere needs only its inputs.
  static Status BatchedRun(VertexContext& ctx, const TrainSettings& s, std::pair<int, int> range, int stage, bool recompute,
                           const chan::Buffer& params, const NamedTensors& stash_set, const Tensor& dy, const NamedTensors& log,
                           const std::vector<float>& loss) {
    if (recompute)
      return Status::InvalidArgument(ctx.name + ": params.weight_grads \"batched\" needs stashed activations, not recompute");
    COPSE_ASSIGN_OR_RETURN(ModelLease lease, LeaseModel(s, range.first, range.second, params));
    const Sequential& m = lease->model;
    if (!m.DefersWeightGradients())
      return Status::InvalidArgument(
          ctx.name + ": params.weight_grads \"batched\" needs layers that can defer their weight gradients, not " + m.Describe());
    std::vector<Tensor> wgrads;
    Tensor dx;
    if (dy.dim(0) > 0) {  // else an empty micro-batch, whose forward stashed nothing
      COPSE_ASSIGN_OR_RETURN(Stash stash, ReadStash(stash_set, m.size(), m.device()));
      auto r = m.BackwardInputs(dy, stash, /*need_input_grad=*/stage > 0, &wgrads);
      if (!r.ok()) return r.status().WithContext(ctx.name);
      dx = std::move(r).value();
    } else if (stage > 0) {
      dx = Tensor::Zeros({0});
    }
    lease.Commit();  // parameters and gradients untouched
    NamedTensors entry = stash_set;
    for (size_t l = 0; l < wgrads.size(); ++l)
      if (wgrads[l].defined()) entry.emplace_back("w" + std::to_string(l), wgrads[l]);
    NamedTensors out_set;
    COPSE_RETURN_NOT_OK(AppendGradientLog(log, entry, &dy, out_set));
    out_set.emplace_back("__loss", Scalars(loss));
    return WriteOutputs(ctx, s, range.first, stage, TensorMessage(std::move(out_set)), dx);
  }

  /// Output 0 the log or gradients, output 1 dL/dx (not on stage 0, whose first layer is `first`);
  /// with a step `check`, dL/dx goes with it, and stage 0 sends it to each of its outputs 1...
  static Status WriteOutputs(VertexContext& ctx, const TrainSettings& s, int first, int stage, const chan::Buffer& out,
                             const Tensor& dx, const StepCheck* check = nullptr) {
    COPSE_RETURN_NOT_OK(ctx.output(0).Write(out));
    if (stage > 0) {
      if (ctx.num_outputs() < 2) return Status::InvalidArgument(ctx.name + ": needs a gradient output");
      const Tensor boundary = BoundaryTensor(s, first, dx);
      COPSE_RETURN_NOT_OK(ctx.output(1).Write(check ? TensorMessage({{"dx", boundary}, {"__check", check->AsTensor()}})
                                                    : SingleTensorMessage(boundary)));
    } else if (check) {
      if (ctx.num_outputs() < 2) return Status::InvalidArgument(ctx.name + ": params.step_check needs an output to each update");
      const chan::Buffer verdict = TensorMessage({{"__check", check->AsTensor()}});
      for (size_t k = 1; k < ctx.num_outputs(); ++k) COPSE_RETURN_NOT_OK(ctx.output(k).Write(verdict));
    }
    return ctx.CloseOutputs();
  }
};

/// Test accuracy of the whole model. Input 0: init's clock (when params.clock), then the
/// chain of every stage's last update, in stage order. Output 0: metrics.json; output 1: all
/// parameters as one tensor set (params.bin, bit-identical across recoveries).
class EvalProgram final : public VertexProgram {
 public:
  Status Run(VertexContext& ctx) override {
    TraceSpan span(ctx);
    const int64_t eval_start = WallMicros();
    UseThreads(ctx);
    COPSE_ASSIGN_OR_RETURN(TrainSettings s, SettingsFromParams(ctx));
    size_t port = 0;
    int64_t t0 = 0;
    if (ctx.param<bool>("clock", false)) {
      COPSE_ASSIGN_OR_RETURN(chan::Buffer c, ReadOne(ctx, port++));
      t0 = std::stoll(std::string(c.view()));
    }
    // One parameter set per chain: a stage's, or with tensor parallelism (params.tensor_parallel
    // R > 1) R consecutive chains per stage, its members' shards in rank order.
    const size_t tp = static_cast<size_t>(std::max(1, ctx.param<int>("tensor_parallel", 1)));
    std::vector<NamedTensors> sets;
    std::vector<float> stats(4, 0.0f);
    for (; port < ctx.num_inputs(); ++port) {
      COPSE_ASSIGN_OR_RETURN(auto chain, ReadAll(ctx, port));
      if (chain.size() != 3) return Status::DataLoss(ctx.name + ": a chain input needs params, state, stats");
      COPSE_ASSIGN_OR_RETURN(NamedTensors p, ReadTensorMessage(chain[0]));
      sets.push_back(std::move(p));
      COPSE_ASSIGN_OR_RETURN(NamedTensors st, ReadTensorMessage(chain[2]));
      const auto sv = ReadScalars(FindTensor(st, "__stats"), 4);
      if (sv[1] > 0) stats = sv;  // the stage that computes the loss
    }
    if (sets.size() % tp != 0)
      return Status::DataLoss(ctx.name + ": " + std::to_string(sets.size()) + " chains for stages of " + std::to_string(tp) +
                              " tensor-parallel members");
    NamedTensors all;
    for (size_t i = 0; i < sets.size(); i += tp) {
      NamedTensors stage;
      if (tp > 1) {
        COPSE_ASSIGN_OR_RETURN(stage,
                               UnshardParameters(std::vector<NamedTensors>(sets.begin() + static_cast<ptrdiff_t>(i),
                                                                           sets.begin() + static_cast<ptrdiff_t>(i + tp))));
      } else {
        stage = std::move(sets[i]);
      }
      for (auto& kv : stage) all.push_back(std::move(kv));
    }
    COPSE_ASSIGN_OR_RETURN(Sequential model, BuildModelLayers(s.model));  // every parameter is imported
    COPSE_RETURN_NOT_OK(model.ImportParameters(all));
    const NamedTensors params = model.ExportParameters();
    const std::string digest = Digest(params);
    COPSE_ASSIGN_OR_RETURN(auto test, CachedDataset(s.model, s.data_dir, Split::kTest, s.test_limit));
    const int64_t train_images = ctx.param<int64_t>("train_images", static_cast<int64_t>(stats[3]));
    const double seconds = t0 > 0 ? (eval_start - t0) / 1e6 : 0.0;
    const double final_loss = stats[1] > 0 ? stats[0] / stats[1] : 0.0;
    nlohmann::json metrics = {
        {"train_seconds", seconds},
        {"final_loss", final_loss},
        {"parameters", model.NumParameters()},
        {"parameter_digest", digest},
    };
    if (IsLanguageModel(s.model)) {  // text: validation loss, tokens
      COPSE_ASSIGN_OR_RETURN(double validation_loss, EvaluateLoss(model, *test));
      // params.train_images counts windows; the chains' statistics count tokens already.
      const int64_t tokens = ctx.params && ctx.params->contains("train_images") ? train_images * s.labels_per_example
                                                                                : static_cast<int64_t>(stats[3]);
      const double rate = seconds > 0 ? tokens / seconds : 0.0;
      metrics["validation_loss"] = validation_loss;
      metrics["perplexity"] = std::exp(validation_loss);
      metrics["tokens_per_s"] = rate;
      metrics["train_tokens"] = tokens;
      metrics["validation_tokens"] = test->size() * s.labels_per_example;
      ctx.progress = {{"final", true}, {"validation_loss", validation_loss}, {"perplexity", std::exp(validation_loss)}};
      if (seconds > 0) ctx.progress["tokens_per_s"] = rate;
      const auto spec = ParseGptSpec(s.model);
      auto sample = GenerateText(model, spec->context, "\n", 200, 0.8f, s.seed);
      if (sample.ok()) metrics["sample"] = *sample;
      ctx.log().info("validation loss {:.4f} (perplexity {:.2f}) on {} tokens; final loss {:.4f}; {:.0f} training tokens/s",
                     validation_loss, std::exp(validation_loss), test->size() * s.labels_per_example, final_loss, rate);
      if (sample.ok()) ctx.log().info("sample: {}", *sample);
    } else {
      COPSE_ASSIGN_OR_RETURN(double accuracy, Evaluate(model, *test));
      metrics["test_accuracy"] = accuracy;
      metrics["images_per_s"] = seconds > 0 ? train_images / seconds : 0.0;
      metrics["train_images"] = train_images;
      metrics["test_images"] = test->size();
      // The job's results, for every status of it (copse status, submit --wait), not only for
      // those who copy metrics.json.
      ctx.progress = {{"final", true}, {"test_accuracy", accuracy}};
      if (seconds > 0) ctx.progress["images_per_s"] = train_images / seconds;
      // What `copse logs JOB VERTEX` shows of it.
      ctx.log().info("test accuracy {:.2f} % on {} images; final loss {:.4f}; {:.0f} training images/s", 100 * accuracy,
                     test->size(), final_loss, seconds > 0 ? train_images / seconds : 0.0);
    }
    if (ctx.params && ctx.params->contains("config")) metrics["config"] = (*ctx.params)["config"];
    COPSE_RETURN_NOT_OK(
        ctx.output(0).Write(chan::Buffer(metrics.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n")));
    if (ctx.num_outputs() > 1) COPSE_RETURN_NOT_OK(ctx.output(1).Write(chan::Buffer(SerializeTensors(params))));
    return ctx.CloseOutputs();
  }
};

/// Writes the chain on input 0 (params, optimizer state) to params.path (relative to the job
/// file; "{replica}" is replaced by the job manager) as two length-prefixed tensor sets,
/// atomically (temporary file, then rename). A re-run writes the same bytes.
class CheckpointProgram final : public VertexProgram {
 public:
  Status Run(VertexContext& ctx) override {
    TraceSpan span(ctx);
    const std::string path_param = ctx.param<std::string>("path", "");
    if (path_param.empty()) return Status::InvalidArgument(ctx.name + ": params.path is required");
    const std::filesystem::path path = ctx.ResolvePath(path_param);
    COPSE_ASSIGN_OR_RETURN(auto chain, ReadAll(ctx, 0));
    std::error_code ec;
    std::filesystem::create_directories(path.parent_path(), ec);
    const std::filesystem::path tmp = path.string() + ".tmp-" + std::to_string(ctx.version);
    {
      std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
      for (const auto& m : chain) {
        const uint64_t n = m.size();
        f.write(reinterpret_cast<const char*>(&n), 8);
        f.write(m.data(), static_cast<std::streamsize>(n));
      }
      if (!f) return Status::IOError(ctx.name + ": cannot write " + tmp.string());
    }
    std::filesystem::rename(tmp, path, ec);
    if (ec) return Status::IOError(ctx.name + ": cannot rename to " + path.string() + ": " + ec.message());
    return ctx.CloseOutputs();
  }
};

}  // namespace
}  // namespace programs

void RegisterMlPrograms(vertex::ProgramRegistry& registry) {
  using namespace programs;
  auto add = [&](const char* name, vertex::ProgramFactory f) { (void)registry.Register(name, std::move(f)); };
  add("ml.init", [] { return std::make_unique<InitProgram>(); });
  add("ml.load", [] { return std::make_unique<LoadProgram>(); });
  add("ml.grad", [] { return std::make_unique<GradProgram>(); });
  add("ml.forward", [] { return std::make_unique<ForwardProgram>(); });
  add("ml.backward", [] { return std::make_unique<BackwardProgram>(); });
  add("ml.reduce", [] { return std::make_unique<ReduceProgram>(); });
  add("ml.ring_reduce", [] { return std::make_unique<RingReduceProgram>(); });
  add("ml.allreduce", [] { return MakeAllReduceProgram(); });
  add("ml.tp_step", [] { return MakeTensorParallelStepProgram(); });
  add("ml.update", [] { return std::make_unique<UpdateProgram>(); });
  add("ml.ps", [] { return std::make_unique<UpdateProgram>(); });
  add("ml.eval", [] { return std::make_unique<EvalProgram>(); });
  add("ml.checkpoint", [] { return std::make_unique<CheckpointProgram>(); });
  RegisterProfilePrograms(registry);
}

}  // namespace copse::ml
