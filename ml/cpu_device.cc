#include "ml/cpu_device.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <new>

#include "ml/caching_allocator.h"
#include "ml/philox.h"

namespace copse::ml::internal {
namespace {

constexpr float kInvSqrt2 = 0.70710678118654752440f;
constexpr float kInvSqrt2Pi = 0.39894228040143267794f;

class CpuDeviceImpl final : public Device {
 public:
  CpuDeviceImpl()
      : allocator_(
            [](size_t bytes) {
              void* p = std::aligned_alloc(64, (bytes + 63) / 64 * 64);
              if (p == nullptr) throw std::bad_alloc();
              return p;
            },
            [](void* p) { std::free(p); }) {}

  DeviceType type() const override { return DeviceType::kCpu; }
  std::string name() const override { return "cpu"; }

  void* Allocate(size_t bytes) override { return allocator_.Allocate(bytes); }
  void Free(void* ptr, size_t bytes) override { allocator_.Free(ptr, bytes); }
  void CopyFromHost(void* dst, const void* src, size_t bytes) override {
    if (bytes) std::memcpy(dst, src, bytes);
  }
  void CopyToHost(void* dst, const void* src, size_t bytes) override {
    if (bytes) std::memcpy(dst, src, bytes);
  }
  void CopyOnDevice(void* dst, const void* src, size_t bytes) override {
    if (bytes && dst != src) std::memmove(dst, src, bytes);
  }

  void Gemm(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a,
            int lda, const float* b, int ldb, float beta, float* c, int ldc) override {
    if (m == 0 || n == 0) return;
    if (k == 0) {  // BLAS leaves C untouched for k == 0 only when beta == 1; be explicit.
      for (int i = 0; i < m; ++i)
        for (int j = 0; j < n; ++j) c[static_cast<size_t>(i) * ldc + j] *= beta;
      return;
    }
    cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
                trans_b ? CblasTrans : CblasNoTrans, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  }

  void BiasActivation(const float* x, const float* bias, int rows, int cols, Activation act,
                      float* y) override {
    for (int r = 0; r < rows; ++r) {
      const float* xr = x + static_cast<size_t>(r) * cols;
      float* yr = y + static_cast<size_t>(r) * cols;
      switch (act) {
        case Activation::kNone:
          if (bias) {
            for (int c = 0; c < cols; ++c) yr[c] = xr[c] + bias[c];
          } else if (xr != yr) {
            std::memcpy(yr, xr, sizeof(float) * cols);
          }
          break;
        case Activation::kRelu:
          if (bias) {
            for (int c = 0; c < cols; ++c) yr[c] = std::max(xr[c] + bias[c], 0.0f);
          } else {
            for (int c = 0; c < cols; ++c) yr[c] = std::max(xr[c], 0.0f);
          }
          break;
        case Activation::kGelu:
          for (int c = 0; c < cols; ++c) {
            const float v = bias ? xr[c] + bias[c] : xr[c];
            yr[c] = 0.5f * v * (1.0f + std::erf(v * kInvSqrt2));
          }
          break;
      }
    }
  }

  void ActivationBackward(Activation act, const float* saved, const float* dy, size_t n,
                          float* dx) override {
    switch (act) {
      case Activation::kNone:
        if (dx != dy) std::memcpy(dx, dy, n * sizeof(float));
        break;
      case Activation::kRelu:
        for (size_t i = 0; i < n; ++i) dx[i] = saved[i] > 0.0f ? dy[i] : 0.0f;
        break;
      case Activation::kGelu:
        for (size_t i = 0; i < n; ++i) {
          const float v = saved[i];
          const float cdf = 0.5f * (1.0f + std::erf(v * kInvSqrt2));
          const float pdf = kInvSqrt2Pi * std::exp(-0.5f * v * v);
          dx[i] = dy[i] * (cdf + v * pdf);
        }
        break;
    }
  }

