#include "ml/layers.h"

#include <cmath>

#include "ml/ops.h"
#include "ml/philox.h"

namespace copse::ml {
namespace {

const char* ActName(Activation act) {
  switch (act) {
    case Activation::kRelu: return "ReLU";
    case Activation::kGelu: return "GELU";
    default: return "";
  }
}

std::string WithAct(std::string s, Activation act) {
  if (act != Activation::kNone) s += std::string("+") + ActName(act);
  return s;
}

int I(int64_t v) { return static_cast<int>(v); }

Status BadInput(const std::string& layer, const std::string& expected, const Tensor& x) {
  return Status::InvalidArgument(layer + ": expected input " + expected + ", got " +
                                 (x.defined() ? ShapeToString(x.shape()) : "undefined"));
}

}  // namespace

// ---- Layer -----------------------------------------------------------------------------------

void Layer::To(Device* device) {
  for (Parameter& p : params_) {
    if (p.value.device() != device) p.value = p.value.To(device);
    if (p.grad.device() != device) p.grad = p.grad.To(device);
  }
  device_ = device;
}

void Layer::ZeroGrad() {
  for (Parameter& p : params_) p.grad.Fill(0.0f);
}

Result<Tensor> Layer::BackwardInput(const Tensor& dy, const LayerStash& stash, bool need_dx, Tensor* wgrad) {
  if (!params_.empty()) return Status::FailedPrecondition(Describe() + " cannot defer its weight gradients");
  *wgrad = Tensor();
  return Backward(dy, stash, need_dx);
}

Status Layer::WeightGradients(const std::vector<std::pair<const LayerStash*, const Tensor*>>&) {
  if (!params_.empty()) return Status::FailedPrecondition(Describe() + " cannot defer its weight gradients");
  return Status::OK();
}

Parameter& Layer::AddParameter(const std::string& name, const Shape& shape) {
  params_.push_back(Parameter{name, Tensor::Zeros(shape, device_), Tensor::Zeros(shape, device_)});
  return params_.back();
}

void Layer::UniformInit(const Tensor& t, uint64_t seed, uint64_t stream, float bound) const {
  const uint64_t layer_seed = MixSeed(seed, static_cast<uint64_t>(index_));
  std::vector<float> v(static_cast<size_t>(t.numel()));
  for (size_t i = 0; i < v.size(); ++i) v[i] = (2.0f * PhiloxUniform(layer_seed, stream, i) - 1.0f) * bound;
  t.device()->CopyFromHost(t.data(), v.data(), v.size() * sizeof(float));
}

void Layer::NormalInit(const Tensor& t, uint64_t seed, uint64_t stream, float std) const {
  const uint64_t layer_seed = MixSeed(seed, static_cast<uint64_t>(index_));
  std::vector<float> v(static_cast<size_t>(t.numel()));
  for (size_t i = 0; i < v.size(); ++i) {
    // u1 in (0, 1] so that the log is finite.
    const double u1 = 1.0 - PhiloxUniform(layer_seed, stream, 2 * (i / 2));
    const double u2 = PhiloxUniform(layer_seed, stream, 2 * (i / 2) + 1);
    const double r = std::sqrt(-2.0 * std::log(u1)), theta = 2.0 * M_PI * u2;
    v[i] = static_cast<float>(std * r * (i % 2 == 0 ? std::cos(theta) : std::sin(theta)));
  }
  t.device()->CopyFromHost(t.data(), v.data(), v.size() * sizeof(float));
}

Tensor Layer::ProductWeight(const Parameter& w, const ForwardContext& ctx) const {
  const DType type = ProductType(ctx.precision);
  if (type == DType::kFloat32) return w.value;
  return weight_casts_ ? weight_casts_->Cast(w, type) : w.value.Cast(type);
}

Tensor Layer::BackwardWeight(const LayerStash& stash, size_t i, const Parameter& w, DType type) const {
  if (type == DType::kFloat32) return w.value;
  if (i < stash.weights.size() && stash.weights[i].shape() == w.value.shape() && stash.weights[i].dtype() == type)
    return stash.weights[i];
  return weight_casts_ ? weight_casts_->Cast(w, type) : w.value.Cast(type);
}

Tensor WeightCasts::Cast(const Parameter& p, DType type) {
  std::lock_guard<std::mutex> lock(mu_);
  auto& [source, copy] = casts_[&p];
  if (!source.defined() || source.raw_data() != p.value.raw_data() || source.shape() != p.value.shape() || copy.dtype() != type)
    source = p.value, copy = p.value.Cast(type);
  return copy;
}

// ---- Linear ----------------------------------------------------------------------------------

Linear::Linear(int in_features, int out_features, Activation act, bool bias)
    : in_(in_features), out_(out_features), act_(act), bias_(bias) {
  AddParameter("weight", {out_, in_});
  if (bias_) AddParameter("bias", {out_});
}

std::string Linear::Describe() const {
  return WithAct("Linear(" + std::to_string(in_) + ", " + std::to_string(out_) + ")", act_);
}

void Linear::InitParameters(uint64_t seed) {
  const float bound = 1.0f / std::sqrt(static_cast<float>(in_));
  UniformInit(params_[0].value, seed, 0, bound);
  if (bias_) UniformInit(params_[1].value, seed, 1, bound);
}

Result<Tensor> Linear::Forward(const Tensor& input, const ForwardContext& ctx, LayerStash* stash) {
  if (input.ndim() < 2 || input.dim(-1) != in_) return BadInput(Describe(), "[..., " + std::to_string(in_) + "]", input);
  // [B, T, in] is [B * T, in]; the output keeps the leading dimensions.
  const Tensor x = ProductOperand(input.ndim() == 2 ? input : input.Reshape({input.numel() / in_, in_}), ctx.precision);
  const Tensor w = ProductWeight(params_[0], ctx);
  Device* dev = device_;
  const int n = I(x.dim(0));
  Tensor z = Tensor::Empty({n, out_}, dev);
  MatmulInto(x, w, false, true, 0.0f, z);
  const float* b = bias_ ? params_[1].value.data() : nullptr;
  Tensor y = z;
  if (act_ == Activation::kGelu) {  // GELU's backward needs its input: keep z, write y apart
    if (b) dev->BiasActivation(z.data(), b, n, out_, Activation::kNone, z.data());
    y = Tensor::Empty({n, out_}, dev);
    dev->BiasActivation(z.data(), nullptr, n, out_, act_, y.data());
  } else if (b || act_ != Activation::kNone) {
    dev->BiasActivation(z.data(), b, n, out_, act_, z.data());
  }
  if (stash) {
    stash->tensors = {x, act_ == Activation::kNone ? Tensor() : z};
    stash->weights.clear();
    if (x.dtype() != DType::kFloat32) stash->weights.push_back(w);
    stash->shape = input.ndim() == 2 ? Shape{} : input.shape();
  }
  if (input.ndim() == 2) return y;
  Shape out = input.shape();
  out.back() = out_;
  return y.Reshape(out);
}

bool Linear::StashFits(const LayerStash& stash) const {
  const auto& t = stash.tensors;
  if (t.size() != 2 || !t[0].defined() || t[0].ndim() != 2 || t[0].dim(1) != in_) return false;
  if (act_ == Activation::kNone) return !t[1].defined();
  return t[1].defined() && t[1].dtype() == DType::kFloat32 && t[1].numel() == t[0].dim(0) * out_;
}

Result<Tensor> Linear::Backward(const Tensor& dy, const LayerStash& stash, bool need_dx, bool accumulate) {
  // dL/dx and dL/dz as a deferred backward computes them, then this micro-batch's weight
  // gradients from dL/dz (the products are independent: their order changes no bits).
  Tensor dz, dz_operand;
  COPSE_ASSIGN_OR_RETURN(Tensor dx, InputGradient(dy, stash, need_dx, &dz, &dz_operand));
  const Tensor& x = stash.tensors[0];
  const int n = I(x.dim(0));
  const float beta = accumulate ? 1.0f : 0.0f;
  MatmulInto(dz_operand, x, true, false, beta, params_[0].grad);
  if (bias_) device_->ColumnSum(dz.data(), n, out_, beta, params_[1].grad.data());
  return dx;
}

Result<Tensor> Linear::BackwardInput(const Tensor& dy, const LayerStash& stash, bool need_dx, Tensor* wgrad) {
  return InputGradient(dy, stash, need_dx, wgrad, nullptr);
}

Result<Tensor> Linear::InputGradient(const Tensor& dy_in, const LayerStash& stash, bool need_dx, Tensor* wgrad,
                                     Tensor* dz_operand) {
  if (!StashFits(stash)) return Status::FailedPrecondition(Describe() + ": empty stash");
  const int n = I(stash.tensors[0].dim(0));
  if (dy_in.ndim() < 2 || dy_in.dim(-1) != out_ || dy_in.numel() != int64_t{n} * out_)
    return BadInput(Describe() + " backward", ShapeToString({n, out_}), dy_in);
  const Tensor dy = dy_in.ndim() == 2 ? dy_in : dy_in.Reshape({n, out_});
  *wgrad = dy;
  if (act_ != Activation::kNone) {
    *wgrad = Tensor::Empty(dy.shape(), device_);
    device_->ActivationBackward(act_, stash.tensors[1].data(), dy.data(), static_cast<size_t>(dy.numel()), wgrad->data());
  }
  // The products in the forward's precision.
  const DType type = stash.tensors[0].dtype();
  if (dz_operand) *dz_operand = wgrad->Cast(type);
  if (!need_dx) return Tensor();
  const Tensor dx = Matmul(dz_operand ? *dz_operand : wgrad->Cast(type), BackwardWeight(stash, 0, params_[0], type));
  return stash.shape.empty() ? dx : dx.Reshape(stash.shape);
}

Status Linear::WeightGradients(const std::vector<std::pair<const LayerStash*, const Tensor*>>& parts) {
  int64_t rows = 0;
  for (const auto& [stash, dz] : parts) {
    if (stash == nullptr || dz == nullptr || !StashFits(*stash))
      return Status::FailedPrecondition(Describe() + ": a part without stash or dL/dz");
    const Tensor& x = stash->tensors[0];
    if (x.ndim() != 2 || x.dim(1) != in_ || dz->ndim() != 2 || dz->dim(0) != x.dim(0) || dz->dim(1) != out_ ||
        dz->dtype() != DType::kFloat32)
      return BadInput(Describe() + " weight gradients", ShapeToString({x.dim(0), out_}), *dz);
    if (x.dtype() != parts[0].first->tensors[0].dtype())
      return Status::FailedPrecondition(Describe() + ": weight gradients of micro-batches in two precisions");
    rows += x.dim(0);
  }
  if (rows == 0) {
    ZeroGrad();
    return Status::OK();
  }
  // The parts' rows one after another: one product with a reduction over every row.
  const DType type = parts[0].first->tensors[0].dtype();
  Tensor x_all = Tensor::Empty({rows, in_}, device_, type), dz_all = Tensor::Empty({rows, out_}, device_);
  int64_t row = 0;
  for (const auto& [stash, dz] : parts) {
    const Tensor& x = stash->tensors[0];
    x_all.Rows(row, row + x.dim(0)).CopyFrom(x);
    dz_all.Rows(row, row + x.dim(0)).CopyFrom(*dz);
    row += x.dim(0);
  }
  const int n = I(rows);
  MatmulInto(dz_all.Cast(type), x_all, true, false, 0.0f, params_[0].grad);
  if (bias_) device_->ColumnSum(dz_all.data(), n, out_, 0.0f, params_[1].grad.data());
  return Status::OK();
}

// ---- Activation ------------------------------------------------------------------------------

std::string ActivationLayer::Describe() const { return ActName(act_); }

Result<Tensor> ActivationLayer::Forward(const Tensor& x, const ForwardContext&, LayerStash* stash) {
  if (!x.defined()) return BadInput(Describe(), "a tensor", x);
  Tensor y = act_ == Activation::kRelu ? Relu(x) : act_ == Activation::kGelu ? Gelu(x) : x;
  if (stash) stash->tensors = {act_ == Activation::kRelu ? y : x};
  return y;
}

Result<Tensor> ActivationLayer::Backward(const Tensor& dy, const LayerStash& stash, bool need_dx, bool accumulate) {
  if (stash.tensors.size() != 1) return Status::FailedPrecondition(Describe() + ": empty stash");
  if (dy.numel() != stash.tensors[0].numel())
    return BadInput(Describe() + " backward", ShapeToString(stash.tensors[0].shape()), dy);
  if (!need_dx) return Tensor();
  return ActivationGrad(act_, stash.tensors[0], dy).Reshape(stash.tensors[0].shape());
}

// ---- Conv2d ----------------------------------------------------------------------------------

Conv2dLayer::Conv2dLayer(int in_channels, int out_channels, int kernel, int stride, int pad, Activation act)
    : in_c_(in_channels), out_c_(out_channels), kernel_(kernel), stride_(stride), pad_(pad), act_(act) {
  AddParameter("weight", {out_c_, in_c_, kernel_, kernel_});
  AddParameter("bias", {out_c_});
}

std::string Conv2dLayer::Describe() const {
  return WithAct("Conv2d(" + std::to_string(in_c_) + ", " + std::to_string(out_c_) + ", k=" + std::to_string(kernel_) +
                     ", s=" + std::to_string(stride_) + ", p=" + std::to_string(pad_) + ")",
                 act_);
}

void Conv2dLayer::InitParameters(uint64_t seed) {
  const float bound = 1.0f / std::sqrt(static_cast<float>(in_c_ * kernel_ * kernel_));
  UniformInit(params_[0].value, seed, 0, bound);
  UniformInit(params_[1].value, seed, 1, bound);
}

Result<Tensor> Conv2dLayer::Forward(const Tensor& x, const ForwardContext&, LayerStash* stash) {
  if (x.ndim() != 4 || x.dim(1) != in_c_ || x.dim(2) + 2 * pad_ < kernel_ || x.dim(3) + 2 * pad_ < kernel_)
    return BadInput(Describe(), "[N, " + std::to_string(in_c_) + ", H, W]", x);
  Tensor y = Conv2d(x, params_[0].value, params_[1].value, stride_, pad_);
  if (act_ != Activation::kNone) {
    Tensor z = y;
    if (act_ == Activation::kGelu) y = Tensor::Empty(z.shape(), device_);
    device_->BiasActivation(z.data(), nullptr, 1, I(z.numel()), act_, y.data());
    if (stash) stash->tensors = {x, act_ == Activation::kRelu ? y : z};
  } else if (stash) {
    stash->tensors = {x, Tensor()};
  }
  return y;
}

Result<Tensor> Conv2dLayer::Backward(const Tensor& dy, const LayerStash& stash, bool need_dx, bool accumulate) {
  if (stash.tensors.size() != 2) return Status::FailedPrecondition(Describe() + ": empty stash");
  const Tensor& x = stash.tensors[0];
  Tensor dz = dy;
  if (act_ != Activation::kNone) {
    if (dy.numel() != stash.tensors[1].numel())
      return BadInput(Describe() + " backward", ShapeToString(stash.tensors[1].shape()), dy);
    dz = ActivationGrad(act_, stash.tensors[1], dy).Reshape(stash.tensors[1].shape());
  }
  const int oh = (I(x.dim(2)) + 2 * pad_ - kernel_) / stride_ + 1;
  const int ow = (I(x.dim(3)) + 2 * pad_ - kernel_) / stride_ + 1;
  if (dz.numel() != x.dim(0) * out_c_ * oh * ow)
    return BadInput(Describe() + " backward", ShapeToString({x.dim(0), out_c_, oh, ow}), dy);
  dz = dz.Reshape({x.dim(0), out_c_, oh, ow});
  Conv2dGrads g = Conv2dBackward(x, params_[0].value, dz, stride_, pad_, need_dx, true);
  if (accumulate) {
    device_->Axpy(1.0f, g.dw.data(), static_cast<size_t>(g.dw.numel()), params_[0].grad.data());
    device_->Axpy(1.0f, g.db.data(), static_cast<size_t>(g.db.numel()), params_[1].grad.data());
  } else {
    params_[0].grad.CopyFrom(g.dw);
    params_[1].grad.CopyFrom(g.db);
  }
  return g.dx;
}

// ---- MaxPool2d -------------------------------------------------------------------------------

std::string MaxPool2dLayer::Describe() const {
  return "MaxPool2d(" + std::to_string(kernel_) + ", s=" + std::to_string(stride_) + ")";
}

Result<Tensor> MaxPool2dLayer::Forward(const Tensor& x, const ForwardContext&, LayerStash* stash) {
  if (x.ndim() != 4 || x.dim(2) < kernel_ || x.dim(3) < kernel_)
    return BadInput(Describe(), "[N, C, H, W] with H, W >= " + std::to_string(kernel_), x);
  if (stash) stash->tensors = {x};
  return MaxPool2d(x, kernel_, stride_);
}

Result<Tensor> MaxPool2dLayer::Backward(const Tensor& dy, const LayerStash& stash, bool need_dx, bool accumulate) {
  if (stash.tensors.size() != 1) return Status::FailedPrecondition(Describe() + ": empty stash");
  const Tensor& x = stash.tensors[0];
  const int64_t expect = x.dim(0) * x.dim(1) * ((x.dim(2) - kernel_) / stride_ + 1) * ((x.dim(3) - kernel_) / stride_ + 1);
  if (dy.numel() != expect) return BadInput(Describe() + " backward", std::to_string(expect) + " elements", dy);
  if (!need_dx) return Tensor();
  return MaxPool2dBackward(x, dy, kernel_, stride_);
}

// ---- Flatten ---------------------------------------------------------------------------------

Result<Tensor> Flatten::Forward(const Tensor& x, const ForwardContext&, LayerStash* stash) {
  if (x.ndim() < 1) return BadInput("Flatten", "[N, ...]", x);
  if (stash) stash->shape = x.shape();
  const int64_t n = x.dim(0);
  return x.Reshape({n, n == 0 ? 0 : x.numel() / n});
}

Result<Tensor> Flatten::Backward(const Tensor& dy, const LayerStash& stash, bool need_dx, bool accumulate) {
  if (dy.numel() != NumElements(stash.shape)) return BadInput("Flatten backward", ShapeToString(stash.shape), dy);
  if (!need_dx) return Tensor();
  return dy.Reshape(stash.shape);
}

// ---- LayerNorm -------------------------------------------------------------------------------

LayerNormLayer::LayerNormLayer(int features, float eps) : features_(features), eps_(eps) {
  AddParameter("weight", {features_});
  AddParameter("bias", {features_});
  params_[0].value.Fill(1.0f);
}

std::string LayerNormLayer::Describe() const { return "LayerNorm(" + std::to_string(features_) + ")"; }

void LayerNormLayer::InitParameters(uint64_t) {
  params_[0].value.Fill(1.0f);
  params_[1].value.Fill(0.0f);
}

Result<Tensor> LayerNormLayer::Forward(const Tensor& x, const ForwardContext&, LayerStash* stash) {
  if (x.ndim() < 1 || x.dim(-1) != features_) return BadInput(Describe(), "[..., " + std::to_string(features_) + "]", x);
  LayerNormResult r = LayerNorm(x, params_[0].value, params_[1].value, eps_);
  if (stash) stash->tensors = {x, r.mean, r.rstd};
  return r.y;
}

Result<Tensor> LayerNormLayer::Backward(const Tensor& dy, const LayerStash& stash, bool need_dx, bool accumulate) {
  if (stash.tensors.size() != 3) return Status::FailedPrecondition(Describe() + ": empty stash");
  const Tensor& x = stash.tensors[0];
  if (dy.numel() != x.numel()) return BadInput(Describe() + " backward", ShapeToString(x.shape()), dy);
  const int cols = features_, rows = I(x.numel() / features_);
  Tensor dx = Tensor::Empty(x.shape(), device_);
  if (!accumulate) ZeroGrad();
  device_->LayerNormBackward(dy.data(), x.data(), params_[0].value.data(), stash.tensors[1].data(), stash.tensors[2].data(), rows,
                             cols, dx.data(), params_[0].grad.data(), params_[1].grad.data());
  if (!need_dx) return Tensor();
  return dx;
}

// ---- Dropout ---------------------------------------------------------------------------------

std::string DropoutLayer::Describe() const { return "Dropout(" + std::to_string(p_) + ")"; }

Result<Tensor> DropoutLayer::Forward(const Tensor& x, const ForwardContext& ctx, LayerStash* stash) {
  if (!x.defined()) return BadInput(Describe(), "a tensor", x);
  if (!ctx.training || p_ == 0.0f) {
    if (stash) stash->seed = 0, stash->shape = {};
    return x;
  }
  const uint64_t seed = MixSeed(ctx.seed, static_cast<uint64_t>(index_), 0xD0D0);
  if (stash) stash->seed = seed, stash->shape = {1};  // shape {1}: a mask was applied
  return Dropout(x, p_, seed);
}

Result<Tensor> DropoutLayer::Backward(const Tensor& dy, const LayerStash& stash, bool need_dx, bool accumulate) {
  if (!need_dx) return Tensor();
  if (stash.shape.empty()) return dy;
  return Dropout(dy, p_, stash.seed);
}

}  // namespace copse::ml
