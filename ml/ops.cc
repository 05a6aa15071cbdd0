#include "ml/ops.h"

#include <stdexcept>

namespace copse::ml {
namespace {

void Require(bool condition, const char* op, const std::string& what) {
  if (!condition) throw std::invalid_argument(std::string(op) + ": " + what);
}

void SameDevice(const char* op, const Tensor& a, const Tensor& b) {
  Require(a.device() == b.device(), op, "tensors on different devices (" + a.device()->name() + ", " + b.device()->name() + ")");
}

int I(int64_t v) { return static_cast<int>(v); }

ConvGeom Geom(const Tensor& x, int kh, int kw, int stride, int pad) {
  ConvGeom g;
  g.batch = I(x.dim(0));
  g.channels = I(x.dim(1));
  g.height = I(x.dim(2));
  g.width = I(x.dim(3));
  g.kernel_h = kh;
  g.kernel_w = kw;
  g.stride = stride;
  g.pad = pad;
  return g;
}

}  // namespace

Tensor Matmul(const Tensor& a, const Tensor& b, bool trans_a, bool trans_b) {
  Require(a.ndim() == 2 && b.ndim() == 2, "Matmul", "expects 2-D tensors");
  const int64_t m = trans_a ? a.dim(1) : a.dim(0), n = trans_b ? b.dim(0) : b.dim(1);
  Tensor c = Tensor::Empty({m, n}, a.device());
  MatmulInto(a, b, trans_a, trans_b, 0.0f, c);
  return c;
}

void MatmulInto(const Tensor& a, const Tensor& b, bool trans_a, bool trans_b, float beta, const Tensor& c) {
  Require(a.ndim() == 2 && b.ndim() == 2 && c.ndim() == 2, "Matmul", "expects 2-D tensors");
  SameDevice("Matmul", a, b);
  SameDevice("Matmul", a, c);
  Require(a.dtype() == b.dtype(), "Matmul",
          std::string("operands of two types: ") + DTypeName(a.dtype()) + " x " + DTypeName(b.dtype()));
  const int64_t m = trans_a ? a.dim(1) : a.dim(0), k = trans_a ? a.dim(0) : a.dim(1);
  const int64_t kb = trans_b ? b.dim(1) : b.dim(0), n = trans_b ? b.dim(0) : b.dim(1);
  Require(k == kb, "Matmul", "inner dimensions differ: " + ShapeToString(a.shape()) + " x " + ShapeToString(b.shape()));
  Require(c.dim(0) == m && c.dim(1) == n, "Matmul",
          "result " + ShapeToString(c.shape()) + " for a product of [" + std::to_string(m) + ", " + std::to_string(n) + "]");
  Device* d = a.device();
  if (a.dtype() == DType::kBFloat16)
    d->GemmBf16(trans_a, trans_b, I(m), I(n), I(k), 1.0f, a.bf16_data(), I(a.dim(1)), b.bf16_data(), I(b.dim(1)), beta, c.data(),
                I(n));
  else if (a.dtype() == DType::kFloat16)
    d->GemmF16(trans_a, trans_b, I(m), I(n), I(k), 1.0f, a.f16_data(), I(a.dim(1)), b.f16_data(), I(b.dim(1)), beta, c.data(),
               I(n));
  else
    d->Gemm(trans_a, trans_b, I(m), I(n), I(k), 1.0f, a.data(), I(a.dim(1)), b.data(), I(b.dim(1)), beta, c.data(), I(n));
}

Tensor ProductOperand(const Tensor& t, Precision precision) { return t.Cast(ProductType(precision)); }

Tensor LinearForward(const Tensor& x, const Tensor& w, const Tensor& bias, Activation act) {
  Require(x.ndim() == 2 && w.ndim() == 2 && x.dim(1) == w.dim(1), "Linear",
          "x " + ShapeToString(x.shape()) + " does not fit weight " + ShapeToString(w.shape()));
  Require(!bias.defined() || bias.numel() == w.dim(0), "Linear", "bias size");
  Tensor y = Matmul(x, w, false, true);
  if (bias.defined() || act != Activation::kNone)
    y.device()->BiasActivation(y.data(), bias.defined() ? bias.data() : nullptr, I(y.dim(0)), I(y.dim(1)), act, y.data());
  return y;
}

Tensor BiasAdd(const Tensor& x, const Tensor& bias) {
  Require(x.ndim() >= 1 && bias.numel() == x.dim(-1), "BiasAdd", "bias size");
  SameDevice("BiasAdd", x, bias);
  Tensor y = Tensor::Empty(x.shape(), x.device());
  x.device()->BiasActivation(x.data(), bias.data(), I(x.numel() / x.dim(-1)), I(x.dim(-1)), Activation::kNone, y.data());
  return y;
}

static Tensor Act(const Tensor& x, Activation act) {
  Tensor y = Tensor::Empty(x.shape(), x.device());
  if (x.numel() > 0) x.device()->BiasActivation(x.data(), nullptr, 1, I(x.numel()), act, y.data());
  return y;
}

Tensor Relu(const Tensor& x) { return Act(x, Activation::kRelu); }
Tensor Gelu(const Tensor& x) { return Act(x, Activation::kGelu); }

Tensor ActivationGrad(Activation act, const Tensor& saved, const Tensor& dy) {
  Require(saved.numel() == dy.numel(), "ActivationGrad", "shapes differ");
  SameDevice("ActivationGrad", saved, dy);
  Tensor dx = Tensor::Empty(dy.shape(), dy.device());
  dy.device()->ActivationBackward(act, saved.data(), dy.data(), static_cast<size_t>(dy.numel()), dx.data());
  return dx;
}

Tensor Softmax(const Tensor& x) {
  Require(x.ndim() >= 1, "Softmax", "expects at least 1-D");
  Tensor y = Tensor::Empty(x.shape(), x.device());
  x.device()->Softmax(x.data(), I(x.numel() / x.dim(-1)), I(x.dim(-1)), y.data());
  return y;
}

Result<CrossEntropyResult> SoftmaxCrossEntropy(const Tensor& logits, std::span<const int32_t> labels, float grad_scale) {
  Require(logits.ndim() == 2, "SoftmaxCrossEntropy", "logits must be [N, C]");
  const int64_t rows = logits.dim(0), cols = logits.dim(1);
  if (static_cast<int64_t>(labels.size()) != rows)
    return Status::InvalidArgument("cross-entropy: " + std::to_string(labels.size()) + " labels for " + std::to_string(rows) +
                                   " rows of logits");
  for (size_t i = 0; i < labels.size(); ++i)
    if (labels[i] < 0 || labels[i] >= cols)
      return Status::InvalidArgument("cross-entropy: label " + std::to_string(labels[i]) + " at row " + std::to_string(i) +
                                     " is outside [0, " + std::to_string(cols) + ")");
  CrossEntropyResult r;
  r.grad = Tensor::Empty(logits.shape(), logits.device());
  r.loss_sum = logits.device()->SoftmaxCrossEntropy(logits.data(), labels.data(), I(rows), I(cols), grad_scale, r.grad.data());
  return r;
}

Tensor Conv2d(const Tensor& x, const Tensor& w, const Tensor& bias, int stride, int pad) {
  Require(x.ndim() == 4 && w.ndim() == 4 && x.dim(1) == w.dim(1), "Conv2d",
          "x " + ShapeToString(x.shape()) + " does not fit weight " + ShapeToString(w.shape()));
  SameDevice("Conv2d", x, w);
  const ConvGeom g = Geom(x, I(w.dim(2)), I(w.dim(3)), stride, pad);
  Require(g.out_h() > 0 && g.out_w() > 0, "Conv2d", "kernel larger than the padded input");
  Device* dev = x.device();
  const int64_t out_c = w.dim(0), spatial = int64_t{g.out_h()} * g.out_w();
  const int64_t ckk = w.numel() / out_c, ncols = g.batch * spatial;
  Tensor col = Tensor::Empty({ckk, ncols}, dev);
  dev->Im2Col(x.data(), g, col.data());
  // [O, C*k*k] x [C*k*k, N*oh*ow] -> [O, N, oh*ow], plus bias, then -> [N, O, oh, ow].
  Tensor out_cnhw = Tensor::Empty({out_c, ncols}, dev);
  dev->Gemm(false, false, I(out_c), I(ncols), I(ckk), 1.0f, w.data(), I(ckk), col.data(), I(ncols), 0.0f, out_cnhw.data(),
            I(ncols));
  if (bias.defined()) {  // out[o, :] += bias[o]: a rank-1 update on the [O, N*oh*ow] layout
    Tensor ones = Tensor::Full({1, ncols}, 1.0f, dev);
    dev->Gemm(false, false, I(out_c), I(ncols), 1, 1.0f, bias.data(), 1, ones.data(), I(ncols), 1.0f, out_cnhw.data(), I(ncols));
  }
  Tensor y = Tensor::Empty({g.batch, out_c, g.out_h(), g.out_w()}, dev);
  dev->SwapOuterAxes(out_cnhw.data(), I(out_c), g.batch, I(spatial), y.data());
  return y;
}

Conv2dGrads Conv2dBackward(const Tensor& x, const Tensor& w, const Tensor& dy, int stride, int pad, bool need_dx, bool has_bias) {
  const ConvGeom g = Geom(x, I(w.dim(2)), I(w.dim(3)), stride, pad);
  Require(dy.ndim() == 4 && dy.dim(0) == g.batch && dy.dim(1) == w.dim(0) && dy.dim(2) == g.out_h() && dy.dim(3) == g.out_w(),
          "Conv2dBackward", "dy shape " + ShapeToString(dy.shape()));
  Device* dev = x.device();
  const int64_t out_c = w.dim(0), spatial = int64_t{g.out_h()} * g.out_w();
  const int64_t ckk = w.numel() / out_c, ncols = g.batch * spatial;
  Tensor col = Tensor::Empty({ckk, ncols}, dev);
  dev->Im2Col(x.data(), g, col.data());
  Tensor dy_cnhw = Tensor::Empty({out_c, ncols}, dev);
  dev->SwapOuterAxes(dy.data(), g.batch, I(out_c), I(spatial), dy_cnhw.data());
  Conv2dGrads grads;
  grads.dw = Tensor::Empty(w.shape(), dev);
  dev->Gemm(false, true, I(out_c), I(ckk), I(ncols), 1.0f, dy_cnhw.data(), I(ncols), col.data(), I(ncols), 0.0f, grads.dw.data(),
            I(ckk));
  if (has_bias) {
    grads.db = Tensor::Empty({out_c}, dev);
    Tensor ones = Tensor::Full({ncols, 1}, 1.0f, dev);
    dev->Gemm(false, false, I(out_c), 1, I(ncols), 1.0f, dy_cnhw.data(), I(ncols), ones.data(), 1, 0.0f, grads.db.data(), 1);
  }
  if (need_dx) {
    dev->Gemm(true, false, I(ckk), I(ncols), I(out_c), 1.0f, w.data(), I(ckk), dy_cnhw.data(), I(ncols), 0.0f, col.data(),
              I(ncols));
    grads.dx = Tensor::Empty(x.shape(), dev);
    dev->Col2Im(col.data(), g, grads.dx.data());
  }
  return grads;
}

Tensor MaxPool2d(const Tensor& x, int kernel, int stride) {
  Require(x.ndim() == 4, "MaxPool2d", "expects NCHW");
  const ConvGeom g = Geom(x, kernel, kernel, stride, 0);
  Require(g.out_h() > 0 && g.out_w() > 0, "MaxPool2d", "window larger than the input");
  Tensor y = Tensor::Empty({g.batch, g.channels, g.out_h(), g.out_w()}, x.device());
  x.device()->MaxPoolForward(x.data(), g, y.data());
  return y;
}

Tensor MaxPool2dBackward(const Tensor& x, const Tensor& dy, int kernel, int stride) {
  const ConvGeom g = Geom(x, kernel, kernel, stride, 0);
  Require(dy.numel() == int64_t{g.batch} * g.channels * g.out_h() * g.out_w(), "MaxPool2dBackward",
          "dy shape " + ShapeToString(dy.shape()));
  Tensor dx = Tensor::Empty(x.shape(), x.device());
  x.device()->MaxPoolBackward(x.data(), dy.data(), g, dx.data());
  return dx;
}

LayerNormResult LayerNorm(const Tensor& x, const Tensor& gamma, const Tensor& beta, float eps) {
  Require(x.ndim() >= 1 && gamma.numel() == x.dim(-1) && beta.numel() == x.dim(-1), "LayerNorm",
          "gamma/beta must match the last dimension of " + ShapeToString(x.shape()));
  const int64_t cols = x.dim(-1), rows = x.numel() / cols;
  LayerNormResult r;
  r.y = Tensor::Empty(x.shape(), x.device());
  r.mean = Tensor::Empty({rows}, x.device());
  r.rstd = Tensor::Empty({rows}, x.device());
  x.device()->LayerNormForward(x.data(), gamma.data(), beta.data(), I(rows), I(cols), eps, r.y.data(), r.mean.data(),
                               r.rstd.data());
  return r;
}

LayerNormGrads LayerNormBackward(const Tensor& dy, const Tensor& x, const Tensor& gamma, const Tensor& mean, const Tensor& rstd) {
  const int64_t cols = x.dim(-1), rows = x.numel() / cols;
  LayerNormGrads g;
  g.dx = Tensor::Empty(x.shape(), x.device());
  g.dgamma = Tensor::Zeros({cols}, x.device());
  g.dbeta = Tensor::Zeros({cols}, x.device());
  x.device()->LayerNormBackward(dy.data(), x.data(), gamma.data(), mean.data(), rstd.data(), I(rows), I(cols), g.dx.data(),
                                g.dgamma.data(), g.dbeta.data());
  return g;
}

Tensor Dropout(const Tensor& x, float p, uint64_t seed) {
  Require(p >= 0.0f && p <= 1.0f, "Dropout", "p must be in [0, 1]");
  Tensor y = Tensor::Empty(x.shape(), x.device());
  x.device()->Dropout(x.data(), static_cast<size_t>(x.numel()), p, seed, y.data());
  return y;
}

std::vector<int32_t> ArgmaxRows(const Tensor& logits) {
  const int64_t cols = logits.dim(-1), rows = logits.numel() / std::max<int64_t>(cols, 1);
  const std::vector<float> v = logits.ToVector();
  std::vector<int32_t> out(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) {
    int32_t best = 0;
    for (int64_t c = 1; c < cols; ++c)
      if (v[r * cols + c] > v[r * cols + best]) best = static_cast<int32_t>(c);
    out[r] = best;
  }
  return out;
}

}  // namespace copse::ml
