#pragma once
// Device: the one interface behind which every numerical kernel of copse::ml lives. A Device
// owns memory allocation on its hardware and implements a fixed set of float32 kernels on raw
// device pointers (row-major, contiguous). Tensors, layers, losses and optimizers are written
// once against this interface; CpuDevice (OpenBLAS + plain loops) is always present, the CUDA
// device (cuBLAS + own kernels, in ml/cuda/) only when the toolkit was found at build time.
//
// Ownership: devices are process-wide singletons that outlive every tensor; callers never
// delete them. Memory returned by Allocate belongs to the caller until Free; freed blocks are
// cached per size and reused (no allocation in a steady-state training loop).
// Thread-safety: Allocate/Free are thread-safe. Kernels may run concurrently on disjoint
// memory; on CUDA they are issued on one stream per device and ordered.
// Determinism: every kernel gives bit-identical results for identical inputs on the same
// device and thread count; random kernels depend only on (seed, element index).
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"
#include "ml/dtype.h"  // COPSE_ML_HOST_DEVICE

namespace copse::ml {

enum class DeviceType { kCpu, kCuda };

/// Geometry of a 2-D convolution or pooling window over an NCHW batch.
struct ConvGeom {
  int batch = 0, channels = 0, height = 0, width = 0;
  int kernel_h = 0, kernel_w = 0, stride = 1, pad = 0;
  COPSE_ML_HOST_DEVICE int out_h() const { return (height + 2 * pad - kernel_h) / stride + 1; }
  COPSE_ML_HOST_DEVICE int out_w() const { return (width + 2 * pad - kernel_w) / stride + 1; }
};

enum class Activation { kNone, kRelu, kGelu };

class Device {
 public:
  virtual ~Device() = default;
  virtual DeviceType type() const = 0;
  /// "cpu" or "cuda:0".
  virtual std::string name() const = 0;

  // ---- memory ----------------------------------------------------------------------------
  virtual void* Allocate(size_t bytes) = 0;
  virtual void Free(void* ptr, size_t bytes) = 0;
  virtual void CopyFromHost(void* dst, const void* src, size_t bytes) = 0;
  virtual void CopyToHost(void* dst, const void* src, size_t bytes) = 0;
  virtual void CopyOnDevice(void* dst, const void* src, size_t bytes) = 0;
  /// Waits until every kernel issued so far has finished (no-op on the CPU).
  virtual void Synchronize() {}

  // ---- dense algebra ---------------------------------------------------------------------
  /// C[m,n] = alpha * op(A) * op(B) + beta * C, row-major; op(X) = X^T when trans_x.
  virtual void Gemm(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a, int lda, const float* b,
                    int ldb, float beta, float* c, int ldc) = 0;
  /// Gemm on bfloat16 operands (ml/dtype.h): the products accumulate in float32 and C is
  /// float32. The default widens A and B to float32 and calls Gemm (the same values, slowly);
  /// the CPU runs oneDNN's bfloat16 kernels (AMX or AVX512-BF16 where the CPU has them), CUDA
  /// cuBLAS's.
  virtual void GemmBf16(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const uint16_t* a, int lda,
                        const uint16_t* b, int ldb, float beta, float* c, int ldc);
  /// y[i] = bfloat16(x[i]), rounded to nearest even (FloatToBFloat16 of ml/dtype.h).
  virtual void FloatToBFloat16(const float* x, size_t n, uint16_t* y) = 0;
  /// y[i] = float32(x[i]) (exact).
  virtual void BFloat16ToFloat(const uint16_t* x, size_t n, float* y) = 0;
  /// Gemm on float16 operands, accumulated in float32 (C float32). The default widens A and B to
  /// float32 and calls Gemm (the same values: the CPU, which has no float16 products here); CUDA
  /// runs cuBLAS's on the tensor cores.
  virtual void GemmF16(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const uint16_t* a, int lda,
                       const uint16_t* b, int ldb, float beta, float* c, int ldc);
  /// y[i] = float16(x[i]) (FloatToFloat16 of ml/dtype.h: nearest even, overflow to infinity).
  virtual void FloatToFloat16(const float* x, size_t n, uint16_t* y) = 0;
  /// y[i] = float32(x[i]) (exact).
  virtual void Float16ToFloat(const uint16_t* x, size_t n, float* y) = 0;
  /// y[r,c] = act(x[r,c] + bias[c]) (x may alias y; bias may be null).
  virtual void BiasActivation(const float* x, const float* bias, int rows, int cols, Activation act, float* y) = 0;
  /// dx = dy * act'(.) where `saved` is the activation's output for ReLU and its input for
  /// GELU. dx may alias dy.
  virtual void ActivationBackward(Activation act, const float* saved, const float* dy, size_t n, float* dx) = 0;
  /// out[c] = beta * out[c] + sum_r x[r,c].
  virtual void ColumnSum(const float* x, int rows, int cols, float beta, float* out) = 0;
  /// out[a, b, i] = x[b, a, i] for x of shape [B, A, inner] (swaps the two outer axes).
  virtual void SwapOuterAxes(const float* x, int b, int a, int inner, float* out) = 0;
  virtual void Fill(float* x, size_t n, float value) = 0;
  /// y = alpha * x + y.
  virtual void Axpy(float alpha, const float* x, size_t n, float* y) = 0;
  /// out = a * b elementwise.
  virtual void Multiply(const float* a, const float* b, size_t n, float* out) = 0;

