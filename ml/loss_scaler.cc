#include "ml/loss_scaler.h"

#include <vector>

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

bool GradientsFinite(const std::vector<Parameter*>& params) {
  if (params.empty()) return true;
  std::vector<Device::Span> grads;
  for (const Parameter* p : params) grads.push_back({p->grad.data(), static_cast<size_t>(p->grad.numel())});
  return params[0]->grad.device()->AllFinite(grads);
}

bool UnscaleGradients(const std::vector<Parameter*>& params, const LossScale& s) {
  if (!GradientsFinite(params)) return false;
  for (Parameter* p : params) p->grad.device()->Scale(p->grad.data(), static_cast<size_t>(p->grad.numel()), 1.0f / s.scale);
  return true;
}

}  // namespace copse::ml