  void ColumnSum(const float* x, int rows, int cols, float beta, float* out) override {
    if (beta == 0.0f) {
      std::fill(out, out + cols, 0.0f);
    } else if (beta != 1.0f) {
      for (int c = 0; c < cols; ++c) out[c] *= beta;
    }
    for (int r = 0; r < rows; ++r) {
      const float* xr = x + static_cast<size_t>(r) * cols;
      for (int c = 0; c < cols; ++c) out[c] += xr[c];
    }
  }

  void SwapOuterAxes(const float* x, int b, int a, int inner, float* out) override {
    for (int i = 0; i < b; ++i)
      for (int j = 0; j < a; ++j)
        std::memcpy(out + (static_cast<size_t>(j) * b + i) * inner,
                    x + (static_cast<size_t>(i) * a + j) * inner, sizeof(float) * inner);
  }

  void Fill(float* x, size_t n, float value) override { std::fill(x, x + n, value); }

  void Axpy(float alpha, const float* x, size_t n, float* y) override {
    for (size_t i = 0; i < n; ++i) y[i] += alpha * x[i];
  }

  void Multiply(const float* a, const float* b, size_t n, float* out) override {
    for (size_t i = 0; i < n; ++i) out[i] = a[i] * b[i];
  }

  void Softmax(const float* x, int rows, int cols, float* y) override {
    for (int r = 0; r < rows; ++r) {
      const float* xr = x + static_cast<size_t>(r) * cols;
      float* yr = y + static_cast<size_t>(r) * cols;
      const float mx = *std::max_element(xr, xr + cols);
      float sum = 0.0f;
      for (int c = 0; c < cols; ++c) sum += (yr[c] = std::exp(xr[c] - mx));
      const float inv = 1.0f / sum;
      for (int c = 0; c < cols; ++c) yr[c] *= inv;
    }
  }

  double SoftmaxCrossEntropy(const float* logits, const int32_t* labels, int rows, int cols,
                             float grad_scale, float* dlogits) override {
    double total = 0.0;
    for (int r = 0; r < rows; ++r) {
      const float* xr = logits + static_cast<size_t>(r) * cols;
      const float mx = *std::max_element(xr, xr + cols);
      float sum = 0.0f;
      for (int c = 0; c < cols; ++c) sum += std::exp(xr[c] - mx);
      const float lse = mx + std::log(sum);
      total += static_cast<double>(lse - xr[labels[r]]);
      if (dlogits) {
        float* dr = dlogits + static_cast<size_t>(r) * cols;
        const float inv = 1.0f / sum;
        for (int c = 0; c < cols; ++c) dr[c] = std::exp(xr[c] - mx) * inv * grad_scale;
        dr[labels[r]] -= grad_scale;
      }
    }
    return total;
  }

  void Im2Col(const float* x, const ConvGeom& g, float* col) override {
    const int oh = g.out_h(), ow = g.out_w();
    const size_t ncols = static_cast<size_t>(g.batch) * oh * ow;
    for (int c = 0; c < g.channels; ++c)
      for (int i = 0; i < g.kernel_h; ++i)
        for (int j = 0; j < g.kernel_w; ++j) {
          float* row = col + ((static_cast<size_t>(c) * g.kernel_h + i) * g.kernel_w + j) * ncols;
          for (int b = 0; b < g.batch; ++b) {
            const float* plane = x + (static_cast<size_t>(b) * g.channels + c) * g.height * g.width;
            for (int y = 0; y < oh; ++y) {
              float* out = row + (static_cast<size_t>(b) * oh + y) * ow;
              const int iy = y * g.stride - g.pad + i;
              if (iy < 0 || iy >= g.height) {
                std::fill(out, out + ow, 0.0f);
                continue;
              }
              const float* src = plane + static_cast<size_t>(iy) * g.width;
              for (int xo = 0; xo < ow; ++xo) {
                const int ix = xo * g.stride - g.pad + j;
                out[xo] = (ix >= 0 && ix < g.width) ? src[ix] : 0.0f;
              }
            }
          }
        }
  }

