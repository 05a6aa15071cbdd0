// The CUDA Device: cuBLAS (FP32, no TF32) for products and one kernel per Device operation.
// Every kernel is deterministic: each output element is computed by exactly one thread in a
// fixed order (reductions loop inside a thread or gather instead of using atomics), and dropout
// uses the same Philox function as the CPU, so masks are bit-identical across devices.
// All work is issued on one stream per device; copies to the host synchronize it.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <array>
#include <cmath>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include "ml/caching_allocator.h"
#include "ml/dtype.h"
#include "ml/cuda/cuda_device.h"
#include "ml/philox.h"

namespace copse::ml::cuda {
namespace {

constexpr int kThreads = 256;

void Check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string("CUDA ") + what + ": " + cudaGetErrorString(e));
}

void CheckBlas(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS) throw std::runtime_error(std::string("cuBLAS ") + what + ": status " + std::to_string(s));
}

unsigned Blocks(size_t n) { return static_cast<unsigned>((n + kThreads - 1) / kThreads); }

#define COPSE_FOR_N(i, n)                                                              \
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < (n); \
       i += static_cast<size_t>(blockDim.x) * gridDim.x)

__device__ __forceinline__ float GeluF(float v) { return 0.5f * v * (1.0f + erff(v * 0.70710678118654752440f)); }

__device__ __forceinline__ float GeluGrad(float v) {
  const float cdf = 0.5f * (1.0f + erff(v * 0.70710678118654752440f));
  const float pdf = 0.39894228040143267794f * expf(-0.5f * v * v);
  return cdf + v * pdf;
}

__global__ void BiasActKernel(const float* x, const float* bias, size_t rows, size_t cols, int act, float* y) {
  COPSE_FOR_N(i, rows * cols) {
    float v = x[i] + (bias ? bias[i % cols] : 0.0f);
    if (act == 1)
      v = v > 0.0f ? v : 0.0f;
    else if (act == 2)
      v = GeluF(v);
    y[i] = v;
  }
}

__global__ void ActBackwardKernel(int act, const float* saved, const float* dy, size_t n, float* dx) {
  COPSE_FOR_N(i, n) {
    if (act == 1)
      dx[i] = saved[i] > 0.0f ? dy[i] : 0.0f;
    else if (act == 2)
      dx[i] = dy[i] * GeluGrad(saved[i]);
    else
      dx[i] = dy[i];
  }
}

__global__ void ColumnSumKernel(const float* x, int rows, int cols, float beta, float* out) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= cols) return;
  float s = 0.0f;
  for (int r = 0; r < rows; ++r) s += x[static_cast<size_t>(r) * cols + c];
  out[c] = (beta == 0.0f ? 0.0f : beta * out[c]) + s;
}

__global__ void SwapOuterKernel(const float* x, int b, int a, int inner, float* out) {
  const size_t n = static_cast<size_t>(b) * a * inner;
  COPSE_FOR_N(o, n) {  // o indexes out[j][i][k]
    const size_t k = o % inner, ji = o / inner;
    const size_t i = ji % b, j = ji / b;
    out[o] = x[(i * a + j) * inner + k];
  }
}

__global__ void FillKernel(float* x, size_t n, float v) { COPSE_FOR_N(i, n) x[i] = v; }

__global__ void AxpyKernel(float alpha, const float* x, size_t n, float* y) { COPSE_FOR_N(i, n) y[i] += alpha * x[i]; }

__global__ void MulKernel(const float* a, const float* b, size_t n, float* out) { COPSE_FOR_N(i, n) out[i] = a[i] * b[i]; }

__global__ void SoftmaxKernel(const float* x, int rows, int cols, float* y) {
  const int r = blockIdx.x * blockDim.x + threadIdx.x;
  if (r >= rows) return;
  const float* xr = x + static_cast<size_t>(r) * cols;
  float* yr = y + static_cast<size_t>(r) * cols;
  float mx = xr[0];
  for (int c = 1; c < cols; ++c) mx = fmaxf(mx, xr[c]);
  float sum = 0.0f;
  for (int c = 0; c < cols; ++c) sum += (yr[c] = expf(xr[c] - mx));
  const float inv = 1.0f / sum;
  for (int c = 0; c < cols; ++c) yr[c] *= inv;
}

