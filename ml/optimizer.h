#pragma once
// Optimizers with PyTorch's update rules (torch.optim.SGD, Adam and AdamW, 1.13), so that
// a copse run and a PyTorch run with the same settings follow the same trajectory.
// An optimizer is bound to a fixed list of parameters (in order) and owns per-parameter state
// on their device; ExportState/ImportState carry that state through checkpoints and channels.
// Thread-safety: none; one optimizer per parameter set, stepped by one thread.
#include <memory>
#include <vector>

#include "ml/layers.h"

namespace copse::ml {

struct SgdOptions {
  float lr = 0.01f;
  float momentum = 0.0f;
  float dampening = 0.0f;
  float weight_decay = 0.0f;
  bool nesterov = false;
};

struct AdamOptions {
  float lr = 1e-3f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 0.0f;
  /// AdamW (torch.optim.AdamW): weight decay shrinks the parameters directly instead of being
  /// added to the gradient.
  bool decoupled_weight_decay = false;
};

/// Scales every gradient by min(1, max_norm / (total L2 norm + 1e-6)) as
/// torch.nn.utils.clip_grad_norm_ does; returns the total norm before clipping. The norm is
/// summed in double in parameter order, so it is the same on every run.
double ClipGradNorm(const std::vector<Parameter*>& params, double max_norm);

/// The sum of squares of every gradient, in double, in parameter order.
double GradSumSquares(const std::vector<Parameter*>& params);

/// The scaling step of ClipGradNorm for a total norm computed elsewhere (summed over the stages
/// of a pipeline, or the members of a tensor-parallel group): every gradient times
/// min(1, max_norm / (norm + 1e-6)).
void ClipGradsToNorm(const std::vector<Parameter*>& params, double norm, double max_norm);

/// Linear warmup from 0 over `warmup` steps, then a cosine decay from `lr` to `min_lr` at step
/// `total` (nanoGPT's schedule); `step` counts from 0 and stays at min_lr past `total`.
float WarmupCosineLr(int64_t step, int64_t warmup, int64_t total, float lr, float min_lr);

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  /// Updates every bound parameter from its gradient, in place (gradients are left as they are).
  virtual void Step() = 0;
  /// Steps taken so far.
  int64_t steps() const { return steps_; }
  void set_lr(float lr) { lr_ = lr; }
  float lr() const { return lr_; }
  /// Host copies of the state tensors ("momentum.<i>", …) and "step" as a 1-element tensor.
  virtual NamedTensors ExportState() const = 0;
  virtual Status ImportState(const NamedTensors& state) = 0;

 protected:
  Optimizer(std::vector<Parameter*> params, float lr) : params_(std::move(params)), lr_(lr) {}
  std::vector<Parameter*> params_;
  float lr_;
  int64_t steps_ = 0;
};

class Sgd final : public Optimizer {
 public:
  Sgd(std::vector<Parameter*> params, const SgdOptions& options);
  void Step() override;
  /// Step() out of place, for parameter values and state that messages share: parameter i's
  /// gradient is the sum, in order, of the device buffers grads[i][0], grads[i][1], ... (each of
  /// the parameter's size). The new values and momentum go to fresh tensors that replace the
  /// parameters' values and the momentum; nothing is written in place, and p->grad is not used.
  /// The same bits as summing the gradients into each p->grad and calling Step().
  void StepOutOfPlace(const std::vector<std::vector<const float*>>& grads);
  NamedTensors ExportState() const override;
  /// ExportState without copies: the momentum tensors themselves. A later in-place Step() first
  /// gives the optimizer its own copy, so what was handed out is never written.
  NamedTensors StateHandles();
  Status ImportState(const NamedTensors& state) override;

 private:
  SgdOptions options_;
  std::vector<Tensor> momentum_;  // empty until the first step, as in PyTorch
  bool state_shared_ = false;     // momentum_ handed out by StateHandles
};

class Adam final : public Optimizer {
 public:
  Adam(std::vector<Parameter*> params, const AdamOptions& options);
  void Step() override;
  NamedTensors ExportState() const override;
  Status ImportState(const NamedTensors& state) override;

 private:
  AdamOptions options_;
  std::vector<Tensor> m_, v_;
};

}  // namespace copse::ml
