#pragma once
// Layers with explicit forward and backward passes. A Layer owns its parameters (value and
// accumulated gradient, on one device) but keeps NO per-call state: what Backward needs is
// returned by Forward in a LayerStash that the caller keeps. That is what lets a pipeline stage
// run the forward passes of several micro-batches before their backward passes (GPipe, 1F1B),
// and lets the stash travel as a channel between vertices.
//
// Backward ACCUMULATES into the parameter gradients (PyTorch semantics; ZeroGrad clears), so
// micro-batch gradients sum up naturally.
// Initialization follows PyTorch's defaults (kaiming_uniform(a=sqrt(5)) weights, i.e.
// U(±1/sqrt(fan_in)), and U(±1/sqrt(fan_in)) biases) drawn from a Philox stream derived from
// (seed, global layer index): a layer gets the same values wherever its stage runs.
// Thread-safety: a layer may run Forward concurrently on distinct inputs; Backward and
// parameter updates need exclusive access.
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "ml/tensor.h"

namespace copse::ml {

class TensorParallelGroup;  // ml/transformer.h

/// A trainable tensor and its gradient (same shape and device).
struct Parameter {
  std::string name;  // "weight", "bias" (Sequential prefixes the global layer index)
  Tensor value;
  Tensor grad;
};

/// What one layer's Forward keeps for its Backward, for one micro-batch.
struct LayerStash {
  std::vector<Tensor> tensors;
  /// In bfloat16: the weight copies the forward multiplied, for its backward to multiply again.
  /// Kept in this process only — a stash that travels as a message (ml/programs) goes without
  /// them, and the backward takes its layer's WeightCasts or converts again (the same bits).
  std::vector<Tensor> weights;
  Shape shape;        // input shape, for layers that only reshape
  uint64_t seed = 0;  // dropout: the mask is regenerated, not stored
};

struct Parameter;

/// bfloat16 copies of parameters, for the passes of one set of parameter values (a pipeline
/// stage's micro-batches, forward and backward): each parameter converted once, not once per
/// pass. One entry per parameter, converted again when the parameter's value is another tensor
/// than last time. A model gets one with Sequential::SetWeightCasts.
/// Contract: only for parameters nobody writes in place — the ML programs', which are message
/// tensors (ml/programs/support.h) and replaced, never overwritten. An entry keeps its source
/// alive, so a freed and reused address is never mistaken for it. Thread-safe.
class WeightCasts {
 public:
  /// `p`'s value converted to `type` (bfloat16 or float16).
  Tensor Cast(const Parameter& p, DType type);

 private:
  std::mutex mu_;
  std::unordered_map<const Parameter*, std::pair<Tensor, Tensor>> casts_;  // -> (source, copy)
};

/// Per-call settings of a forward pass.
struct ForwardContext {
  bool training = true;
  /// Randomness of this (step, micro-batch), e.g. MixSeed(seed, step, micro_batch); each
  /// layer mixes in its global index.
  uint64_t seed = 0;
  /// The precision of matrix products (ml/dtype.h). In bfloat16, layers stash the bfloat16
  /// operands their backward multiplies again, and their backward computes in bfloat16 too.
  Precision precision = Precision::kFloat32;
};

class Layer {
 public:
  virtual ~Layer() = default;
  /// "Linear(784, 1024)+ReLU".
  virtual std::string Describe() const = 0;
  /// y = layer(x). When `stash` is not null, fills it for Backward.
  virtual Result<Tensor> Forward(const Tensor& x, const ForwardContext& ctx, LayerStash* stash) = 0;
  /// Adds this micro-batch's parameter gradients (or overwrites them when !accumulate, which
  /// saves zeroing them first) and returns dL/dx (undefined when !need_dx).
  virtual Result<Tensor> Backward(const Tensor& dy, const LayerStash& stash, bool need_dx, bool accumulate = true) = 0;
  /// Re-initializes the parameters from the stream of (seed, index()).
  virtual void InitParameters(uint64_t seed) {}
  /// Whether Forward takes a bfloat16 x as it is (else it gets float32).
  virtual bool TakesBFloat16() const { return false; }