  void Col2Im(const float* col, const ConvGeom& g, float* dx) override {
    const int oh = g.out_h(), ow = g.out_w();
    const size_t ncols = static_cast<size_t>(g.batch) * oh * ow;
    std::fill(dx, dx + static_cast<size_t>(g.batch) * g.channels * g.height * g.width, 0.0f);
    for (int c = 0; c < g.channels; ++c)
      for (int i = 0; i < g.kernel_h; ++i)
        for (int j = 0; j < g.kernel_w; ++j) {
          const float* row =
              col + ((static_cast<size_t>(c) * g.kernel_h + i) * g.kernel_w + j) * ncols;
          for (int b = 0; b < g.batch; ++b) {
            float* plane = dx + (static_cast<size_t>(b) * g.channels + c) * g.height * g.width;
            for (int y = 0; y < oh; ++y) {
              const int iy = y * g.stride - g.pad + i;
              if (iy < 0 || iy >= g.height) continue;
              const float* in = row + (static_cast<size_t>(b) * oh + y) * ow;
              float* dst = plane + static_cast<size_t>(iy) * g.width;
              for (int xo = 0; xo < ow; ++xo) {
                const int ix = xo * g.stride - g.pad + j;
                if (ix >= 0 && ix < g.width) dst[ix] += in[xo];
              }
            }
          }
        }
  }

  void MaxPoolForward(const float* x, const ConvGeom& g, float* y) override {
    const int oh = g.out_h(), ow = g.out_w();
    const size_t planes = static_cast<size_t>(g.batch) * g.channels;
    for (size_t p = 0; p < planes; ++p) {
      const float* in = x + p * g.height * g.width;
      float* out = y + p * oh * ow;
      for (int oy = 0; oy < oh; ++oy)
        for (int ox = 0; ox < ow; ++ox) {
          float best = -INFINITY;
          for (int i = 0; i < g.kernel_h; ++i)
            for (int j = 0; j < g.kernel_w; ++j) {
              const float v = in[(oy * g.stride + i) * g.width + ox * g.stride + j];
              if (v > best || std::isnan(v)) best = v;
            }
          out[oy * ow + ox] = best;
        }
    }
  }

  void MaxPoolBackward(const float* x, const float* dy, const ConvGeom& g, float* dx) override {
    const int oh = g.out_h(), ow = g.out_w();
    const size_t planes = static_cast<size_t>(g.batch) * g.channels;
    std::fill(dx, dx + planes * g.height * g.width, 0.0f);
    for (size_t p = 0; p < planes; ++p) {
      const float* in = x + p * g.height * g.width;
      float* din = dx + p * g.height * g.width;
      const float* d = dy + p * oh * ow;
      for (int oy = 0; oy < oh; ++oy)
        for (int ox = 0; ox < ow; ++ox) {
          float best = -INFINITY;
          int arg = (oy * g.stride) * g.width + ox * g.stride;
          for (int i = 0; i < g.kernel_h; ++i)
            for (int j = 0; j < g.kernel_w; ++j) {
              const int idx = (oy * g.stride + i) * g.width + ox * g.stride + j;
              if (in[idx] > best || std::isnan(in[idx])) {
                best = in[idx];
                arg = idx;
              }
            }
          din[arg] += d[oy * ow + ox];
        }
    }
  }

  void LayerNormForward(const float* x, const float* gamma, const float* beta, int rows,
                        int cols, float eps, float* y, float* mean, float* rstd) override {
    for (int r = 0; r < rows; ++r) {
      const float* xr = x + static_cast<size_t>(r) * cols;
      float* yr = y + static_cast<size_t>(r) * cols;
      float sum = 0.0f;
      for (int c = 0; c < cols; ++c) sum += xr[c];
      const float mu = sum / cols;
      float var = 0.0f;
      for (int c = 0; c < cols; ++c) var += (xr[c] - mu) * (xr[c] - mu);
      const float rs = 1.0f / std::sqrt(var / cols + eps);
      for (int c = 0; c < cols; ++c) yr[c] = (xr[c] - mu) * rs * gamma[c] + beta[c];
      mean[r] = mu;
      rstd[r] = rs;
    }
  }