__global__ void SoftmaxCeKernel(const float* logits, const int32_t* labels, int rows, int cols, float scale, float* dlogits,
                                float* row_loss) {
  const int r = blockIdx.x * blockDim.x + threadIdx.x;
  if (r >= rows) return;
  const float* xr = logits + static_cast<size_t>(r) * cols;
  float mx = xr[0];
  for (int c = 1; c < cols; ++c) mx = fmaxf(mx, xr[c]);
  float sum = 0.0f;
  for (int c = 0; c < cols; ++c) sum += expf(xr[c] - mx);
  row_loss[r] = mx + logf(sum) - xr[labels[r]];
  if (dlogits) {
    float* dr = dlogits + static_cast<size_t>(r) * cols;
    const float inv = 1.0f / sum;
    for (int c = 0; c < cols; ++c) dr[c] = expf(xr[c] - mx) * inv * scale;
    dr[labels[r]] -= scale;
  }
}

__global__ void Im2ColKernel(const float* x, ConvGeom g, float* col) {
  const int oh = g.out_h(), ow = g.out_w();
  const size_t ncols = static_cast<size_t>(g.batch) * oh * ow;
  const size_t n = ncols * g.channels * g.kernel_h * g.kernel_w;
  COPSE_FOR_N(idx, n) {
    const size_t colno = idx % ncols, tap = idx / ncols;
    const int j = static_cast<int>(tap % g.kernel_w), i = static_cast<int>(tap / g.kernel_w % g.kernel_h);
    const int c = static_cast<int>(tap / (g.kernel_w * g.kernel_h));
    const int xo = static_cast<int>(colno % ow), yo = static_cast<int>(colno / ow % oh);
    const int b = static_cast<int>(colno / (static_cast<size_t>(ow) * oh));
    const int iy = yo * g.stride - g.pad + i, ix = xo * g.stride - g.pad + j;
    col[idx] = (iy >= 0 && iy < g.height && ix >= 0 && ix < g.width)
                   ? x[((static_cast<size_t>(b) * g.channels + c) * g.height + iy) * g.width + ix]
                   : 0.0f;
  }
}

// Gather form of col2im: each input pixel sums the taps that read it, in (i, j) order.
__global__ void Col2ImKernel(const float* col, ConvGeom g, float* dx) {
  const int oh = g.out_h(), ow = g.out_w();
  const size_t ncols = static_cast<size_t>(g.batch) * oh * ow;
  const size_t n = static_cast<size_t>(g.batch) * g.channels * g.height * g.width;
  COPSE_FOR_N(idx, n) {
    const int ix = static_cast<int>(idx % g.width), iy = static_cast<int>(idx / g.width % g.height);
    const int c = static_cast<int>(idx / (static_cast<size_t>(g.width) * g.height) % g.channels);
    const int b = static_cast<int>(idx / (static_cast<size_t>(g.width) * g.height * g.channels));
    float s = 0.0f;
    for (int i = 0; i < g.kernel_h; ++i) {
      const int ty = iy + g.pad - i;
      if (ty < 0 || ty % g.stride) continue;
      const int yo = ty / g.stride;
      if (yo >= oh) continue;
      for (int j = 0; j < g.kernel_w; ++j) {
        const int tx = ix + g.pad - j;
        if (tx < 0 || tx % g.stride) continue;
        const int xo = tx / g.stride;
        if (xo >= ow) continue;
        const size_t tap = (static_cast<size_t>(c) * g.kernel_h + i) * g.kernel_w + j;
        s += col[tap * ncols + (static_cast<size_t>(b) * oh + yo) * ow + xo];
      }
    }
    dx[idx] = s;
  }
}

// First maximum of a window (NaN propagates), as CpuDevice::ArgMaxWindow.
__device__ int ArgMaxWindow(const float* w, const ConvGeom& g) {
  int arg = 0;
  float best = w[0];
  if (isnan(best)) return 0;
  for (int i = 0; i < g.kernel_h; ++i)
    for (int j = 0; j < g.kernel_w; ++j) {
      const int off = i * g.width + j;
      const float v = w[off];
      if (v > best) {
        best = v;
        arg = off;
      } else if (isnan(v)) {
        return off;
      }
    }
  return arg;
}

__global__ void MaxPoolFwdKernel(const float* x, ConvGeom g, float* y) {
  const int oh = g.out_h(), ow = g.out_w();
  const size_t n = static_cast<size_t>(g.batch) * g.channels * oh * ow;
  COPSE_FOR_N(o, n) {
    const int ox = static_cast<int>(o % ow), oy = static_cast<int>(o / ow % oh);
    const size_t p = o / (static_cast<size_t>(ow) * oh);
    const float* w = x + p * g.height * g.width + (oy * g.stride) * g.width + ox * g.stride;
    y[o] = w[ArgMaxWindow(w, g)];
  }
}