  // Deferred weight gradients (the B/W split of zero-bubble pipelines): a pipeline stage's
  // backward of each micro-batch computes only dL/dx, which the previous stage waits for, and
  // keeps what the weight gradients need; once every micro-batch of the step is back, one
  // WeightGradients call computes them for all micro-batches together (one product over all
  // their rows instead of one per micro-batch).

  /// Whether this layer can split its backward so. True for layers without parameters.
  virtual bool DefersWeightGradients() const { return params_.empty(); }
  /// Backward without the parameter gradients: returns dL/dx (undefined when !need_dx) and sets
  /// `*wgrad` to what WeightGradients needs beside the stash (left undefined by layers without
  /// parameters). Parameter gradients are not touched.
  virtual Result<Tensor> BackwardInput(const Tensor& dy, const LayerStash& stash, bool need_dx, Tensor* wgrad);
  /// Overwrites the parameter gradients with the sum over `parts` — one (stash, *wgrad) pair of
  /// BackwardInput per micro-batch — in one pass. The same parts give the same bits whatever
  /// their order of arrival, thread count or daemon.
  virtual Status WeightGradients(const std::vector<std::pair<const LayerStash*, const Tensor*>>& parts);

  /// Tensor-parallel layers (ml/transformer.h) sum their partial products over `group`, which
  /// must outlive their calls; other layers ignore it.
  virtual void SetTensorParallelGroup(TensorParallelGroup* group) {}
  /// Where this layer's bfloat16 weight copies come from (see WeightCasts' contract; it must
  /// outlive the layer's calls); null: converted on every pass.
  void SetWeightCasts(WeightCasts* casts) { weight_casts_ = casts; }

  std::vector<Parameter>& parameters() { return params_; }
  const std::vector<Parameter>& parameters() const { return params_; }
  /// Position in the whole model (kept by Sequential::Slice).
  int index() const { return index_; }
  void set_index(int index) { index_ = index; }
  Device* device() const { return device_; }
  /// Moves parameters (and gradients) to `device`.
  void To(Device* device);
  void ZeroGrad();

 protected:
  Parameter& AddParameter(const std::string& name, const Shape& shape);
  /// Fills `t` with U(-bound, bound) from stream `stream` of this layer's seed.
  void UniformInit(const Tensor& t, uint64_t seed, uint64_t stream, float bound) const;
  /// Fills `t` with N(0, std^2) from stream `stream` of this layer's seed (Box-Muller over
  /// pairs of Philox uniforms).
  void NormalInit(const Tensor& t, uint64_t seed, uint64_t stream, float std) const;
  /// What a product of this pass multiplies by weight `w`: its value, or in bf16 (fp16) its
  /// bfloat16 (float16) copy.
  Tensor ProductWeight(const Parameter& w, const ForwardContext& ctx) const;
  /// What a backward multiplies by weight `w`, the i-th its forward multiplied: its value when
  /// the forward multiplied in float32 (`type`, its operands' type), else the stashed copy or,
  /// for a stash that came without it, the weight's copy in that type again.
  Tensor BackwardWeight(const LayerStash& stash, size_t i, const Parameter& w, DType type) const;

  std::vector<Parameter> params_;
  int index_ = 0;
  Device* device_ = CpuDevice();
  WeightCasts* weight_casts_ = nullptr;
};

/// y = act(x W^T + b), W [out, in] as in torch.nn.Linear; act fused into the same pass. x is
/// [N, in] or [..., in] (the leading dimensions are rows, and y keeps them: [..., out]), float32
/// or bfloat16 (an activation that crossed a stage boundary in bfloat16); y is float32.
/// Stash: x as multiplied and the pre-activation z (when there is an activation); in bfloat16
/// the weight's copy in LayerStash::weights.
class Linear final : public Layer {
 public:
  Linear(int in_features, int out_features, Activation act = Activation::kNone, bool bias = true);
  std::string Describe() const override;
  Result<Tensor> Forward(const Tensor& x, const ForwardContext& ctx, LayerStash* stash) override;
  Result<Tensor> Backward(const Tensor& dy, const LayerStash& stash, bool need_dx, bool accumulate = true) override;
  void InitParameters(uint64_t seed) override;
  bool TakesBFloat16() const override { return true; }
  bool DefersWeightGradients() const override { return true; }
  /// `*wgrad` is dL/dz, the gradient before the fused activation.
  Result<Tensor> BackwardInput(const Tensor& dy, const LayerStash& stash, bool need_dx, Tensor* wgrad) override;
  /// dW = dZ^T X and db = column sums of dZ over the rows of every part, as one product.
  Status WeightGradients(const std::vector<std::pair<const LayerStash*, const Tensor*>>& parts) override;

