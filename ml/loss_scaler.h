#pragma once
// Dynamic loss scaling for float16 mixed precision (Precision::kFloat16), as PyTorch's
// GradScaler does it. float16 gradients below 2^-24 vanish, so the loss's gradient is multiplied
// by a scale S before backward; the parameter gradients come out S times too large and are
// divided by S before the optimizer sees them. When any gradient overflowed to infinity or NaN,
// the step is skipped and S halves; after kGrowthInterval good steps in a row S doubles.
//
// The state is two numbers and every decision a pure function of the gradients' values, so a
// re-executed step makes the same decision and the same bits (the graphs carry the state in
// their optimizer-state messages, ml/programs).
//
//   LossScale s;                                       // S = 65536
//   ScaleLossGradient(loss.grad, s);                   // before backward
//   const bool finite = UnscaleGradients(params, s);   // after it
//   if (finite) optimizer.Step();
//   s = s.Next(finite);
#include <cstdint>
#include <vector>

#include "ml/layers.h"

namespace copse::ml {

struct LossScale {
  static constexpr float kInitial = 65536.0f;
  static constexpr float kGrowth = 2.0f, kBackoff = 0.5f;
  static constexpr int64_t kGrowthInterval = 2000;

  float scale = kInitial;
  int64_t good_steps = 0;  // finite steps since the scale last changed

  /// The state after a step whose gradients were all finite (or not).
  LossScale Next(bool finite) const;
};

/// dL/dlogits x S, in place.
void ScaleLossGradient(const Tensor& grad, const LossScale& s);

/// Whether every gradient of `params` is finite (one pass on their device: a model's gradients
/// live together).
bool GradientsFinite(const std::vector<Parameter*>& params);

/// Divides every parameter gradient by S in place when all of them are finite, and says whether
/// they were; when not, leaves them (the step is skipped).
bool UnscaleGradients(const std::vector<Parameter*>& params, const LossScale& s);

}  // namespace copse::ml
