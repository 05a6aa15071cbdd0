#include "ml/optimizer.h"

#include <cmath>
#include <map>

namespace copse::ml {
namespace {

Tensor StepTensor(int64_t steps) { return Tensor::FromVector({1}, {static_cast<float>(steps)}); }

Result<std::map<std::string, const Tensor*>> Index(const NamedTensors& state) {
  std::map<std::string, const Tensor*> out;
  for (const auto& [name, t] : state) out[name] = &t;
  if (!out.count("step") || out["step"]->numel() != 1) return Status::InvalidArgument("optimizer state lacks 'step'");
  return out;
}

Status LoadInto(const std::map<std::string, const Tensor*>& index, const std::string& name, const Tensor& like, Tensor* dst) {
  auto it = index.find(name);
  if (it == index.end()) return Status::InvalidArgument("optimizer state lacks '" + name + "'");
  if (it->second->shape() != like.shape())
    return Status::InvalidArgument("optimizer state '" + name + "' has shape " + ShapeToString(it->second->shape()) +
                                   ", expected " + ShapeToString(like.shape()));
  *dst = it->second->To(like.device());
  return Status::OK();
}

}  // namespace

Sgd::Sgd(std::vector<Parameter*> params, const SgdOptions& options)
    : Optimizer(std::move(params), options.lr), options_(options) {}

void Sgd::Step() {
  const bool first = momentum_.empty();
  if (first && options_.momentum != 0.0f) {
    for (Parameter* p : params_) momentum_.push_back(Tensor::Empty(p->value.shape(), p->value.device()));
  } else if (state_shared_) {
    for (Tensor& m : momentum_) m = m.Clone();
  }
  state_shared_ = false;
  for (size_t i = 0; i < params_.size(); ++i) {
    Parameter* p = params_[i];
    p->value.device()->SgdStep(p->value.data(), p->grad.data(), momentum_.empty() ? nullptr : momentum_[i].data(),
                               static_cast<size_t>(p->value.numel()), lr_, options_.momentum, options_.dampening,
                               options_.weight_decay, options_.nesterov, first);
  }
  ++steps_;
}

void Sgd::StepOutOfPlace(const std::vector<std::vector<const float*>>& grads) {
  const bool first = momentum_.empty();
  const bool with_momentum = options_.momentum != 0.0f;
  std::vector<Tensor> momentum;
  for (size_t i = 0; i < params_.size(); ++i) {
    Parameter* p = params_[i];
    Device* dev = p->value.device();
    Tensor value = Tensor::Empty(p->value.shape(), dev);
    Tensor buf = with_momentum ? Tensor::Empty(p->value.shape(), dev) : Tensor();
    dev->SgdStepOutOfPlace(p->value.data(), grads.at(i).data(), static_cast<int>(grads[i].size()),
                           first || !with_momentum ? nullptr : momentum_[i].data(), static_cast<size_t>(p->value.numel()), lr_,
                           options_.momentum, options_.dampening, options_.weight_decay, options_.nesterov, first, value.data(),
                           buf.data());
    p->value = std::move(value);
    if (with_momentum) momentum.push_back(std::move(buf));
  }
  momentum_ = std::move(momentum);
  state_shared_ = false;
  ++steps_;
}

NamedTensors Sgd::ExportState() const {
  NamedTensors out;
  out.emplace_back("step", StepTensor(steps_));
  for (size_t i = 0; i < momentum_.size(); ++i) out.emplace_back("momentum." + std::to_string(i), momentum_[i].To(CpuDevice()));
  return out;
}

NamedTensors Sgd::StateHandles() {
  NamedTensors out;
  out.emplace_back("step", StepTensor(steps_));
  for (size_t i = 0; i < momentum_.size(); ++i) out.emplace_back("momentum." + std::to_string(i), momentum_[i]);
  state_shared_ = true;
  return out;
}

Status Sgd::ImportState(const NamedTensors& state) {
  COPSE_ASSIGN_OR_RETURN(auto index, Index(state));
  std::vector<Tensor> momentum;
  if (index.count("momentum.0")) {
    momentum.resize(params_.size());
    for (size_t i = 0; i < params_.size(); ++i)
      COPSE_RETURN_NOT_OK(LoadInto(index, "momentum." + std::to_string(i), params_[i]->value, &momentum[i]));
  }
  momentum_ = std::move(momentum);
  steps_ = static_cast<int64_t>(index["step"]->ToVector()[0]);
  return Status::OK();
}

double GradSumSquares(const std::vector<Parameter*>& params) {
  double sum = 0.0;
  for (Parameter* p : params) sum += p->grad.device()->SumSquares(p->grad.data(), static_cast<size_t>(p->grad.numel()));
  return sum;
}

void ClipGradsToNorm(const std::vector<Parameter*>& params, double norm, double max_norm) {
  const double coef = max_norm / (norm + 1e-6);
  if (coef < 1.0)
    for (Parameter* p : params)
      p->grad.device()->Scale(p->grad.data(), static_cast<size_t>(p->grad.numel()), static_cast<float>(coef));
}

double ClipGradNorm(const std::vector<Parameter*>& params, double max_norm) {
  const double norm = std::sqrt(GradSumSquares(params));
  ClipGradsToNorm(params, norm, max_norm);
  return norm;
}

float WarmupCosineLr(int64_t step, int64_t warmup, int64_t total, float lr, float min_lr) {
  if (step < warmup) return lr * static_cast<float>(step + 1) / static_cast<float>(warmup + 1);
  if (step >= total || total <= warmup) return min_lr;
  const double progress = static_cast<double>(step - warmup) / static_cast<double>(total - warmup);
  return static_cast<float>(min_lr + 0.5 * (1.0 + std::cos(M_PI * progress)) * (lr - min_lr));
}

Adam::Adam(std::vector<Parameter*> params, const AdamOptions& options)
    : Optimizer(std::move(params), options.lr), options_(options) {
  for (Parameter* p : params_) {
    m_.push_back(Tensor::Zeros(p->value.shape(), p->value.device()));
    v_.push_back(Tensor::Zeros(p->value.shape(), p->value.device()));
  }
}

void Adam::Step() {
  ++steps_;
  for (size_t i = 0; i < params_.size(); ++i) {
    Parameter* p = params_[i];
    p->value.device()->AdamStep(p->value.data(), p->grad.data(), m_[i].data(), v_[i].data(),
                                static_cast<size_t>(p->value.numel()), lr_, options_.beta1, options_.beta2, options_.eps,
                                options_.weight_decay, options_.decoupled_weight_decay, steps_);
  }
}

NamedTensors Adam::ExportState() const {
  NamedTensors out;
  out.emplace_back("step", StepTensor(steps_));
  for (size_t i = 0; i < m_.size(); ++i) {
    out.emplace_back("exp_avg." + std::to_string(i), m_[i].To(CpuDevice()));
    out.emplace_back("exp_avg_sq." + std::to_string(i), v_[i].To(CpuDevice()));
  }
  return out;
}

Status Adam::ImportState(const NamedTensors& state) {
  COPSE_ASSIGN_OR_RETURN(auto index, Index(state));
  std::vector<Tensor> m(params_.size()), v(params_.size());
  for (size_t i = 0; i < params_.size(); ++i) {
    COPSE_RETURN_NOT_OK(LoadInto(index, "exp_avg." + std::to_string(i), params_[i]->value, &m[i]));
    COPSE_RETURN_NOT_OK(LoadInto(index, "exp_avg_sq." + std::to_string(i), params_[i]->value, &v[i]));
  }
  m_ = std::move(m);
  v_ = std::move(v);
  steps_ = static_cast<int64_t>(index["step"]->ToVector()[0]);
  return Status::OK();
}

}  // namespace copse::ml