  void LayerNormBackward(const float* dy, const float* x, const float* gamma, const float* mean,
                         const float* rstd, int rows, int cols, float* dx, float* dgamma,
                         float* dbeta) override {
    for (int r = 0; r < rows; ++r) {
      const float* xr = x + static_cast<size_t>(r) * cols;
      const float* dr = dy + static_cast<size_t>(r) * cols;
      float* dxr = dx + static_cast<size_t>(r) * cols;
      const float mu = mean[r], rs = rstd[r];
      float sum_dxhat = 0.0f, sum_dxhat_xhat = 0.0f;
      for (int c = 0; c < cols; ++c) {
        const float xhat = (xr[c] - mu) * rs;
        const float dxhat = dr[c] * gamma[c];
        sum_dxhat += dxhat;
        sum_dxhat_xhat += dxhat * xhat;
        dgamma[c] += dr[c] * xhat;
        dbeta[c] += dr[c];
      }
      const float inv_n = 1.0f / cols;
      for (int c = 0; c < cols; ++c) {
        const float xhat = (xr[c] - mu) * rs;
        dxr[c] = rs * (dr[c] * gamma[c] - inv_n * sum_dxhat - xhat * inv_n * sum_dxhat_xhat);
      }
    }
  }

  void Dropout(const float* x, size_t n, float p, uint64_t seed, float* y) override {
    const float scale = p < 1.0f ? 1.0f / (1.0f - p) : 0.0f;
    for (size_t i = 0; i < n; i += 4) {
      const Philox4 r = Philox4x32(seed, i >> 2, 0);
      for (size_t k = 0; k < 4 && i + k < n; ++k)
        y[i + k] = UniformFromBits(r.v[k]) >= p ? x[i + k] * scale : 0.0f;
    }
  }

  void SgdStep(float* p, const float* g, float* buf, size_t n, float lr, float momentum,
               float dampening, float weight_decay, bool nesterov, bool first) override {
    for (size_t i = 0; i < n; ++i) {
      float d = g[i];
      if (weight_decay != 0.0f) d += weight_decay * p[i];
      if (momentum != 0.0f) {
        buf[i] = first ? d : momentum * buf[i] + (1.0f - dampening) * d;
        d = nesterov ? d + momentum * buf[i] : buf[i];
      }
      p[i] -= lr * d;
    }
  }

  void AdamStep(float* p, const float* g, float* m, float* v, size_t n, float lr, float beta1,
                float beta2, float eps, float weight_decay, int64_t step) override {
    const float bc1 = 1.0f - std::pow(beta1, static_cast<float>(step));
    const float bc2 = 1.0f - std::pow(beta2, static_cast<float>(step));
    const float step_size = lr / bc1;
    const float bc2_sqrt = std::sqrt(bc2);
    for (size_t i = 0; i < n; ++i) {
      float d = g[i];
      if (weight_decay != 0.0f) d += weight_decay * p[i];
      m[i] = beta1 * m[i] + (1.0f - beta1) * d;
      v[i] = beta2 * v[i] + (1.0f - beta2) * d * d;
      const float denom = std::sqrt(v[i]) / bc2_sqrt + eps;
      p[i] -= step_size * m[i] / denom;
    }
  }

 private:
  CachingAllocator allocator_;
};

}  // namespace

Device* MakeCpuDevice() {
  static CpuDeviceImpl* device = new CpuDeviceImpl();  // never destroyed: outlives all tensors
  return device;
}

}  // namespace copse::ml::internal