// Gather form: each input pixel collects dy of the windows whose argmax it is.
__global__ void MaxPoolBwdKernel(const float* x, const float* dy, ConvGeom g, float* dx) {
  const int oh = g.out_h(), ow = g.out_w();
  const size_t n = static_cast<size_t>(g.batch) * g.channels * g.height * g.width;
  COPSE_FOR_N(idx, n) {
    const int ix = static_cast<int>(idx % g.width), iy = static_cast<int>(idx / g.width % g.height);
    const size_t p = idx / (static_cast<size_t>(g.width) * g.height);
    const float* plane = x + p * g.height * g.width;
    const int self = iy * g.width + ix;
    float s = 0.0f;
    for (int oy = 0; oy < oh; ++oy) {
      const int y0 = oy * g.stride;
      if (iy < y0 || iy >= y0 + g.kernel_h) continue;
      for (int ox = 0; ox < ow; ++ox) {
        const int x0 = ox * g.stride;
        if (ix < x0 || ix >= x0 + g.kernel_w) continue;
        const int base = y0 * g.width + x0;
        if (base + ArgMaxWindow(plane + base, g) == self) s += dy[p * oh * ow + oy * ow + ox];
      }
    }
    dx[idx] = s;
  }
}

__global__ void LayerNormFwdKernel(const float* x, const float* gamma, const float* beta, int rows, int cols, float eps, float* y,
                                   float* mean, float* rstd) {
  const int r = blockIdx.x * blockDim.x + threadIdx.x;
  if (r >= rows) return;
  const float* xr = x + static_cast<size_t>(r) * cols;
  float* yr = y + static_cast<size_t>(r) * cols;
  float sum = 0.0f;
  for (int c = 0; c < cols; ++c) sum += xr[c];
  const float mu = sum / cols;
  float var = 0.0f;
  for (int c = 0; c < cols; ++c) var += (xr[c] - mu) * (xr[c] - mu);
  const float rs = 1.0f / sqrtf(var / cols + eps);
  for (int c = 0; c < cols; ++c) yr[c] = (xr[c] - mu) * rs * gamma[c] + beta[c];
  mean[r] = mu;
  rstd[r] = rs;
}

__global__ void LayerNormBwdDxKernel(const float* dy, const float* x, const float* gamma, const float* mean, const float* rstd,
                                     int rows, int cols, float* dx) {
  const int r = blockIdx.x * blockDim.x + threadIdx.x;
  if (r >= rows) return;
  const float* xr = x + static_cast<size_t>(r) * cols;
  const float* dr = dy + static_cast<size_t>(r) * cols;
  float* dxr = dx + static_cast<size_t>(r) * cols;
  const float mu = mean[r], rs = rstd[r];
  float sum_dxhat = 0.0f, sum_dxhat_xhat = 0.0f;
  for (int c = 0; c < cols; ++c) {
    const float xhat = (xr[c] - mu) * rs, dxhat = dr[c] * gamma[c];
    sum_dxhat += dxhat;
    sum_dxhat_xhat += dxhat * xhat;
  }
  const float inv_n = 1.0f / cols;
  for (int c = 0; c < cols; ++c) {
    const float xhat = (xr[c] - mu) * rs;
    dxr[c] = rs * (dr[c] * gamma[c] - inv_n * sum_dxhat - xhat * inv_n * sum_dxhat_xhat);
  }
}

__global__ void LayerNormBwdParamKernel(const float* dy, const float* x, const float* mean, const float* rstd, int rows, int cols,
                                        float* dgamma, float* dbeta) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= cols) return;
  float g = 0.0f, b = 0.0f;
  for (int r = 0; r < rows; ++r) {
    const size_t i = static_cast<size_t>(r) * cols + c;
    g += dy[i] * (x[i] - mean[r]) * rstd[r];
    b += dy[i];
  }
  dgamma[c] += g;
  dbeta[c] += b;
}

__global__ void DropoutKernel(const float* x, size_t n, float p, uint64_t seed, float* y) {
  const float scale = p < 1.0f ? 1.0f / (1.0f - p) : 0.0f;
  COPSE_FOR_N(block, (n + 3) / 4) {
    const Philox4 r = Philox4x32(seed, block, 0);
    for (int k = 0; k < 4; ++k) {
      const size_t i = block * 4 + k;
      if (i < n) y[i] = UniformFromBits(r.v[k]) >= p ? x[i] * scale : 0.0f;
    }
  }
}