  // ---- softmax and loss ------------------------------------------------------------------
  virtual void Softmax(const float* x, int rows, int cols, float* y) = 0;
  /// Softmax cross-entropy with integer labels (host pointer). Returns the SUM of per-row
  /// losses; writes dlogits = (softmax - onehot) * grad_scale when dlogits is not null.
  virtual double SoftmaxCrossEntropy(const float* logits, const int32_t* host_labels, int rows, int cols, float grad_scale,
                                     float* dlogits) = 0;

  // ---- convolution and pooling -----------------------------------------------------------
  /// col[(c*kh+i)*kw+j, (b*oh+y)*ow+x] = input pixel under that kernel tap (0 in the padding).
  virtual void Im2Col(const float* x, const ConvGeom& g, float* col) = 0;
  /// The adjoint of Im2Col: dx = sum of col taps (dx is overwritten).
  virtual void Col2Im(const float* col, const ConvGeom& g, float* dx) = 0;
  /// Max-pooling forward (window kernel_h x kernel_w, stride, no padding).
  virtual void MaxPoolForward(const float* x, const ConvGeom& g, float* y) = 0;
  /// dx (overwritten) gets dy routed to the first maximum of each window of x.
  virtual void MaxPoolBackward(const float* x, const float* dy, const ConvGeom& g, float* dx) = 0;

  // ---- normalization and dropout ---------------------------------------------------------
  /// Per-row layer norm over `cols`: y = (x - mean) * rstd * gamma + beta.
  virtual void LayerNormForward(const float* x, const float* gamma, const float* beta, int rows, int cols, float eps, float* y,
                                float* mean, float* rstd) = 0;
  /// dx overwritten; dgamma and dbeta accumulated (+=).
  virtual void LayerNormBackward(const float* dy, const float* x, const float* gamma, const float* mean, const float* rstd,
                                 int rows, int cols, float* dx, float* dgamma, float* dbeta) = 0;
  /// y[i] = x[i] * keep(i) / (1 - p) where keep(i) = PhiloxUniform(seed, 0, i) >= p.
  /// Backward is the same call applied to dy.
  virtual void Dropout(const float* x, size_t n, float p, uint64_t seed, float* y) = 0;

