#pragma once
// Tensor-level operations: shape-checked wrappers over Device kernels that allocate their
// results on the inputs' device (allocation is cheap: freed blocks are cached per device).
// Layers are built from these; tests compare them across devices.
// Preconditions (shapes, same device) are programming errors and throw std::invalid_argument;
// data-dependent failures (e.g. a label out of range) come back as Status.
// Thread-safety: stateless; safe to call concurrently on distinct tensors.
#include <cstdint>
#include <span>

#include "ml/tensor.h"

namespace copse::ml {

/// op(a) * op(b) for 2-D tensors; op transposes when requested. a and b are both float32 or
/// both bfloat16 (mixed precision: float32 accumulation); the result is float32.
Tensor Matmul(const Tensor& a, const Tensor& b, bool trans_a = false, bool trans_b = false);
/// c = op(a) * op(b) + beta * c into an existing float32 c, with Matmul's types.
void MatmulInto(const Tensor& a, const Tensor& b, bool trans_a, bool trans_b, float beta, const Tensor& c);
/// What a product of `precision` multiplies: `t` in float32, or converted to bfloat16.
Tensor ProductOperand(const Tensor& t, Precision precision);
/// act(x * w^T + bias): x [N, in], w [out, in] (PyTorch's Linear layout), bias [out] or undefined.
Tensor LinearForward(const Tensor& x, const Tensor& w, const Tensor& bias, Activation act = Activation::kNone);
/// x + bias over the last dimension.
Tensor BiasAdd(const Tensor& x, const Tensor& bias);
Tensor Relu(const Tensor& x);
/// Exact (erf) GELU, PyTorch's nn.GELU() default.
Tensor Gelu(const Tensor& x);
/// dy * act'(.): `saved` is the output for ReLU, the input for GELU.
Tensor ActivationGrad(Activation act, const Tensor& saved, const Tensor& dy);
/// Softmax over the last dimension.
Tensor Softmax(const Tensor& x);

struct CrossEntropyResult {
  double loss_sum = 0;  // sum over rows of -log softmax(logits)[label]
  Tensor grad;          // d(loss_sum * grad_scale)/dlogits
};
/// Softmax cross-entropy of logits [N, C] with labels in [0, C).
Result<CrossEntropyResult> SoftmaxCrossEntropy(const Tensor& logits, std::span<const int32_t> labels, float grad_scale);

/// Conv2d over NCHW: x [N, C, H, W], w [O, C, kh, kw], bias [O] or undefined.
Tensor Conv2d(const Tensor& x, const Tensor& w, const Tensor& bias, int stride, int pad);
struct Conv2dGrads {
  Tensor dx;  // undefined when not requested
  Tensor dw;
  Tensor db;
};
Conv2dGrads Conv2dBackward(const Tensor& x, const Tensor& w, const Tensor& dy, int stride, int pad, bool need_dx, bool has_bias);

/// Max-pooling with a square window, no padding.
Tensor MaxPool2d(const Tensor& x, int kernel, int stride);
Tensor MaxPool2dBackward(const Tensor& x, const Tensor& dy, int kernel, int stride);

struct LayerNormResult {
  Tensor y, mean, rstd;
};
/// Layer norm over the last dimension (gamma, beta of that size).
LayerNormResult LayerNorm(const Tensor& x, const Tensor& gamma, const Tensor& beta, float eps);
struct LayerNormGrads {
  Tensor dx, dgamma, dbeta;
};
LayerNormGrads LayerNormBackward(const Tensor& dy, const Tensor& x, const Tensor& gamma, const Tensor& mean, const Tensor& rstd);

/// Inverted dropout: keeps element i iff PhiloxUniform(seed, 0, i) >= p and scales by 1/(1-p).
/// The same call on dy is the backward pass.
Tensor Dropout(const Tensor& x, float p, uint64_t seed);

/// Index of the largest logit per row (host result).
std::vector<int32_t> ArgmaxRows(const Tensor& logits);

}  // namespace copse::ml