__global__ void SgdKernel(float* p, const float* g, float* buf, size_t n, float lr, float momentum, float dampening, float wd,
                          bool nesterov, bool first) {
  COPSE_FOR_N(i, n) {
    float d = g[i] + wd * p[i];
    if (momentum != 0.0f) {
      const float b = first ? d : momentum * buf[i] + (1.0f - dampening) * d;
      buf[i] = b;
      d = nesterov ? d + momentum * b : b;
    }
    p[i] -= lr * d;
  }
}

__global__ void AdamKernel(float* p, const float* g, float* m, float* v, size_t n, float lr, float beta1, float beta2, float eps,
                           float wd, float keep, float step_size, float bc2_sqrt) {
  COPSE_FOR_N(i, n) {
    if (keep != 1.0f) p[i] *= keep;
    const float d = g[i] + wd * p[i];
    m[i] = beta1 * m[i] + (1.0f - beta1) * d;
    v[i] = beta2 * v[i] + (1.0f - beta2) * d * d;
    p[i] -= step_size * m[i] / (sqrtf(v[i]) / bc2_sqrt + eps);
  }
}

// One thread per row of the [blocks * t, t] scores: rows are short (the context length).
__global__ void CausalSoftmaxKernel(const float* x, int blocks, int t, float* y) {
  COPSE_FOR_N(r, static_cast<size_t>(blocks) * t) {
    const int keep = static_cast<int>(r % t) + 1;
    const float* xr = x + r * t;
    float* yr = y + r * t;
    float mx = xr[0];
    for (int c = 1; c < keep; ++c) mx = fmaxf(mx, xr[c]);
    float sum = 0.0f;
    for (int c = 0; c < keep; ++c) sum += (yr[c] = expf(xr[c] - mx));
    const float inv = 1.0f / sum;
    for (int c = 0; c < keep; ++c) yr[c] *= inv;
    for (int c = keep; c < t; ++c) yr[c] = 0.0f;
  }
}

__global__ void CausalSoftmaxBwdKernel(const float* y, const float* dy, int blocks, int t, float* dx) {
  COPSE_FOR_N(r, static_cast<size_t>(blocks) * t) {
    const int keep = static_cast<int>(r % t) + 1;
    const float* yr = y + r * t;
    const float* dr = dy + r * t;
    float* xr = dx + r * t;
    float dot = 0.0f;
    for (int c = 0; c < keep; ++c) dot += yr[c] * dr[c];
    for (int c = 0; c < keep; ++c) xr[c] = yr[c] * (dr[c] - dot);
    for (int c = keep; c < t; ++c) xr[c] = 0.0f;
  }
}

__global__ void EmbeddingFwdKernel(const float* ids, size_t n, const float* table, int dim, float* out) {
  COPSE_FOR_N(i, n * dim) {
    const size_t row = i / dim, col = i % dim;
    out[i] = table[static_cast<size_t>(ids[row]) * dim + col];
  }
}

// One thread per table element, adding the rows of its token's positions (`rows`, from
// offsets[v] to offsets[v + 1], in index order): deterministic without atomics, and the CPU's
// order of additions.
__global__ void EmbeddingBwdKernel(const int32_t* offsets, const int32_t* rows, const float* dy, int vocab, int dim, float beta,
                                   float* dtable) {
  COPSE_FOR_N(i, static_cast<size_t>(vocab) * dim) {
    const int v = static_cast<int>(i / dim), col = static_cast<int>(i % dim);
    float s = beta == 0.0f ? 0.0f : beta * dtable[i];
    for (int k = offsets[v]; k < offsets[v + 1]; ++k) s += dy[static_cast<size_t>(rows[k]) * dim + col];
    dtable[i] = s;
  }
}

// Partial sums of squares over fixed chunks (one thread each), added on the host in order.
__global__ void SumSquaresKernel(const float* x, size_t n, size_t chunk, double* partial) {
  const size_t c = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
  const size_t b = c * chunk;
  if (b >= n) return;
  const size_t e = b + chunk < n ? b + chunk : n;
  double s = 0.0;
  for (size_t i = b; i < e; ++i) s += static_cast<double>(x[i]) * x[i];
  partial[c] = s;
}

