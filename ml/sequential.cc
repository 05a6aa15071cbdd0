#include "ml/sequential.h"

#include <algorithm>
#include <map>

namespace copse::ml {

void Sequential::Add(std::shared_ptr<Layer> layer) {
  layer->set_index(layers_.empty() ? 0 : layers_.back()->index() + 1);
  if (layer->device() != device_) layer->To(device_);
  layers_.push_back(std::move(layer));
}

Sequential Sequential::Slice(size_t begin, size_t end) const {
  if (begin > end || end > layers_.size())
    throw std::out_of_range("Sequential::Slice(" + std::to_string(begin) + ", " + std::to_string(end) + ") of " +
                            std::to_string(layers_.size()));
  Sequential s;
  s.device_ = device_;
  s.layers_.assign(layers_.begin() + static_cast<ptrdiff_t>(begin), layers_.begin() + static_cast<ptrdiff_t>(end));
  return s;
}

void Sequential::SetTensorParallelGroup(TensorParallelGroup* group) const {
  for (auto& l : layers_) l->SetTensorParallelGroup(group);
}

void Sequential::SetWeightCasts(WeightCasts* casts) const {
  for (auto& l : layers_) l->SetWeightCasts(casts);
}

void Sequential::InitParameters(uint64_t seed) {
  for (auto& l : layers_) l->InitParameters(seed);
}

void Sequential::To(Device* device) {
  for (auto& l : layers_) l->To(device);
  device_ = device;
}

Result<Tensor> Sequential::Forward(const Tensor& x, const ForwardContext& ctx, Stash* stash) const {
  if (stash) stash->layers.assign(layers_.size(), LayerStash{});
  // A bfloat16 input (an activation that crossed a stage boundary so) goes as it is only to a
  // layer that multiplies it in bfloat16 anyway.
  Tensor h = !layers_.empty() && layers_[0]->TakesBFloat16() ? x : x.Cast(DType::kFloat32);
  for (size_t i = 0; i < layers_.size(); ++i) {
    auto r = layers_[i]->Forward(h, ctx, stash ? &stash->layers[i] : nullptr);
    if (!r.ok()) return r.status().WithContext("layer " + std::to_string(layers_[i]->index()));
    h = std::move(r).value();
  }
  return h;
}

Result<Tensor> Sequential::Predict(const Tensor& x) const {
  ForwardContext ctx;
  ctx.training = false;
  return Forward(x, ctx, nullptr);
}

namespace {

/// A backward pass from the last layer to the first; `step(i, dy, need_dx)` runs layer i and
/// returns its dL/dx. Without an input gradient, layers before the first one with parameters
/// need no dx either (for an MLP that skips the largest product of the first Linear).
template <typename Step>
Result<Tensor> WalkBackward(const std::vector<std::shared_ptr<Layer>>& layers, const Stash& stash, const char* who,
                            const Tensor& dy, bool need_input_grad, Step step) {
  if (stash.layers.size() != layers.size())
    return Status::FailedPrecondition(std::string(who) + ": stash of " + std::to_string(stash.layers.size()) + " layers for " +
                                      std::to_string(layers.size()));
  size_t first_trainable = layers.size();
  for (size_t i = 0; i < layers.size(); ++i)
    if (!layers[i]->parameters().empty()) {
      first_trainable = i;
      break;
    }
  Tensor g = dy.Cast(DType::kFloat32);  // a gradient that crossed a stage boundary in bfloat16
  for (size_t i = layers.size(); i-- > 0;) {
    const bool need_dx = need_input_grad || i > first_trainable;
    if (!need_dx && layers[i]->parameters().empty()) break;
    auto r = step(i, g, need_dx);
    if (!r.ok()) return r.status().WithContext("layer " + std::to_string(layers[i]->index()));
    g = std::move(r).value();
  }
  return g;
}

}  // namespace

Result<Tensor> Sequential::Backward(const Tensor& dy, const Stash& stash, bool need_input_grad, bool accumulate) const {
  return WalkBackward(layers_, stash, "Sequential::Backward", dy, need_input_grad, [&](size_t i, const Tensor& g, bool need_dx) {
    return layers_[i]->Backward(g, stash.layers[i], need_dx, accumulate);
  });
}

bool Sequential::DefersWeightGradients() const {
  return std::all_of(layers_.begin(), layers_.end(), [](const auto& l) { return l->DefersWeightGradients(); });
}

Result<Tensor> Sequential::BackwardInputs(const Tensor& dy, const Stash& stash, bool need_input_grad,
                                          std::vector<Tensor>* wgrads) const {
  wgrads->assign(layers_.size(), Tensor());
  return WalkBackward(layers_, stash, "Sequential::BackwardInputs", dy, need_input_grad,
                      [&](size_t i, const Tensor& g, bool need_dx) {
                        return layers_[i]->BackwardInput(g, stash.layers[i], need_dx, &(*wgrads)[i]);
                      });
}

Status Sequential::WeightGradients(const std::vector<const Stash*>& stashes,
                                   const std::vector<const std::vector<Tensor>*>& wgrads) const {
  if (stashes.size() != wgrads.size())
    return Status::InvalidArgument("Sequential::WeightGradients: " + std::to_string(stashes.size()) + " stashes for " +
                                   std::to_string(wgrads.size()) + " gradient parts");
  FreshGradients();
  for (size_t i = 0; i < layers_.size(); ++i) {
    if (layers_[i]->parameters().empty()) continue;
    std::vector<std::pair<const LayerStash*, const Tensor*>> parts;
    for (size_t k = 0; k < stashes.size(); ++k) {
      if (stashes[k]->layers.size() != layers_.size() || wgrads[k]->size() != layers_.size())
        return Status::FailedPrecondition("Sequential::WeightGradients: micro-batch " + std::to_string(k) +
                                          " does not match the model's " + std::to_string(layers_.size()) + " layers");
      parts.emplace_back(&stashes[k]->layers[i], &(*wgrads[k])[i]);
    }
    COPSE_RETURN_NOT_OK(layers_[i]->WeightGradients(parts).WithContext("layer " + std::to_string(layers_[i]->index())));
  }
  return Status::OK();
}

std::vector<Parameter*> Sequential::Parameters() const {
  std::vector<Parameter*> out;
  for (auto& l : layers_)
    for (Parameter& p : l->parameters()) out.push_back(&p);
  return out;
}

std::vector<std::string> Sequential::ParameterNames() const {
  std::vector<std::string> out;
  for (auto& l : layers_)
    for (const Parameter& p : l->parameters()) out.push_back(std::to_string(l->index()) + "." + p.name);
  return out;
}

int64_t Sequential::NumParameters() const {
  int64_t n = 0;
  for (Parameter* p : Parameters()) n += p->value.numel();
  return n;
}

void Sequential::ZeroGrad() const {
  for (auto& l : layers_) l->ZeroGrad();
}

static NamedTensors Export(const Sequential& m, bool host, bool grads) {
  NamedTensors out;
  const auto names = m.ParameterNames();
  const auto params = m.Parameters();
  for (size_t i = 0; i < params.size(); ++i) {
    const Tensor& t = grads ? params[i]->grad : params[i]->value;
    out.emplace_back(names[i], t.To(host ? CpuDevice() : t.device()));
  }
  return out;
}

NamedTensors Sequential::ExportParameters(bool host) const { return Export(*this, host, false); }
NamedTensors Sequential::ExportGradients(bool host) const { return Export(*this, host, true); }

/// The tensor of `in` for each parameter of `m` (in Parameters() order), checked against the
/// parameter's `field` (value or grad): every one present with the right shape.
static Result<std::vector<const Tensor*>> Match(const Sequential& m, const NamedTensors& in, Tensor Parameter::*field) {
  std::map<std::string, const Tensor*> by_name;
  for (const auto& [name, t] : in) by_name[name] = &t;
  const auto names = m.ParameterNames();
  const auto params = m.Parameters();
  std::vector<const Tensor*> out;
  for (size_t i = 0; i < params.size(); ++i) {
    auto it = by_name.find(names[i]);
    if (it == by_name.end()) return Status::InvalidArgument("parameter set lacks '" + names[i] + "'");
    const Tensor& dst = params[i]->*field;
    if (it->second->shape() != dst.shape() || it->second->dtype() != dst.dtype())
      return Status::InvalidArgument("parameter '" + names[i] + "' is " + DTypeName(it->second->dtype()) + " of shape " +
                                     ShapeToString(it->second->shape()) + ", expected " + DTypeName(dst.dtype()) + " of shape " +
                                     ShapeToString(dst.shape()));
    out.push_back(it->second);
  }
  return out;
}

static Status Import(const Sequential& m, const NamedTensors& in, bool grads) {
  Tensor Parameter::*field = grads ? &Parameter::grad : &Parameter::value;
  COPSE_ASSIGN_OR_RETURN(auto src, Match(m, in, field));
  const auto params = m.Parameters();
  for (size_t i = 0; i < params.size(); ++i) (params[i]->*field).CopyFrom(*src[i]);
  return Status::OK();
}

Status Sequential::ShareParameters(const NamedTensors& params) const {
  COPSE_ASSIGN_OR_RETURN(auto src, Match(*this, params, &Parameter::value));
  const auto mine = Parameters();
  for (size_t i = 0; i < mine.size(); ++i) {
    Device* dev = mine[i]->value.device();
    mine[i]->value = src[i]->device() == dev ? *src[i] : src[i]->To(dev);
  }
  return Status::OK();
}

void Sequential::FreshGradients() const {
  for (Parameter* p : Parameters()) p->grad = Tensor::Empty(p->grad.shape(), p->grad.device());
}

Status Sequential::ImportParameters(const NamedTensors& params) const { return Import(*this, params, false); }
Status Sequential::ImportGradients(const NamedTensors& grads) const { return Import(*this, grads, true); }

std::string Sequential::Describe() const {
  std::string s;
  for (auto& l : layers_) {
    if (!s.empty()) s += " -> ";
    s += l->Describe();
  }
  return s;
}

}  // namespace copse::ml
