#include "ml/loss_scaler.h"

#include <cmath>

namespace copse::ml {

LossScale LossScale::Next(bool finite) const {
  LossScale n = *this;
  if (!finite) {
    n.scale = scale * kBackoff;
    n.good_steps = 0;
  } else if (++n.good_steps == kGrowthInterval) {
    n.scale = scale * kGrowth;
    n.good_steps = 0;
  }
  return n;
}

void ScaleLossGradient(const Tensor& grad, const LossScale& s) {
  grad.device()->Scale(grad.data(), static_cast<size_t>(grad.numel()), s.scale);
}

bool UnscaleGradients(const std::vector<Parameter*>& params, const LossScale& s) {
  // A sum of squares is finite exactly when every element is (in double, no finite float32
  // square overflows): one pass per gradient, the same reduction clipping uses.
  for (const Parameter* p : params) {
    if (!std::isfinite(p->grad.device()->SumSquares(p->grad.data(), static_cast<size_t>(p->grad.numel())))) return false;
  }
  for (Parameter* p : params) p->grad.device()->Scale(p->grad.data(), static_cast<size_t>(p->grad.numel()), 1.0f / s.scale);
  return true;
}

}  // namespace copse::ml