__global__ void ScaleKernel(float* x, size_t n, float a) { COPSE_FOR_N(i, n) x[i] *= a; }

// Sets *flag (to 1, from any thread: no ordering matters) when an element is not finite.
__global__ void NonFiniteKernel(const float* x, size_t n, int* flag) { COPSE_FOR_N(i, n) if (!isfinite(x[i]))* flag = 1; }

// Round to nearest even, NaN kept quiet: the bits FloatToBFloat16 of ml/dtype.h gives on the host.
__global__ void ToBFloat16Kernel(const float* x, size_t n, uint16_t* y) {
  COPSE_FOR_N(i, n) {
    const uint32_t u = __float_as_uint(x[i]);
    y[i] = static_cast<uint16_t>((u & 0x7fffffffu) > 0x7f800000u ? (u >> 16) | 0x40u : (u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
  }
}

// The host's FloatToFloat16 and Float16ToFloat of ml/dtype.h, compiled for the device: the same bits.
__global__ void ToFloat16Kernel(const float* x, size_t n, uint16_t* y) { COPSE_FOR_N(i, n) y[i] = FloatToFloat16(x[i]); }

__global__ void FromFloat16Kernel(const uint16_t* x, size_t n, float* y) { COPSE_FOR_N(i, n) y[i] = Float16ToFloat(x[i]); }

__global__ void FromBFloat16Kernel(const uint16_t* x, size_t n, float* y) {
  COPSE_FOR_N(i, n) y[i] = __uint_as_float(uint32_t{x[i]} << 16);
}

class CudaDeviceImpl final : public Device {
 public:
  explicit CudaDeviceImpl(int ordinal)
      : ordinal_(ordinal),
        allocator_(
            [this](size_t bytes) {
              Use();
              void* p = nullptr;
              Check(cudaMalloc(&p, bytes), "cudaMalloc");
              return p;
            },
            [this](void* p) {
              Use();
              cudaFree(p);
            }) {
    Use();
    Check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
    CheckBlas(cublasCreate(&blas_), "create");
    CheckBlas(cublasSetStream(blas_, stream_), "set stream");
    CheckBlas(cublasSetMathMode(blas_, CUBLAS_DEFAULT_MATH), "math mode");  // FP32, no TF32
  }

  DeviceType type() const override { return DeviceType::kCuda; }
  std::string name() const override { return "cuda:" + std::to_string(ordinal_); }

  void* Allocate(size_t bytes) override { return allocator_.Allocate(bytes); }
  void Free(void* ptr, size_t bytes) override {
    // No synchronization needed: a cached block is only reused by work issued later on the same
    // stream, which runs after every kernel that used it before.
    allocator_.Free(ptr, bytes);
  }
  void CopyFromHost(void* dst, const void* src, size_t bytes) override {
    if (!bytes) return;
    Use();
    Check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream_), "copy to device");
    Synchronize();  // the host buffer may go away as soon as we return
  }
  void CopyToHost(void* dst, const void* src, size_t bytes) override {
    if (!bytes) return;
    Use();
    Check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream_), "copy to host");
    Synchronize();
  }
  void CopyOnDevice(void* dst, const void* src, size_t bytes) override {
    if (!bytes || dst == src) return;
    Use();
    Check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream_), "copy on device");
  }
  void Synchronize() override {
    Use();
    Check(cudaStreamSynchronize(stream_), "synchronize");
  }

  void Gemm(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a, int lda, const float* b, int ldb,
            float beta, float* c, int ldc) override {
    if (m == 0 || n == 0) return;
    Use();
    // Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T.
    CheckBlas(cublasSgemm(blas_, trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, n, m, k, &alpha, b,
                          ldb, a, lda, &beta, c, ldc),
              "sgemm");
  }

  void GemmBf16(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const uint16_t* a, int lda, const uint16_t* b,
                int ldb, float beta, float* c, int ldc) override {
    GemmOf16Bits(CUDA_R_16BF, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  }
  void GemmF16(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const uint16_t* a, int lda, const uint16_t* b,
               int ldb, float beta, float* c, int ldc) override {
    GemmOf16Bits(CUDA_R_16F, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  }
  /// A product of 16-bit operands of `type` (bfloat16 or float16), accumulated and written in float32.
  void GemmOf16Bits(cudaDataType type, bool trans_a, bool trans_b, int m, int n, int k, float alpha, const uint16_t* a, int lda,
                    const uint16_t* b, int ldb, float beta, float* c, int ldc) {
    if (m == 0 || n == 0) return;
    Use();
    CheckBlas(cublasGemmEx(blas_, trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, n, m, k, &alpha, b,
                           type, ldb, a, type, lda, &beta, c, CUDA_R_32F, ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
              "16-bit gemm");
  }
  void FloatToFloat16(const float* x, size_t n, uint16_t* y) override {
    if (n) Launch(ToFloat16Kernel, n, x, n, y);
  }
  void Float16ToFloat(const uint16_t* x, size_t n, float* y) override {
    if (n) Launch(FromFloat16Kernel, n, x, n, y);
  }
  void FloatToBFloat16(const float* x, size_t n, uint16_t* y) override {
    if (n) Launch(ToBFloat16Kernel, n, x, n, y);
  }
  void BFloat16ToFloat(const uint16_t* x, size_t n, float* y) override {
    if (n) Launch(FromBFloat16Kernel, n, x, n, y);
  }

  void BiasActivation(const float* x, const float* bias, int rows, int cols, Activation act, float* y) override {
    const size_t n = static_cast<size_t>(rows) * cols;
    if (n == 0) return;
    Launch(BiasActKernel, n, x, bias, static_cast<size_t>(rows), static_cast<size_t>(cols), ActCode(act), y);
  }
  void ActivationBackward(Activation act, const float* saved, const float* dy, size_t n, float* dx) override {
    if (n) Launch(ActBackwardKernel, n, ActCode(act), saved, dy, n, dx);
  }
  void ColumnSum(const float* x, int rows, int cols, float beta, float* out) override {
    if (cols) Launch(ColumnSumKernel, static_cast<size_t>(cols), x, rows, cols, beta, out);
  }
  void SwapOuterAxes(const float* x, int b, int a, int inner, float* out) override {
    const size_t n = static_cast<size_t>(b) * a * inner;
    if (n) Launch(SwapOuterKernel, n, x, b, a, inner, out);
  }
  void Fill(float* x, size_t n, float value) override {
    if (n) Launch(FillKernel, n, x, n, value);
  }
  void Axpy(float alpha, const float* x, size_t n, float* y) override {
    if (n) Launch(AxpyKernel, n, alpha, x, n, y);
  }
  void Multiply(const float* a, const float* b, size_t n, float* out) override {
    if (n) Launch(MulKernel, n, a, b, n, out);
  }
  void Softmax(const float* x, int rows, int cols, float* y) override {
    if (rows) Launch(SoftmaxKernel, static_cast<size_t>(rows), x, rows, cols, y);
  }
  double SoftmaxCrossEntropy(const float* logits, const int32_t* host_labels, int rows, int cols, float grad_scale,
                             float* dlogits) override {
    if (rows == 0) return 0.0;
    int32_t* labels = static_cast<int32_t*>(Allocate(rows * sizeof(int32_t)));
    float* row_loss = static_cast<float*>(Allocate(rows * sizeof(float)));
    CopyFromHost(labels, host_labels, rows * sizeof(int32_t));
    Launch(SoftmaxCeKernel, static_cast<size_t>(rows), logits, labels, rows, cols, grad_scale, dlogits, row_loss);
    std::vector<float> host(static_cast<size_t>(rows));
    CopyToHost(host.data(), row_loss, rows * sizeof(float));
    Free(labels, rows * sizeof(int32_t));
    Free(row_loss, rows * sizeof(float));
    double total = 0;  // summed on the host in row order, as on the CPU
    for (float v : host) total += static_cast<double>(v);
    return total;
  }
  void Im2Col(const float* x, const ConvGeom& g, float* col) override {
    const size_t n = static_cast<size_t>(g.batch) * g.out_h() * g.out_w() * g.channels * g.kernel_h * g.kernel_w;
    if (n) Launch(Im2ColKernel, n, x, g, col);
  }
  void Col2Im(const float* col, const ConvGeom& g, float* dx) override {
    const size_t n = static_cast<size_t>(g.batch) * g.channels * g.height * g.width;
    if (n) Launch(Col2ImKernel, n, col, g, dx);
  }
  void MaxPoolForward(const float* x, const ConvGeom& g, float* y) override {
    const size_t n = static_cast<size_t>(g.batch) * g.channels * g.out_h() * g.out_w();
    if (n) Launch(MaxPoolFwdKernel, n, x, g, y);
  }
  void MaxPoolBackward(const float* x, const float* dy, const ConvGeom& g, float* dx) override {
    const size_t n = static_cast<size_t>(g.batch) * g.channels * g.height * g.width;
    if (n) Launch(MaxPoolBwdKernel, n, x, dy, g, dx);
  }
  void LayerNormForward(const float* x, const float* gamma, const float* beta, int rows, int cols, float eps, float* y,
                        float* mean, float* rstd) override {
    if (rows) Launch(LayerNormFwdKernel, static_cast<size_t>(rows), x, gamma, beta, rows, cols, eps, y, mean, rstd);
  }
  void LayerNormBackward(const float* dy, const float* x, const float* gamma, const float* mean, const float* rstd, int rows,
                         int cols, float* dx, float* dgamma, float* dbeta) override {
    if (rows == 0 || cols == 0) return;
    Launch(LayerNormBwdDxKernel, static_cast<size_t>(rows), dy, x, gamma, mean, rstd, rows, cols, dx);
    Launch(LayerNormBwdParamKernel, static_cast<size_t>(cols), dy, x, mean, rstd, rows, cols, dgamma, dbeta);
  }
  void Dropout(const float* x, size_t n, float p, uint64_t seed, float* y) override {
    if (n) Launch(DropoutKernel, (n + 3) / 4, x, n, p, seed, y);
  }
  void SgdStep(float* p, const float* g, float* buf, size_t n, float lr, float momentum, float dampening, float weight_decay,
               bool nesterov, bool first) override {
    if (n) Launch(SgdKernel, n, p, g, buf, n, lr, momentum, dampening, weight_decay, nesterov, first);
  }
  void AdamStep(float* p, const float* g, float* m, float* v, size_t n, float lr, float beta1, float beta2, float eps,
                float weight_decay, bool decoupled, int64_t step) override {
    if (!n) return;
    const float bc1 = 1.0f - std::pow(beta1, static_cast<float>(step));
    const float bc2 = 1.0f - std::pow(beta2, static_cast<float>(step));
    Launch(AdamKernel, n, p, g, m, v, n, lr, beta1, beta2, eps, decoupled ? 0.0f : weight_decay,
           decoupled ? 1.0f - lr * weight_decay : 1.0f, lr / bc1, std::sqrt(bc2));
  }
  void BatchedGemm(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a, int lda, const float* b, int ldb,
                   float beta, float* c, int ldc, const GemmBatch& batch) override {
    if (m == 0 || n == 0 || batch.inner == 0) return;
    Use();
    for (int o = 0; o < batch.outer; ++o)  // row-major as column-major, as Gemm
      CheckBlas(cublasSgemmStridedBatched(blas_, trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, n, m,
                                          k, &alpha, b + o * batch.b_outer, ldb, batch.b_inner, a + o * batch.a_outer, lda,
                                          batch.a_inner, &beta, c + o * batch.c_outer, ldc, batch.c_inner, batch.inner),
                "sgemm strided batched");
  }
  void CausalSoftmax(const float* x, int blocks, int t, float* y) override {
    const size_t rows = static_cast<size_t>(blocks) * t;
    if (rows) Launch(CausalSoftmaxKernel, rows, x, blocks, t, y);
  }
  void CausalSoftmaxBackward(const float* y, const float* dy, int blocks, int t, float* dx) override {
    const size_t rows = static_cast<size_t>(blocks) * t;
    if (rows) Launch(CausalSoftmaxBwdKernel, rows, y, dy, blocks, t, dx);
  }
  void EmbeddingForward(const float* ids, size_t n, const float* table, int dim, float* out) override {
    if (n && dim) Launch(EmbeddingFwdKernel, n * dim, ids, n, table, dim, out);
  }
  void EmbeddingBackward(const float* ids, size_t n, const float* dy, int vocab, int dim, float beta, float* dtable) override {
    const size_t total = static_cast<size_t>(vocab) * dim;
    if (total == 0) return;
    // Each token's positions, in index order (a counting sort on the host: ids are B x T floats).
    std::vector<float> host(n);
    CopyToHost(host.data(), ids, n * sizeof(float));
    std::vector<int32_t> offsets(static_cast<size_t>(vocab) + 1, 0), rows(n);
    for (float id : host) ++offsets[static_cast<size_t>(id) + 1];
    for (int v = 0; v < vocab; ++v) offsets[static_cast<size_t>(v) + 1] += offsets[static_cast<size_t>(v)];
    std::vector<int32_t> next(offsets.begin(), offsets.end() - 1);
    for (size_t i = 0; i < n; ++i) rows[static_cast<size_t>(next[static_cast<size_t>(host[i])]++)] = static_cast<int32_t>(i);
    const size_t offsets_bytes = offsets.size() * sizeof(int32_t), rows_bytes = std::max<size_t>(1, n) * sizeof(int32_t);
    auto* d_offsets = static_cast<int32_t*>(Allocate(offsets_bytes));
    auto* d_rows = static_cast<int32_t*>(Allocate(rows_bytes));
    CopyFromHost(d_offsets, offsets.data(), offsets_bytes);
    CopyFromHost(d_rows, rows.data(), n * sizeof(int32_t));
    Launch(EmbeddingBwdKernel, total, static_cast<const int32_t*>(d_offsets), static_cast<const int32_t*>(d_rows), dy, vocab, dim,
           beta, dtable);
    // Freed blocks are reused only by work issued later on this stream (see Free).
    Free(d_offsets, offsets_bytes);
    Free(d_rows, rows_bytes);
  }
  double SumSquares(const float* x, size_t n) override {
    if (n == 0) return 0.0;
    constexpr size_t kChunk = 4096;
    const size_t parts = (n + kChunk - 1) / kChunk;
    double* partial = static_cast<double*>(Allocate(parts * sizeof(double)));
    Launch(SumSquaresKernel, parts, x, n, kChunk, partial);
    std::vector<double> host(parts);
    CopyToHost(host.data(), partial, parts * sizeof(double));
    Free(partial, parts * sizeof(double));
    double total = 0.0;
    for (double v : host) total += v;
    return total;
  }
  void Scale(float* x, size_t n, float a) override {
    if (n) Launch(ScaleKernel, n, x, n, a);
  }
  bool AllFinite(const std::vector<Span>& spans) override {
    int* flag = static_cast<int*>(Allocate(sizeof(int)));
    Use();
    Check(cudaMemsetAsync(flag, 0, sizeof(int), stream_), "memset");
    for (const Span& s : spans)
      if (s.n) Launch(NonFiniteKernel, s.n, s.x, s.n, flag);
    int host = 0;
    CopyToHost(&host, flag, sizeof(int));  // the one synchronization
    Free(flag, sizeof(int));
    return host == 0;
  }

 private:
  static int ActCode(Activation act) { return act == Activation::kRelu ? 1 : act == Activation::kGelu ? 2 : 0; }

  void Use() const { Check(cudaSetDevice(ordinal_), "cudaSetDevice"); }

  template <typename Kernel, typename... Args>
  void Launch(Kernel kernel, size_t work, Args... args) {
    Use();
    const unsigned blocks = std::min<unsigned>(Blocks(work), 65535u * 8u);
    kernel<<<blocks, kThreads, 0, stream_>>>(args...);
    Check(cudaGetLastError(), "kernel launch");
  }

  int ordinal_;
  cudaStream_t stream_ = nullptr;
  cublasHandle_t blas_ = nullptr;
  CachingAllocator allocator_;
};

std::mutex devices_mu;
std::array<CudaDeviceImpl*, 64> devices{};

}  // namespace

int CudaDeviceCount() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no driver" error
    return 0;
  }
  return count;
}

int64_t CudaMemoryMb(int ordinal) {
  cudaDeviceProp prop{};
  if (ordinal < 0 || ordinal >= CudaDeviceCount() || cudaGetDeviceProperties(&prop, ordinal) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return static_cast<int64_t>(prop.totalGlobalMem >> 20);
}

Result<Device*> GetCudaDevice(int ordinal) {
  const int count = CudaDeviceCount();
  if (ordinal < 0 || ordinal >= count || ordinal >= static_cast<int>(devices.size()))
    return Status::Unavailable("cuda:" + std::to_string(ordinal) + ": " + std::to_string(count) + " GPU(s) visible");
  std::lock_guard<std::mutex> lock(devices_mu);
  if (devices[ordinal] == nullptr) {
    try {
      devices[ordinal] = new CudaDeviceImpl(ordinal);  // lives for the process, like the CPU's
    } catch (const std::exception& e) {
      return Status::Unavailable("cuda:" + std::to_string(ordinal) + ": " + e.what());
    }
  }
  return static_cast<Device*>(devices[ordinal]);
}

}  // namespace copse::ml::cuda
