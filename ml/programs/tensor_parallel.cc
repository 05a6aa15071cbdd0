// ml.tp_step: one training step of member params.tp_rank of a tensor-parallel group of
// params.tensor_parallel members (ml/transformer.h: each member holds a shard of every block).
// One vertex per member and step; a step's members form a gang joined by live channels (shm on
// one daemon, stream across daemons), every member to every other, over which each block's two
// all-reduces run: a member writes its partial [B, T, D] to each peer and adds every member's
// part in rank order, so all get the same bits.
//
// Ports: input 0, the member's chain (params, optimizer state, stats) from ml.init or its
// previous step; inputs 1..R-1, the other members' partials, one channel from each in rank
// order (itself skipped). Output 0, its chain after the step (to its next step, or eval);
// outputs 1..R-1, its partials to each other member in rank order. Every member trains on the
// whole global batch of step params.first_step + replica; the figures come from member 0.
#include "ml/programs/tensor_parallel.h"

#include <algorithm>
#include <cmath>

#include "ml/loss.h"
#include "ml/models.h"
#include "ml/optimizer.h"
#include "ml/philox.h"
#include "ml/programs/support.h"
#include "ml/tensor_message.h"
#include "ml/transformer.h"

namespace copse::ml::programs {

Result<Tensor> LiveChannelGroup::AllReduceSum(const Tensor& partial) {
  const chan::Buffer mine = SingleTensorMessage(partial);
  for (int k = 0; k + 1 < size_; ++k) COPSE_RETURN_NOT_OK(ctx_.output(first_output_ + static_cast<size_t>(k)).Write(mine));
  std::vector<Tensor> parts(static_cast<size_t>(size_));
  parts[static_cast<size_t>(rank_)] = partial;
  for (int k = 0; k + 1 < size_; ++k) {
    const int peer = k < rank_ ? k : k + 1;
    COPSE_ASSIGN_OR_RETURN(auto msg, ctx_.input(first_input_ + static_cast<size_t>(k)).Next());
    if (!msg) return Status::DataLoss(ctx_.name + ": tensor-parallel member " + std::to_string(peer) + " ended early");
    COPSE_ASSIGN_OR_RETURN(Tensor t, ReadSingleTensor(*msg));
    t = OnDevice(t, partial.device());  // a GPU member's partial comes through host memory
    if (t.shape() != partial.shape() || t.dtype() != partial.dtype())
      return Status::DataLoss(ctx_.name + ": member " + std::to_string(peer) + " sent a " + DTypeName(t.dtype()) +
                              " partial of shape " + ShapeToString(t.shape()) + ", expected " + DTypeName(partial.dtype()) +
                              ShapeToString(partial.shape()));
    parts[static_cast<size_t>(peer)] = t;
  }
  Tensor sum = parts[0].Clone();
  for (size_t r = 1; r < parts.size(); ++r)
    sum.device()->Axpy(1.0f, parts[r].data(), static_cast<size_t>(sum.numel()), sum.data());
  return sum;
}

Status LiveChannelGroup::Finish() {
  for (int k = 0; k + 1 < size_; ++k) {
    while (true) {
      COPSE_ASSIGN_OR_RETURN(auto m, ctx_.input(first_input_ + static_cast<size_t>(k)).Next());
      if (!m) break;
    }
  }
  return Status::OK();
}

Result<std::unique_ptr<TensorParallelScope>> TensorParallelScope::Open(vertex::VertexContext& ctx, int rank, int ranks,
                                                                       const Sequential& model) {
  if (ranks <= 1) return std::unique_ptr<TensorParallelScope>();
  const size_t live = static_cast<size_t>(ranks - 1);
  if (ctx.num_inputs() <= live || ctx.num_outputs() <= live)
    return Status::InvalidArgument(ctx.name + ": a member of a tensor-parallel group of " + std::to_string(ranks) +
                                   " needs its last " + std::to_string(live) +
                                   " inputs and outputs to be live channels to the other members");
  return std::unique_ptr<TensorParallelScope>(
      new TensorParallelScope(ctx, rank, ranks, model, ctx.num_inputs() - live, ctx.num_outputs() - live));
}

namespace {

/// ClipGradNorm over the whole model the members hold together: the squares of the sharded
/// gradients summed over the group (one scalar all-reduce), those of the replicated ones (the
/// same on every member) once.
Status ClipOverMembers(const Sequential& model, TensorParallelGroup& group, double max_norm) {
  const auto names = model.ParameterNames();
  const auto params = model.Parameters();
  double sharded = 0, replicated = 0;
  for (size_t i = 0; i < params.size(); ++i) {
    const Tensor& g = params[i]->grad;
    (IsShardedParameter(names[i]) ? sharded : replicated) += g.device()->SumSquares(g.data(), static_cast<size_t>(g.numel()));
  }
  // A float carries the partial sum: every member adds the same floats in rank order.
  COPSE_ASSIGN_OR_RETURN(Tensor total, group.AllReduceSum(Tensor::FromVector({1}, {static_cast<float>(sharded)})));
  ClipGradsToNorm(params, std::sqrt(static_cast<double>(total.ToVector()[0]) + replicated), max_norm);
  return Status::OK();
}

/// fp16: whether every member's gradients are finite (a count of members with a non-finite one,
/// all-reduced), so that all of them skip a step together.
Result<bool> FiniteOverMembers(const Sequential& model, TensorParallelGroup& group) {
  const bool mine = GradientsFinite(model.Parameters());
  COPSE_ASSIGN_OR_RETURN(Tensor overflowed, group.AllReduceSum(Tensor::FromVector({1}, {mine ? 0.0f : 1.0f})));
  return overflowed.ToVector()[0] == 0.0f;
}

class TensorParallelStepProgram final : public vertex::VertexProgram {
 public:
  Status Run(vertex::VertexContext& ctx) override {
    TraceSpan span(ctx);
    SetCpuThreads(static_cast<int>(std::max(1u, ctx.threads)));
    COPSE_ASSIGN_OR_RETURN(TrainSettings s, SettingsFromParams(ctx));
    const int ranks = s.tp_ranks, rank = s.tp_rank;
    if (ctx.num_inputs() != static_cast<size_t>(ranks) || ctx.num_outputs() != static_cast<size_t>(ranks))
      return Status::InvalidArgument(ctx.name + ": a member of " + std::to_string(ranks) + " needs " + std::to_string(ranks) +
                                     " inputs and outputs (its chain, and a live channel from and to each other member), has " +
                                     std::to_string(ctx.num_inputs()) + " and " + std::to_string(ctx.num_outputs()));
    COPSE_ASSIGN_OR_RETURN(auto chain, ReadAll(ctx, 0));
    if (chain.size() != 3) return Status::DataLoss(ctx.name + ": input 0 needs a chain (params, state, stats)");
    COPSE_ASSIGN_OR_RETURN(Sequential model, BuildModelShardLayers(s.model, rank, ranks));
    model.To(s.device);  // params.device: the member's shard, optimizer state and batch live there
    COPSE_ASSIGN_OR_RETURN(NamedTensors params, ReadTensorMessage(chain[0]));
    COPSE_RETURN_NOT_OK(model.ImportParameters(params).WithContext(ctx.name));
    std::unique_ptr<Optimizer> opt = MakeOptimizer(s, model);
    COPSE_ASSIGN_OR_RETURN(NamedTensors state, ReadTensorMessage(chain[1]));
    if (!state.empty()) COPSE_RETURN_NOT_OK(opt->ImportState(state).WithContext(ctx.name));
    COPSE_ASSIGN_OR_RETURN(NamedTensors stats_set, ReadTensorMessage(chain[2]));
    std::vector<float> stats = ReadScalars(FindTensor(stats_set, "__stats"), 4);

    const int64_t step = ctx.param<int64_t>("first_step", 0) + ctx.replica;
    COPSE_ASSIGN_OR_RETURN(auto train, CachedDataset(s.model, s.data_dir, Split::kTrain, s.limit));
    int64_t batch_rows = 0;
    COPSE_ASSIGN_OR_RETURN(auto idx, StepIndices(s, step, 0, 1, &batch_rows));
    const Batch b = train->Gather(idx, s.device);
    LiveChannelGroup group(ctx, rank, ranks, 1, 1);
    model.SetTensorParallelGroup(&group);
    const auto [epoch, k] = EpochAndStep(s, step);
    ForwardContext fc{true, MixSeed(s.seed, static_cast<uint64_t>(epoch), static_cast<uint64_t>(k))};
    fc.precision = s.precision;
    Stash stash;
    COPSE_ASSIGN_OR_RETURN(Tensor logits, model.Forward(b.images, fc, &stash));
    COPSE_ASSIGN_OR_RETURN(LossOutput loss, CrossEntropyLoss(logits, b.labels, batch_rows));
    const bool fp16 = s.precision == Precision::kFloat16;
    LossScale scale = LossScaleIn(stats_set, s.initial_loss_scale);
    if (fp16) ScaleLossGradient(loss.grad, scale);
    COPSE_RETURN_NOT_OK(model.Backward(loss.grad, stash, /*need_input_grad=*/false, /*accumulate=*/false).status());
    bool finite = true;
    if (fp16) {
      COPSE_ASSIGN_OR_RETURN(finite, FiniteOverMembers(model, group));
      if (finite) UnscaleGradients(model.Parameters(), scale);
      scale = scale.Next(finite);
    }
    if (finite) {  // else fp16 overflowed in some member: all of them skip the step
      if (s.clip_norm > 0) COPSE_RETURN_NOT_OK(ClipOverMembers(model, group, s.clip_norm));
      opt->set_lr(StepLr(s, step, ctx.param<int64_t>("steps", 0)));
      opt->Step();
    }

    AddToStats(s, step, {static_cast<float>(loss.loss * static_cast<double>(b.size())), static_cast<float>(b.size())}, stats);
    if (rank == 0) {
      ctx.progress = StepProgress(s, step, ctx.param<int64_t>("steps", 0), stats);
      if (fp16) ctx.progress["loss_scale"] = scale.scale, ctx.progress["step_skipped"] = !finite;
    }
    NamedTensors stats_out = {{"__stats", Scalars(stats)}};
    if (fp16) stats_out.emplace_back("__loss_scale", Scalars({scale.scale, static_cast<float>(scale.good_steps)}));
    COPSE_RETURN_NOT_OK(ctx.output(0).Write(TensorMessage(model.ExportParameters())));
    COPSE_RETURN_NOT_OK(ctx.output(0).Write(TensorMessage(opt->ExportState())));
    COPSE_RETURN_NOT_OK(ctx.output(0).Write(TensorMessage(std::move(stats_out))));
    COPSE_RETURN_NOT_OK(ctx.CloseOutputs());
    return group.Finish();
  }
};

}  // namespace

std::unique_ptr<vertex::VertexProgram> MakeTensorParallelStepProgram() { return std::make_unique<TensorParallelStepProgram>(); }

}  // namespace copse::ml::programs
