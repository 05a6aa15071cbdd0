#pragma once
// Sequential: an ordered list of layers, the model type of copse::ml. It can be cut at layer
// boundaries into pipeline stages with Slice(begin, end); a slice shares the layer objects (and
// so the parameters) with the model it came from, and its layers keep their global indices, so
// parameter names ("3.weight") and initialization are the same whichever stage holds them.
//
//   Sequential model = *BuildModel("mlp", /*seed=*/1);
//   Sequential stage0 = model.Slice(0, 3), stage1 = model.Slice(3, model.size());
//   Stash s0, s1;
//   Tensor h = *stage0.Forward(x, ctx, &s0);
//   Tensor logits = *stage1.Forward(h, ctx, &s1);
//   ... loss ... Tensor dh = *stage1.Backward(dlogits, s1, /*need_input_grad=*/true);
//   stage0.Backward(dh, s0, false);
//
// Thread-safety: as Layer (forward passes may run concurrently; backward and updates not).
#include <memory>
#include <string>
#include <vector>

#include "ml/layers.h"

namespace copse::ml {

/// Per-layer stashes of one forward pass of a Sequential (one micro-batch).
struct Stash {
  std::vector<LayerStash> layers;
};

class Sequential {
 public:
  Sequential() = default;

  /// Appends a layer; its global index becomes the number of layers before it.
  void Add(std::shared_ptr<Layer> layer);
  size_t size() const { return layers_.size(); }
  Layer& layer(size_t i) const { return *layers_[i]; }
  /// Layers [begin, end), sharing parameters with this model; indices keep their global value.
  Sequential Slice(size_t begin, size_t end) const;

  /// Gives every tensor-parallel layer its group (Layer::SetTensorParallelGroup).
  void SetTensorParallelGroup(TensorParallelGroup* group) const;
  /// Gives every layer `casts` for its bfloat16 weight copies (Layer::SetWeightCasts).
  void SetWeightCasts(WeightCasts* casts) const;
  /// Initializes every layer from (seed, its global index).
  void InitParameters(uint64_t seed);
  /// Moves parameters and gradients to `device`; inputs must then live there too.
  void To(Device* device);
  Device* device() const { return device_; }

  /// x and the dy of the backward passes are float32, or bfloat16 where a pipeline stage
  /// boundary carries them so (widened where the layer at hand needs float32).
  Result<Tensor> Forward(const Tensor& x, const ForwardContext& ctx, Stash* stash) const;
  /// Inference forward (no stash, training = false).
  Result<Tensor> Predict(const Tensor& x) const;
  /// Accumulates parameter gradients; returns dL/dinput when need_input_grad (first stages of
  /// a model pass false and skip that product). With accumulate = false the gradients are
  /// overwritten instead (same result as ZeroGrad() first, without the extra pass).
  Result<Tensor> Backward(const Tensor& dy, const Stash& stash, bool need_input_grad, bool accumulate = true) const;

  /// Whether every layer can defer its weight gradients (Layer::DefersWeightGradients).
  bool DefersWeightGradients() const;
  /// Backward without parameter gradients (Layer::BackwardInput): returns dL/dinput when
  /// need_input_grad and sets `wgrads` to each layer's part for WeightGradients.
  Result<Tensor> BackwardInputs(const Tensor& dy, const Stash& stash, bool need_input_grad, std::vector<Tensor>* wgrads) const;
  /// Overwrites every parameter gradient with the sum over micro-batches of what Backward would
  /// have accumulated, from each micro-batch's stash and BackwardInputs parts, in one product per
  /// layer. Gives every parameter a fresh gradient tensor first (see FreshGradients).
  Status WeightGradients(const std::vector<const Stash*>& stashes, const std::vector<const std::vector<Tensor>*>& wgrads) const;

  /// Every parameter in layer order, named "<global layer index>.<name>".
  std::vector<Parameter*> Parameters() const;
  std::vector<std::string> ParameterNames() const;
  int64_t NumParameters() const;
  void ZeroGrad() const;

  /// Copies of the parameter values, named as in Parameters() (host copies if `host`).
  NamedTensors ExportParameters(bool host = true) const;
  NamedTensors ExportGradients(bool host = true) const;
  /// Overwrites values from `params`: every parameter must be present with the right shape.
  Status ImportParameters(const NamedTensors& params) const;
  /// Overwrites gradients likewise (e.g. after an all-reduce).
  Status ImportGradients(const NamedTensors& grads) const;
  /// Makes each parameter's value the tensor of its name in `params`, sharing its storage (no
  /// copy; a tensor on another device is copied there). Checks like ImportParameters. The
  /// values are then shared: write them in place only after giving the model its own copies.
  Status ShareParameters(const NamedTensors& params) const;
  /// Gives every parameter a new, uninitialized gradient tensor, so that the old ones (which
  /// messages may share) are never written again. For writers that overwrite every gradient
  /// (Backward with accumulate = false, ZeroGrad, ImportGradients).
  void FreshGradients() const;
  std::string Describe() const;

 private:
  std::vector<std::shared_ptr<Layer>> layers_;
  Device* device_ = CpuDevice();
};

}  // namespace copse::ml