 private:
  /// Whether `stash` is what Forward leaves: x (float32 or bfloat16) and, with an activation,
  /// its float32 pre-activation z.
  bool StashFits(const LayerStash& stash) const;
  /// BackwardInput's work: dL/dx (undefined when !need_dx), dL/dz in float32 (`*dz`) and, when
  /// `dz_operand` is not null, dL/dz as the products multiply it, in x's type (converted once
  /// for Backward's two products).
  Result<Tensor> InputGradient(const Tensor& dy, const LayerStash& stash, bool need_dx, Tensor* dz, Tensor* dz_operand);

  int in_, out_;
  Activation act_;
  bool bias_;
};

/// Elementwise ReLU or GELU as a layer of its own.
class ActivationLayer final : public Layer {
 public:
  explicit ActivationLayer(Activation act) : act_(act) {}
  std::string Describe() const override;
  Result<Tensor> Forward(const Tensor& x, const ForwardContext& ctx, LayerStash* stash) override;
  Result<Tensor> Backward(const Tensor& dy, const LayerStash& stash, bool need_dx, bool accumulate = true) override;

 private:
  Activation act_;
};

/// 2-D convolution over NCHW with square kernels, as torch.nn.Conv2d (+ optional fused act).
class Conv2dLayer final : public Layer {
 public:
  Conv2dLayer(int in_channels, int out_channels, int kernel, int stride = 1, int pad = 0, Activation act = Activation::kNone);
  std::string Describe() const override;
  Result<Tensor> Forward(const Tensor& x, const ForwardContext& ctx, LayerStash* stash) override;
  Result<Tensor> Backward(const Tensor& dy, const LayerStash& stash, bool need_dx, bool accumulate = true) override;
  void InitParameters(uint64_t seed) override;

 private:
  int in_c_, out_c_, kernel_, stride_, pad_;
  Activation act_;
};

class MaxPool2dLayer final : public Layer {
 public:
  MaxPool2dLayer(int kernel, int stride) : kernel_(kernel), stride_(stride) {}
  std::string Describe() const override;
  Result<Tensor> Forward(const Tensor& x, const ForwardContext& ctx, LayerStash* stash) override;
  Result<Tensor> Backward(const Tensor& dy, const LayerStash& stash, bool need_dx, bool accumulate = true) override;

 private:
  int kernel_, stride_;
};

/// [N, ...] -> [N, prod(...)].
class Flatten final : public Layer {
 public:
  std::string Describe() const override { return "Flatten"; }
  Result<Tensor> Forward(const Tensor& x, const ForwardContext& ctx, LayerStash* stash) override;
  Result<Tensor> Backward(const Tensor& dy, const LayerStash& stash, bool need_dx, bool accumulate = true) override;
};

/// Layer norm over the last dimension with affine gamma (init 1) and beta (init 0).
class LayerNormLayer final : public Layer {
 public:
  explicit LayerNormLayer(int features, float eps = 1e-5f);
  std::string Describe() const override;
  Result<Tensor> Forward(const Tensor& x, const ForwardContext& ctx, LayerStash* stash) override;
  Result<Tensor> Backward(const Tensor& dy, const LayerStash& stash, bool need_dx, bool accumulate = true) override;
  void InitParameters(uint64_t seed) override;

 private:
  int features_;
  float eps_;
};

/// Inverted dropout; identity when !ctx.training. The mask of element i is a function of
/// (MixSeed(ctx.seed, index()), i) only.
class DropoutLayer final : public Layer {
 public:
  explicit DropoutLayer(float p) : p_(p) {}
  std::string Describe() const override;
  Result<Tensor> Forward(const Tensor& x, const ForwardContext& ctx, LayerStash* stash) override;
  Result<Tensor> Backward(const Tensor& dy, const LayerStash& stash, bool need_dx, bool accumulate = true) override;

 private:
  float p_;
};

}  // namespace copse::ml
