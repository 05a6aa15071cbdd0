#include "ml/layer_profile.h"

#include <algorithm>
#include <chrono>
#include <functional>

#include <fmt/format.h>

#include "ml/models.h"
#include "ml/optimizer.h"
#include "ml/transformer.h"

namespace copse::ml {
namespace {

/// The median time of `repeats` calls of `body`, after one warm-up call.
Result<double> Time(int repeats, const std::function<Status()>& body) {
  COPSE_RETURN_NOT_OK(body());
  std::vector<double> times;
  for (int i = 0; i < repeats; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    COPSE_RETURN_NOT_OK(body());
    times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return Median(std::move(times));
}

int64_t StashBytes(const LayerStash& stash) {
  int64_t bytes = 0;
  for (const Tensor& t : stash.tensors) bytes += static_cast<int64_t>(t.bytes());
  return bytes;
}

/// A batch of `b` examples the model takes: images [b, 1, 28, 28], or for a gpt model token ids
/// [b, context] (a letter, repeated: the passes' cost does not depend on which).
Result<Tensor> ModelInput(const std::string& model, int64_t b) {
  if (!IsLanguageModel(model)) return Tensor::Full({b, 1, 28, 28}, 0.5f);
  COPSE_ASSIGN_OR_RETURN(const GptSpec spec, ParseGptSpec(model));
  return Tensor::Full({b, spec.context}, 101.0f);
}

/// Scales the layers' times at micro-batch size `b` so that they add up to the whole model's
/// forward and backward timed as one vertex runs them, layer after layer: a layer timed alone
/// finds its weights and input in the cache, which in a real pass the layers before it evicted.
Status ScaleToWholeModel(const std::string& name, const Sequential& model, int64_t b, int repeats,
                         std::vector<LayerCost>& layers) {
  COPSE_ASSIGN_OR_RETURN(const Tensor x, ModelInput(name, b));
  Stash stash;
  Tensor y;
  ForwardContext ctx;
  COPSE_ASSIGN_OR_RETURN(const double forward, Time(repeats, [&]() -> Status {
                           stash = Stash();
                           COPSE_ASSIGN_OR_RETURN(y, model.Forward(x, ctx, &stash));
                           return Status::OK();
                         }));
  const Tensor dy = Tensor::Full(y.shape(), 1e-3f);
  COPSE_ASSIGN_OR_RETURN(const double backward, Time(repeats, [&]() -> Status {
                           return model.Backward(dy, stash, /*need_input_grad=*/false, /*accumulate=*/false).status();
                         }));
  double forward_sum = 0, backward_sum = 0;
  bool first = true;  // the first layer with parameters computes no dL/dx, and none before it runs
  for (const LayerCost& l : layers) {
    const LayerTimes& t = l.at.at(b);
    forward_sum += t.forward;
    if (l.parameters > 0 || !first) backward_sum += first ? t.backward_first : t.backward;
    if (l.parameters > 0) first = false;
  }
  const double f = forward_sum > 0 ? forward / forward_sum : 1, g = backward_sum > 0 ? backward / backward_sum : 1;
  for (LayerCost& l : layers) {
    LayerTimes& t = l.at[b];
    t.forward *= f;
    for (double* v : {&t.backward, &t.backward_input, &t.weight_grad, &t.backward_first, &t.backward_input_first}) *v *= g;
  }
  return Status::OK();
}

/// Every layer of `model` (named `name`, for its input) at every size, scaled to the whole
/// model's passes.
Result<std::vector<LayerCost>> MeasureLayers(const std::string& name, Sequential& model, const ProfileOptions& o) {
  std::vector<LayerCost> layers(model.size());
  for (size_t i = 0; i < model.size(); ++i) {
    Layer& layer = model.layer(i);
    layers[i].name = layer.Describe();
    for (const Parameter& p : layer.parameters()) layers[i].parameters += p.value.numel();
    layers[i].defers_weight_gradients = layer.DefersWeightGradients();
  }
  ForwardContext ctx;
  for (const int64_t b : o.microbatch_sizes) {
    if (b < 1) return Status::InvalidArgument(fmt::format("microbatch_sizes: {} is not a size", b));
    COPSE_ASSIGN_OR_RETURN(Tensor x, ModelInput(name, b));
    for (size_t i = 0; i < model.size(); ++i) {
      Layer& layer = model.layer(i);
      LayerCost& cost = layers[i];
      LayerTimes& t = cost.at[b];
      LayerStash stash;
      Tensor y;
      COPSE_ASSIGN_OR_RETURN(t.forward, Time(o.repeats, [&]() -> Status {
                               stash = LayerStash();
                               COPSE_ASSIGN_OR_RETURN(y, layer.Forward(x, ctx, &stash));
                               return Status::OK();
                             }));
      cost.out_bytes_per_sample = static_cast<int64_t>(y.bytes()) / b;
      cost.stash_bytes_per_sample = StashBytes(stash) / b;
      const Tensor dy = Tensor::Full(y.shape(), 1e-3f);
      auto backward = [&](bool need_dx) {
        return Time(o.repeats, [&]() -> Status { return layer.Backward(dy, stash, need_dx, /*accumulate=*/false).status(); });
      };
      COPSE_ASSIGN_OR_RETURN(t.backward, backward(true));
      COPSE_ASSIGN_OR_RETURN(t.backward_first, backward(false));
      if (cost.defers_weight_gradients) {
        Tensor wgrad;
        auto backward_input = [&](bool need_dx) {
          return Time(o.repeats, [&]() -> Status { return layer.BackwardInput(dy, stash, need_dx, &wgrad).status(); });
        };
        COPSE_ASSIGN_OR_RETURN(t.backward_input_first, backward_input(false));
        COPSE_ASSIGN_OR_RETURN(t.backward_input, backward_input(true));
        if (cost.parameters > 0) {
          COPSE_ASSIGN_OR_RETURN(t.weight_grad, Time(o.repeats, [&] { return layer.WeightGradients({{&stash, &wgrad}}); }));
        }
      } else {
        // Its backward cannot leave the weight gradients out.
        t.backward_input = t.backward;
        t.backward_input_first = t.backward_first;
      }
      x = y;
    }
    COPSE_RETURN_NOT_OK(ScaleToWholeModel(name, model, b, o.repeats, layers));
  }
  return layers;
}

/// A tensor-parallel group for timing one member alone: its all-reduce returns the partial sum
/// as it is (what the real one costs is calibrated with the rest of a member's step).
class TimingGroup final : public TensorParallelGroup {
 public:
  explicit TimingGroup(int size) : size_(size) {}
  int rank() const override { return 0; }
  int size() const override { return size_; }
  Result<Tensor> AllReduceSum(const Tensor& partial) override { return partial; }

 private:
  int size_;
};

}  // namespace

Result<CostTable> ProfileModel(const ProfileOptions& o) {
  if (o.microbatch_sizes.empty()) return Status::InvalidArgument("microbatch_sizes: expected at least one size");
  if (o.repeats < 1) return Status::InvalidArgument("repeats: expected at least 1");
  COPSE_ASSIGN_OR_RETURN(Sequential model, BuildModel(o.model, o.seed));
  CostTable table;
  table.model = o.model;
  table.optimizer = o.optimizer;
  COPSE_ASSIGN_OR_RETURN(table.layers, MeasureLayers(o.model, model, o));
  // Tensor-parallel shards: member 0 of each group size, its all-reduces left out.
  for (const int ranks : o.tensor_parallel) {
    COPSE_ASSIGN_OR_RETURN(Sequential shard, BuildModelShard(o.model, o.seed, 0, ranks));
    TimingGroup group(ranks);
    shard.SetTensorParallelGroup(&group);
    auto layers = MeasureLayers(o.model, shard, o);
    shard.SetTensorParallelGroup(nullptr);
    if (!layers.ok()) return layers.status();
    table.shards[ranks] = std::move(*layers);
  }
  // One optimizer step over every parameter, per element, as ml.update takes it: SGD out of
  // place (new tensors for the values and the momentum) from one gradient and from two.
  const int64_t parameters = model.NumParameters();
  if (parameters > 0) {
    model.ZeroGrad();
    // Two gradients in separate buffers, as a parameter server's inputs are.
    std::vector<Tensor> second;
    std::vector<std::vector<const float*>> one, two;
    for (Parameter* p : model.Parameters()) {
      second.push_back(Tensor::Full(p->grad.shape(), 1e-3f));
      one.push_back({p->grad.data()});
      two.push_back({p->grad.data(), second.back().data()});
    }
    if (o.optimizer == "adam" || o.optimizer == "adamw") {
      Adam adam(model.Parameters(), AdamOptions());
      COPSE_ASSIGN_OR_RETURN(const double step, Time(o.repeats, [&] {
                               adam.Step();
                               return Status::OK();
                             }));
      table.optimizer_per_parameter = step / static_cast<double>(parameters);
    }
    SgdOptions options;
    options.momentum = 0.9f;
    Sgd sgd(model.Parameters(), options);
    auto sgd_step = [&](const std::vector<std::vector<const float*>>& grads) {
      return Time(o.repeats, [&] {
        sgd.StepOutOfPlace(grads);
        return Status::OK();
      });
    };
    COPSE_ASSIGN_OR_RETURN(const double from_one, sgd_step(one));
    COPSE_ASSIGN_OR_RETURN(const double from_two, sgd_step(two));
    if (table.optimizer_per_parameter == 0) table.optimizer_per_parameter = from_one / static_cast<double>(parameters);
    table.gradient_sum_per_parameter = std::max(0.0, from_two - from_one) / static_cast<double>(parameters);
  }
  return table;
}

}  // namespace copse::ml