  // ---- transformers ----------------------------------------------------------------------
  /// C_i = alpha * op(A_i) * op(B_i) + beta * C_i for every i of a two-level batch (outer o,
  /// inner j): X_i = x + o * x_outer + j * x_inner. Attention's per-(sequence, head) products,
  /// whose heads are column blocks of one row-major matrix. The default loops over Gemm.
  struct GemmBatch {
    int outer = 1, inner = 1;
    int64_t a_outer = 0, a_inner = 0, b_outer = 0, b_inner = 0, c_outer = 0, c_inner = 0;
  };
  virtual void BatchedGemm(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a, int lda, const float* b,
                           int ldb, float beta, float* c, int ldc, const GemmBatch& batch);
  /// Causal softmax of `blocks` square [t, t] score blocks: row i of a block keeps columns 0..i
  /// (stable: the row maximum is subtracted) and gets 0 beyond the diagonal, which is never read.
  virtual void CausalSoftmax(const float* x, int blocks, int t, float* y) = 0;
  /// Its backward: dx = y * (dy - sum_j y_j dy_j) over each row's kept columns, 0 beyond the
  /// diagonal. dx may alias dy.
  virtual void CausalSoftmaxBackward(const float* y, const float* dy, int blocks, int t, float* dx) = 0;
  /// out[i, :] = table[ids[i], :] for `n` token ids held as floats (exact integers), each
  /// already checked to be in [0, vocab).
  virtual void EmbeddingForward(const float* ids, size_t n, const float* table, int dim, float* out) = 0;
  /// dtable = beta * dtable + sum over the i with ids[i] == v of dy[i, :] for every row v of a
  /// [vocab, dim] table, the rows of dy added in index order (deterministic, no atomics).
  virtual void EmbeddingBackward(const float* ids, size_t n, const float* dy, int vocab, int dim, float beta, float* dtable) = 0;
  /// The sum of x[i]^2 in double precision (gradient clipping): chunks of 4096 elements each
  /// summed in order, then the chunk sums in order, on every device.
  virtual double SumSquares(const float* x, size_t n) = 0;
  /// Whether every element of every span {x, n} is finite (fp16's overflow check, one per step):
  /// the default asks SumSquares of each; CUDA checks them all and reads one flag back.
  struct Span {
    const float* x;
    size_t n;
  };
  virtual bool AllFinite(const std::vector<Span>& spans);
  /// x *= a.
  virtual void Scale(float* x, size_t n, float a) = 0;

  // ---- optimizers ------------------------------------------------------------------------
  /// PyTorch SGD: g' = g + wd*p; buf = first ? g' : momentum*buf + (1-dampening)*g';
  /// p -= lr * (nesterov ? g' + momentum*buf : buf) (buf unused when momentum == 0).
  virtual void SgdStep(float* p, const float* g, float* buf, size_t n, float lr, float momentum, float dampening,
                       float weight_decay, bool nesterov, bool first) = 0;
  /// SgdStep out of place, on the sum of `ngrads` gradients: g = grads[0] + grads[1] + ...
  /// (added in that order, as Axpy would), reading p and buf and writing p_out and buf_out, so
  /// p, buf and the gradients are never written (messages may share them). The same bits as
  /// summing into one buffer and calling SgdStep. buf and buf_out are null when momentum == 0;
  /// buf is not read on the first step. The default composes the kernels above; devices fuse it.
  virtual void SgdStepOutOfPlace(const float* p, const float* const* grads, int ngrads, const float* buf, size_t n, float lr,
                                 float momentum, float dampening, float weight_decay, bool nesterov, bool first, float* p_out,
                                 float* buf_out);
  /// PyTorch Adam (L2 weight decay folded into g), or AdamW when `decoupled_weight_decay`
  /// (p *= 1 - lr * weight_decay before the update); step counts from 1.
  virtual void AdamStep(float* p, const float* g, float* m, float* v, size_t n, float lr, float beta1, float beta2, float eps,
                        float weight_decay, bool decoupled_weight_decay, int64_t step) = 0;
};

/// The process-wide CPU device.
Device* CpuDevice();

/// The CUDA device `ordinal`; Unavailable when copse was built without CUDA or no such GPU.
Result<Device*> CudaDevice(int ordinal = 0);

/// Number of usable GPUs (0 without CUDA support or hardware).
int CudaDeviceCount();

/// The smallest total memory, in MB, of GPUs 0 … gpus-1 (those this process sees): what a daemon
/// offering them reports for placement (resources.gpu_memory_mb). 0 when it sees fewer, or has
/// no CUDA support.
int64_t SmallestCudaMemoryMb(int gpus);

/// Parses "cpu", "cuda" or "cuda:N".
Result<Device*> DeviceByName(const std::string& name);

/// Threads the CPU backend (OpenBLAS) uses; set once before training, not per op.
void SetCpuThreads(int threads);
int CpuThreads();

}  // namespace copse::ml
