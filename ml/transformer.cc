#include "ml/transformer.h"

#include <cmath>
#include <sstream>

#include "ml/ops.h"
#include "ml/philox.h"

namespace copse::ml {
namespace {

constexpr float kInitStd = 0.02f;
constexpr float kLayerNormEps = 1e-5f;

int I(int64_t v) { return static_cast<int>(v); }

Status BadInput(const std::string& layer, const std::string& expected, const Tensor& x) {
  return Status::InvalidArgument(layer + ": expected input " + expected + ", got " +
                                 (x.defined() ? ShapeToString(x.shape()) : "undefined"));
}

/// y[n, out] = x[n, in] W^T + b for W [out, in] (torch.nn.Linear's layout).
void Dense(Device* d, const float* x, int n, int in, int out, const Parameter& w, const Parameter& b, float* y) {
  d->Gemm(false, true, n, out, in, 1.0f, x, in, w.value.data(), in, 0.0f, y, out);
  d->BiasActivation(y, b.value.data(), n, out, Activation::kNone, y);
}

/// Adds dW += dz^T x and db += column sums of dz; writes dx = dz W when dx is not null.
void DenseBackward(Device* d, const float* x, const float* dz, int n, int in, int out, Parameter& w, Parameter& b, float* dx) {
  d->Gemm(true, false, out, in, n, 1.0f, dz, out, x, in, 1.0f, w.grad.data(), in);
  d->ColumnSum(dz, n, out, 1.0f, b.grad.data());
  if (dx) d->Gemm(false, false, n, in, out, 1.0f, dz, out, w.value.data(), in, 0.0f, dx, in);
}

/// The dropout seed of a layer for this forward pass (as DropoutLayer's).
uint64_t DropoutSeed(const ForwardContext& ctx, int index) { return MixSeed(ctx.seed, static_cast<uint64_t>(index), 0xD0D0); }

bool ParsePositive(const std::string& s, int max, int* out) {
  if (s.empty() || s.size() > 7 || s.find_first_not_of("0123456789") != std::string::npos) return false;
  *out = std::stoi(s);
  return *out >= 1 && *out <= max;
}

}  // namespace

// ---- spec ------------------------------------------------------------------------------------

bool IsLanguageModel(const std::string& model) { return model.rfind("gpt:", 0) == 0; }

Result<GptSpec> ParseGptSpec(const std::string& model) {
  const std::string usage = "expected gpt:LAYERS-WIDTH-HEADS-CONTEXT[,dropout=P], e.g. gpt:4-128-4-64";
  auto bad = [&](const std::string& what) {
    return Status::InvalidArgument("model '" + model + "': " + what + " (" + usage + ")");
  };
  if (!IsLanguageModel(model)) return bad("not a gpt model");
  std::string body = model.substr(4), options;
  if (const size_t comma = body.find(','); comma != std::string::npos) {
    options = body.substr(comma + 1);
    body = body.substr(0, comma);
  }
  std::vector<std::string> parts;
  std::stringstream ss(body);
  for (std::string part; std::getline(ss, part, '-');) parts.push_back(part);
  if (parts.size() != 4 || body.back() == '-') return bad("needs four numbers, got '" + body + "'");
  GptSpec spec;
  const char* names[] = {"LAYERS", "WIDTH", "HEADS", "CONTEXT"};
  const int limits[] = {256, 1 << 14, 1 << 10, 1 << 14};
  int* fields[] = {&spec.layers, &spec.dim, &spec.heads, &spec.context};
  for (int i = 0; i < 4; ++i)
    if (!ParsePositive(parts[static_cast<size_t>(i)], limits[i], fields[i]))
      return bad(std::string(names[i]) + " must be an integer in [1, " + std::to_string(limits[i]) + "], got '" +
                 parts[static_cast<size_t>(i)] + "'");
  if (spec.dim % spec.heads != 0)
    return bad("WIDTH " + std::to_string(spec.dim) + " is not a multiple of HEADS " + std::to_string(spec.heads));
  if (!options.empty()) {
    if (options.rfind("dropout=", 0) != 0) return bad("unknown option '" + options + "'");
    const std::string v = options.substr(8);
    char* end = nullptr;
    const float p = std::strtof(v.c_str(), &end);
    if (v.empty() || end != v.c_str() + v.size() || !(p >= 0.0f && p < 1.0f))
      return bad("dropout must be a number in [0, 1), got '" + v + "'");
    spec.dropout = p;
  }
  return spec;
}

// ---- TokenEmbedding --------------------------------------------------------------------------

TokenEmbedding::TokenEmbedding(int vocab, int dim, int context) : vocab_(vocab), dim_(dim), context_(context) {
  AddParameter("token", {vocab_, dim_});
  AddParameter("position", {context_, dim_});
}

std::string TokenEmbedding::Describe() const {
  return "TokenEmbedding(" + std::to_string(vocab_) + ", " + std::to_string(dim_) + ", context " + std::to_string(context_) + ")";
}

void TokenEmbedding::InitParameters(uint64_t seed) {
  NormalInit(params_[0].value, seed, 0, kInitStd);
  NormalInit(params_[1].value, seed, 1, kInitStd);
}

Result<Tensor> TokenEmbedding::Forward(const Tensor& ids, const ForwardContext&, LayerStash* stash) {
  if (ids.ndim() != 2 || ids.dim(1) < 1)
    return BadInput(Describe(), "token ids [B, T] with 1 <= T <= " + std::to_string(context_), ids);
  if (ids.dim(1) > context_)
    return Status::InvalidArgument(Describe() + ": a sequence of " + std::to_string(ids.dim(1)) +
                                   " tokens is longer than the model's context of " + std::to_string(context_));
  // Ids index memory: check them all (a [B, T] copy, small next to the forward pass).
  const std::vector<float> host = ids.ToVector();
  for (size_t i = 0; i < host.size(); ++i)
    if (!(host[i] >= 0.0f && host[i] < static_cast<float>(vocab_)) || host[i] != std::floor(host[i]))
      return Status::InvalidArgument(Describe() + ": token id " + std::to_string(host[i]) + " at position " + std::to_string(i) +
                                     " is not an integer in [0, " + std::to_string(vocab_) + ")");
  const int b = I(ids.dim(0)), t = I(ids.dim(1));
  Tensor y = Tensor::Empty({b, t, dim_}, device_);
  device_->EmbeddingForward(ids.data(), static_cast<size_t>(b) * t, params_[0].value.data(), dim_, y.data());
  device_->BiasActivation(y.data(), params_[1].value.data(), b, t * dim_, Activation::kNone, y.data());
  if (stash) stash->tensors = {ids};
  return y;
}

Result<Tensor> TokenEmbedding::Backward(const Tensor& dy, const LayerStash& stash, bool, bool accumulate) {
  if (stash.tensors.size() != 1) return Status::FailedPrecondition(Describe() + ": empty stash");
  const Tensor& ids = stash.tensors[0];
  const int b = I(ids.dim(0)), t = I(ids.dim(1));
  if (dy.numel() != int64_t{b} * t * dim_) return BadInput(Describe() + " backward", ShapeToString({b, t, dim_}), dy);
  if (!accumulate) ZeroGrad();
  device_->EmbeddingBackward(ids.data(), static_cast<size_t>(b) * t, dy.data(), vocab_, dim_, 1.0f, params_[0].grad.data());
  device_->ColumnSum(dy.data(), b, t * dim_, 1.0f, params_[1].grad.data());  // rows t.. of a shorter batch stay
  return Tensor();
}

// ---- AttentionBlock --------------------------------------------------------------------------
// Stash: x, LayerNorm mean and rstd, h = LayerNorm(x), qkv [N, 3D], the probabilities P
// [B, H, T, T], and o [N, D] (the heads' outputs side by side, before the projection).
// Head j of row block b is the column block j * D/H of q, k and v within qkv; the per-head
// products are one BatchedGemm each, over (b, j).

AttentionBlock::AttentionBlock(int dim, int heads, float dropout, float proj_std)
    : dim_(dim), heads_(heads), dropout_(dropout), proj_std_(proj_std) {
  AddParameter("ln.weight", {dim_});
  AddParameter("ln.bias", {dim_});
  AddParameter("qkv.weight", {3 * dim_, dim_});
  AddParameter("qkv.bias", {3 * dim_});
  AddParameter("proj.weight", {dim_, dim_});
  AddParameter("proj.bias", {dim_});
  params_[0].value.Fill(1.0f);
}

std::string AttentionBlock::Describe() const {
  return "AttentionBlock(" + std::to_string(dim_) + ", heads " + std::to_string(heads_) + ")";
}

void AttentionBlock::InitParameters(uint64_t seed) {
  params_[0].value.Fill(1.0f);
  params_[1].value.Fill(0.0f);
  NormalInit(params_[2].value, seed, 2, kInitStd);
  params_[3].value.Fill(0.0f);
  NormalInit(params_[4].value, seed, 4, proj_std_);
  params_[5].value.Fill(0.0f);
}

Result<Tensor> AttentionBlock::Forward(const Tensor& x, const ForwardContext& ctx, LayerStash* stash) {
  if (x.ndim() != 3 || x.dim(2) != dim_ || x.dim(1) < 1) return BadInput(Describe(), "[B, T, " + std::to_string(dim_) + "]", x);
  Device* d = device_;
  const int b = I(x.dim(0)), t = I(x.dim(1)), n = b * t, dh = dim_ / heads_, d3 = 3 * dim_;
  LayerNormResult ln = LayerNorm(x, params_[0].value, params_[1].value, kLayerNormEps);
  Tensor qkv = Tensor::Empty({n, d3}, d);
  Dense(d, ln.y.data(), n, dim_, d3, params_[2], params_[3], qkv.data());

  Tensor p = Tensor::Empty({b, heads_, t, t}, d);
  Device::GemmBatch scores{b, heads_, int64_t{t} * d3, dh, int64_t{t} * d3, dh, int64_t{heads_} * t * t, int64_t{t} * t};
  d->BatchedGemm(false, true, t, t, dh, 1.0f / std::sqrt(static_cast<float>(dh)), qkv.data(), d3, qkv.data() + dim_, d3, 0.0f,
                 p.data(), t, scores);
  d->CausalSoftmax(p.data(), b * heads_, t, p.data());
  Tensor o = Tensor::Empty({n, dim_}, d);
  Device::GemmBatch mix{b, heads_, int64_t{heads_} * t * t, int64_t{t} * t, int64_t{t} * d3, dh, int64_t{t} * dim_, dh};
  d->BatchedGemm(false, false, t, dh, t, 1.0f, p.data(), t, qkv.data() + 2 * dim_, d3, 0.0f, o.data(), dim_, mix);

  Tensor y = Tensor::Empty({b, t, dim_}, d);
  Dense(d, o.data(), n, dim_, dim_, params_[4], params_[5], y.data());
  const bool drop = ctx.training && dropout_ > 0.0f;
  const uint64_t seed = drop ? DropoutSeed(ctx, index_) : 0;
  if (drop) d->Dropout(y.data(), static_cast<size_t>(y.numel()), dropout_, seed, y.data());
  d->Axpy(1.0f, x.data(), static_cast<size_t>(y.numel()), y.data());
  if (stash) {
    stash->tensors = {x, ln.mean, ln.rstd, ln.y, qkv, p, o};
    stash->seed = seed;
    stash->shape = drop ? Shape{1} : Shape{};
  }
  return y;
}

Result<Tensor> AttentionBlock::Backward(const Tensor& dy, const LayerStash& stash, bool need_dx, bool accumulate) {
  if (stash.tensors.size() != 7) return Status::FailedPrecondition(Describe() + ": empty stash");
  const Tensor &x = stash.tensors[0], &mean = stash.tensors[1], &rstd = stash.tensors[2], &h = stash.tensors[3],
               &qkv = stash.tensors[4], &p = stash.tensors[5], &o = stash.tensors[6];
  if (dy.numel() != x.numel()) return BadInput(Describe() + " backward", ShapeToString(x.shape()), dy);
  Device* d = device_;
  const int b = I(x.dim(0)), t = I(x.dim(1)), n = b * t, dh = dim_ / heads_, d3 = 3 * dim_;
  if (!accumulate) ZeroGrad();

  Tensor dz = dy;
  if (!stash.shape.empty()) dz = Dropout(dy, dropout_, stash.seed);
  Tensor dout = Tensor::Empty({n, dim_}, d);
  DenseBackward(d, o.data(), dz.data(), n, dim_, dim_, params_[4], params_[5], dout.data());

  // dP = dO V^T, dV = P^T dO, dS = softmax'(dP), dQ = s dS K, dK = s dS^T Q.
  const float scale = 1.0f / std::sqrt(static_cast<float>(dh));
  Tensor dp = Tensor::Empty({b, heads_, t, t}, d);
  Tensor dqkv = Tensor::Empty({n, d3}, d);
  const int64_t per_p = int64_t{heads_} * t * t, blk = int64_t{t} * t, row3 = int64_t{t} * d3, row1 = int64_t{t} * dim_;
  d->BatchedGemm(false, true, t, t, dh, 1.0f, dout.data(), dim_, qkv.data() + 2 * dim_, d3, 0.0f, dp.data(), t,
                 {b, heads_, row1, dh, row3, dh, per_p, blk});
  d->BatchedGemm(true, false, t, dh, t, 1.0f, p.data(), t, dout.data(), dim_, 0.0f, dqkv.data() + 2 * dim_, d3,
                 {b, heads_, per_p, blk, row1, dh, row3, dh});
  d->CausalSoftmaxBackward(p.data(), dp.data(), b * heads_, t, dp.data());
  d->BatchedGemm(false, false, t, dh, t, scale, dp.data(), t, qkv.data() + dim_, d3, 0.0f, dqkv.data(), d3,
                 {b, heads_, per_p, blk, row3, dh, row3, dh});
  d->BatchedGemm(true, false, t, dh, t, scale, dp.data(), t, qkv.data(), d3, 0.0f, dqkv.data() + dim_, d3,
                 {b, heads_, per_p, blk, row3, dh, row3, dh});

  Tensor dh_ln = Tensor::Empty({n, dim_}, d);
  DenseBackward(d, h.data(), dqkv.data(), n, dim_, d3, params_[2], params_[3], dh_ln.data());
  Tensor dx = Tensor::Empty(x.shape(), d);
  d->LayerNormBackward(dh_ln.data(), x.data(), params_[0].value.data(), mean.data(), rstd.data(), n, dim_, dx.data(),
                       params_[0].grad.data(), params_[1].grad.data());
  if (!need_dx) return Tensor();
  d->Axpy(1.0f, dy.data(), static_cast<size_t>(dx.numel()), dx.data());  // the residual path
  return dx;
}

// ---- MlpBlock --------------------------------------------------------------------------------
// Stash: x, LayerNorm mean and rstd, h = LayerNorm(x), z = Fc(h) [N, 4D] and a = GELU(z).

MlpBlock::MlpBlock(int dim, float dropout, float proj_std) : dim_(dim), dropout_(dropout), proj_std_(proj_std) {
  AddParameter("ln.weight", {dim_});
  AddParameter("ln.bias", {dim_});
  AddParameter("fc.weight", {4 * dim_, dim_});
  AddParameter("fc.bias", {4 * dim_});
  AddParameter("proj.weight", {dim_, 4 * dim_});
  AddParameter("proj.bias", {dim_});
  params_[0].value.Fill(1.0f);
}

std::string MlpBlock::Describe() const { return "MlpBlock(" + std::to_string(dim_) + ", " + std::to_string(4 * dim_) + ")"; }

void MlpBlock::InitParameters(uint64_t seed) {
  params_[0].value.Fill(1.0f);
  params_[1].value.Fill(0.0f);
  NormalInit(params_[2].value, seed, 2, kInitStd);
  params_[3].value.Fill(0.0f);
  NormalInit(params_[4].value, seed, 4, proj_std_);
  params_[5].value.Fill(0.0f);
}

Result<Tensor> MlpBlock::Forward(const Tensor& x, const ForwardContext& ctx, LayerStash* stash) {
  if (x.ndim() != 3 || x.dim(2) != dim_) return BadInput(Describe(), "[B, T, " + std::to_string(dim_) + "]", x);
  Device* d = device_;
  const int n = I(x.dim(0) * x.dim(1)), wide = 4 * dim_;
  LayerNormResult ln = LayerNorm(x, params_[0].value, params_[1].value, kLayerNormEps);
  Tensor z = Tensor::Empty({n, wide}, d), a = Tensor::Empty({n, wide}, d);
  Dense(d, ln.y.data(), n, dim_, wide, params_[2], params_[3], z.data());
  d->BiasActivation(z.data(), nullptr, n, wide, Activation::kGelu, a.data());
  Tensor y = Tensor::Empty(x.shape(), d);
  Dense(d, a.data(), n, wide, dim_, params_[4], params_[5], y.data());
  const bool drop = ctx.training && dropout_ > 0.0f;
  const uint64_t seed = drop ? DropoutSeed(ctx, index_) : 0;
  if (drop) d->Dropout(y.data(), static_cast<size_t>(y.numel()), dropout_, seed, y.data());
  d->Axpy(1.0f, x.data(), static_cast<size_t>(y.numel()), y.data());
  if (stash) {
    stash->tensors = {x, ln.mean, ln.rstd, ln.y, z, a};
    stash->seed = seed;
    stash->shape = drop ? Shape{1} : Shape{};
  }
  return y;
}

Result<Tensor> MlpBlock::Backward(const Tensor& dy, const LayerStash& stash, bool need_dx, bool accumulate) {
  if (stash.tensors.size() != 6) return Status::FailedPrecondition(Describe() + ": empty stash");
  const Tensor &x = stash.tensors[0], &mean = stash.tensors[1], &rstd = stash.tensors[2], &h = stash.tensors[3],
               &z = stash.tensors[4], &a = stash.tensors[5];
  if (dy.numel() != x.numel()) return BadInput(Describe() + " backward", ShapeToString(x.shape()), dy);
  Device* d = device_;
  const int n = I(x.dim(0) * x.dim(1)), wide = 4 * dim_;
  if (!accumulate) ZeroGrad();
  Tensor dz2 = dy;
  if (!stash.shape.empty()) dz2 = Dropout(dy, dropout_, stash.seed);
  Tensor da = Tensor::Empty({n, wide}, d);
  DenseBackward(d, a.data(), dz2.data(), n, wide, dim_, params_[4], params_[5], da.data());
  d->ActivationBackward(Activation::kGelu, z.data(), da.data(), static_cast<size_t>(da.numel()), da.data());
  Tensor dh_ln = Tensor::Empty({n, dim_}, d);
  DenseBackward(d, h.data(), da.data(), n, dim_, wide, params_[2], params_[3], dh_ln.data());
  Tensor dx = Tensor::Empty(x.shape(), d);
  d->LayerNormBackward(dh_ln.data(), x.data(), params_[0].value.data(), mean.data(), rstd.data(), n, dim_, dx.data(),
                       params_[0].grad.data(), params_[1].grad.data());
  if (!need_dx) return Tensor();
  d->Axpy(1.0f, dy.data(), static_cast<size_t>(dx.numel()), dx.data());
  return dx;
}

}  // namespace copse::ml
