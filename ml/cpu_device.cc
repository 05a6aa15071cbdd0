#include "ml/cpu_device.h"

#include <cblas.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cmath>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>

#include "common/thread_name.h"
#include "ml/caching_allocator.h"
#include "ml/onednn_gemm.h"
#include "ml/philox.h"
#include "ml/vector_math.h"

namespace copse::ml::internal {
namespace {

constexpr float kInvSqrt2 = 0.70710678118654752440f;
constexpr float kInvSqrt2Pi = 0.39894228040143267794f;

// A persistent pool for the loops that are not BLAS calls (im2col, pooling, activations):
// workers sleep on a condition variable between calls, so no per-op thread start and no
// spinning that would steal the core from OpenBLAS. Work is split into contiguous ranges, each
// output element computed by exactly one thread in a fixed order: results do not depend on the
// thread count.
class ThreadPool {
 public:
  ~ThreadPool() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    for (auto& t : workers_) t.join();
  }

  /// Calls fn(begin, end) over a partition of [0, n) into at most CpuThreads() parts of at
  /// least `grain` items; returns when all parts are done.
  void For(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn) {
    const int64_t parts = std::max<int64_t>(1, std::min<int64_t>(CpuThreads(), grain > 0 ? n / grain : n));
    if (parts <= 1 || n <= 1) {
      if (n > 0) fn(0, n);
      return;
    }
    std::unique_lock<std::mutex> call(call_mu_);  // one parallel region at a time
    EnsureWorkers(static_cast<int>(parts - 1));
    {
      std::lock_guard<std::mutex> lock(mu_);
      fn_ = &fn;
      n_ = n;
      parts_ = parts;
      pending_ = static_cast<int>(parts - 1);
      ++generation_;
    }
    cv_.notify_all();
    fn(0, n / parts);
    std::unique_lock<std::mutex> lock(mu_);
    done_cv_.wait(lock, [&] { return pending_ == 0; });
  }

 private:
  void EnsureWorkers(int count) {
    while (static_cast<int>(workers_.size()) < count) {
      const int id = static_cast<int>(workers_.size()) + 1;
      workers_.emplace_back([this, id] { Loop(id); });
    }
  }

  void Loop(int id) {
    SetThreadName("copse-ml-pool");
    uint64_t seen = 0;
    std::unique_lock<std::mutex> lock(mu_);
    while (true) {
      cv_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
      if (id >= parts_) continue;
      const auto* fn = fn_;
      const int64_t begin = n_ * id / parts_, end = n_ * (id + 1) / parts_;
      lock.unlock();
      (*fn)(begin, end);
      lock.lock();
      if (--pending_ == 0) done_cv_.notify_one();
    }
  }

  std::mutex call_mu_, mu_;
  std::condition_variable cv_, done_cv_;
  std::vector<std::thread> workers_;
  const std::function<void(int64_t, int64_t)>* fn_ = nullptr;
  int64_t n_ = 0, parts_ = 0;
  int pending_ = 0;
  uint64_t generation_ = 0;
  bool stop_ = false;
};

ThreadPool& Pool() {
  static ThreadPool* pool = new ThreadPool();  // leaked on purpose: lives as long as the device
  return *pool;
}

constexpr int64_t kGrain = 1 << 15;

// COPSE_ML_GEMM, read once: unset picks oneDNN where built, else OpenBLAS over the pool. A value
// this build cannot honour is reported once on stderr and treated as unset.
const char* ChooseGemmBackend() {
  const char* env = std::getenv("COPSE_ML_GEMM");
  const std::string v = env ? env : "";
  if (v == "openblas") return "openblas";
  if (v == "openblas-split") return "openblas-split";
  if (!v.empty() && (v != "onednn" || !OneDnnGemmBuilt()))
    std::fprintf(stderr,
                 "copse: COPSE_ML_GEMM=%s: expected onednn (in builds with oneDNN), openblas-split or "
                 "openblas; using the default\n",
                 v.c_str());
  return OneDnnGemmBuilt() ? "onednn" : "openblas-split";
}

}  // namespace

const char* GemmBackend() {
  static const char* const backend = ChooseGemmBackend();
  return backend;
}

bool SplitGemm() { return std::strcmp(GemmBackend(), "openblas") != 0; }

namespace {  // elements per part below which splitting does not pay

// Products with a shorter reduction go to OpenBLAS. Their cost is C's memory traffic (a
// pipeline stage's weight gradient: 1024 x 1024 accumulated over a 16-row micro-batch), which
// OpenBLAS's kernel reads and writes in one pass; oneDNN's matmul made a 1F1B stage's backward
// ~0.4 ms slower there (docs/ml-graphs.md), while it wins at every reduction of 64 and more.
// Unless OpenBLAS runs kernels older than an AVX2 CPU's: it did not recognise the CPU (0.3.21
// on this Emerald Rapids, model 0xCF: "Prescott"), or was built for an older or generic
// target. Those took 2.0 ms for that weight gradient against oneDNN's 0.34 (gemm_bench), so
// every reduction goes to oneDNN. Only OpenBLAS's AVX2 and AVX-512 kernel sets keep the short
// ones.
constexpr int kMinOneDnnDepth = 32;

int MinOneDnnDepth() {
  static const int depth = [] {
    std::string core = openblas_get_corename();
    for (char& ch : core) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
    const bool modern =
        core == "haswell" || core == "zen" || core == "skylakex" || core == "cooperlake" || core == "sapphirerapids";
    return !modern && __builtin_cpu_supports("avx2") ? 1 : kMinOneDnnDepth;
  }();
  return depth;
}

// The conversions of ml/dtype.h written so GCC vectorizes them (a select, no branch), and built
// for AVX-512 beside the baseline: the widest the CPU has is picked when the program loads.
__attribute__((target_clones("avx512f", "default"))) void ToBFloat16(const float* x, size_t n, uint16_t* y) {
  for (size_t i = 0; i < n; ++i) {
    uint32_t u;
    std::memcpy(&u, x + i, 4);
    const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    const uint32_t quiet_nan = (u >> 16) | 0x40u;
    y[i] = static_cast<uint16_t>((u & 0x7fffffffu) > 0x7f800000u ? quiet_nan : rounded);
  }
}

__attribute__((target_clones("avx512f", "default"))) void FromBFloat16(const uint16_t* x, size_t n, float* y) {
  for (size_t i = 0; i < n; ++i) {
    const uint32_t u = uint32_t{x[i]} << 16;
    std::memcpy(y + i, &u, 4);
  }
}

__attribute__((target_clones("avx512f", "default"))) void ToFloat16(const float* x, size_t n, uint16_t* y) {
  for (size_t i = 0; i < n; ++i) y[i] = FloatToFloat16(x[i]);
}

__attribute__((target_clones("avx512f", "default"))) void FromFloat16(const uint16_t* x, size_t n, float* y) {
  for (size_t i = 0; i < n; ++i) y[i] = Float16ToFloat(x[i]);
}

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

  void Gemm(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a, int lda, const float* b, int ldb,
            float beta, float* c, int ldc) override {
    if (m == 0 || n == 0) return;
    if (k == 0) {  // BLAS leaves C untouched for k == 0 only when beta == 1; be explicit.
      for (int i = 0; i < m; ++i)
        for (int j = 0; j < n; ++j) c[static_cast<size_t>(i) * ldc + j] *= beta;
      return;
    }
    if (!SplitGemm()) {  // COPSE_ML_GEMM=openblas: OpenBLAS threads the product itself
      BlasGemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
      return;
    }
    SplitProduct(trans_a, trans_b, m, n, k, a, lda, b, ldb, c, ldc,
                 [&](int mm, int nn, const float* ap, const float* bp, float* cp) {
                   OneThreadGemm(trans_a, trans_b, mm, nn, k, alpha, ap, lda, bp, ldb, beta, cp, ldc);
                 });
  }

  void GemmBf16(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const uint16_t* a, int lda, const uint16_t* b,
                int ldb, float beta, float* c, int ldc) override {
    static const bool onednn = std::strcmp(GemmBackend(), "onednn") == 0;
    if (m == 0 || n == 0) return;
    if (!onednn || k == 0 || (beta != 0.0f && beta != 1.0f)) {
      Device::GemmBf16(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
      return;
    }
    // A block oneDNN refuses (a refusal touches nothing) is widened to float32 on its thread.
    SplitProduct(trans_a, trans_b, m, n, k, a, lda, b, ldb, c, ldc,
                 [&](int mm, int nn, const uint16_t* ap, const uint16_t* bp, float* cp) {
                   if (!OneDnnGemm(DType::kBFloat16, trans_a, trans_b, mm, nn, k, alpha, ap, lda, bp, ldb, beta, cp, ldc))
                     WidenedGemm(trans_a, trans_b, mm, nn, k, alpha, ap, lda, bp, ldb, beta, cp, ldc);
                 });
  }

  /// A bfloat16 product on the calling thread through float32 copies of its operands.
  static void WidenedGemm(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const uint16_t* a, int lda,
                          const uint16_t* b, int ldb, float beta, float* c, int ldc) {
    auto widen = [](const uint16_t* x, int rows, int cols, int ld) {
      std::vector<float> out(static_cast<size_t>(rows) * ld);
      for (int r = 0; r < rows; ++r)
        FromBFloat16(x + static_cast<size_t>(r) * ld, static_cast<size_t>(cols), out.data() + static_cast<size_t>(r) * ld);
      return out;
    };
    const std::vector<float> wa = trans_a ? widen(a, k, m, lda) : widen(a, m, k, lda);
    const std::vector<float> wb = trans_b ? widen(b, n, k, ldb) : widen(b, k, n, ldb);
    OneThreadGemm(trans_a, trans_b, m, n, k, alpha, wa.data(), lda, wb.data(), ldb, beta, c, ldc);
  }

  /// Runs `product(rows, cols, A, B, C)` over C whole, or over blocks of its rows or columns,
  /// one single-threaded product per pool thread: every element of C still comes from one
  /// full-K product, and no BLAS thread spins between calls. oneDNN may order a block's
  /// reduction by the block's shape, so the bits can differ from the unsplit product's: the
  /// same for a given thread count, not across counts (ml.md).
  template <typename T, typename Product>
  static void SplitProduct(bool trans_a, bool trans_b, int m, int n, int k, const T* a, int lda, const T* b, int ldb, float* c,
                           int ldc, const Product& product) {
    if (CpuThreads() < 2 || int64_t{m} * n * k < (int64_t{1} << 22)) {
      product(m, n, a, b, c);
      return;
    }
    const bool split_rows = m >= n;
    const int64_t extent = split_rows ? m : n;
    Pool().For((extent + 15) / 16, 1, [&](int64_t b0, int64_t b1) {
      const int lo = static_cast<int>(b0 * 16), hi = static_cast<int>(std::min<int64_t>(b1 * 16, extent));
      if (hi <= lo) return;
      if (split_rows)
        product(hi - lo, n, trans_a ? a + lo : a + static_cast<size_t>(lo) * lda, b, c + static_cast<size_t>(lo) * ldc);
      else
        product(m, hi - lo, a, trans_b ? b + static_cast<size_t>(lo) * ldb : b + lo, c + lo);
    });
  }

  void FloatToBFloat16(const float* x, size_t n, uint16_t* y) override {
    Pool().For(static_cast<int64_t>(n), kGrain,
               [&](int64_t b, int64_t e) { ToBFloat16(x + b, static_cast<size_t>(e - b), y + b); });
  }

  void BFloat16ToFloat(const uint16_t* x, size_t n, float* y) override {
    Pool().For(static_cast<int64_t>(n), kGrain,
               [&](int64_t b, int64_t e) { FromBFloat16(x + b, static_cast<size_t>(e - b), y + b); });
  }

  void FloatToFloat16(const float* x, size_t n, uint16_t* y) override {
    Pool().For(static_cast<int64_t>(n), kGrain,
               [&](int64_t b, int64_t e) { ToFloat16(x + b, static_cast<size_t>(e - b), y + b); });
  }

  void Float16ToFloat(const uint16_t* x, size_t n, float* y) override {
    Pool().For(static_cast<int64_t>(n), kGrain,
               [&](int64_t b, int64_t e) { FromFloat16(x + b, static_cast<size_t>(e - b), y + b); });
  }

  /// One thread's product: oneDNN where it is the backend in force and the reduction is at
  /// least MinOneDnnDepth() long, else OpenBLAS (single-threaded: SetCpuThreads keeps it so).
  static void OneThreadGemm(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a, int lda, const float* b,
                            int ldb, float beta, float* c, int ldc) {
    static const bool onednn = std::strcmp(GemmBackend(), "onednn") == 0;
    if (onednn && k >= MinOneDnnDepth() &&
        OneDnnGemm(DType::kFloat32, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc))
      return;
    BlasGemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  }

  static void BlasGemm(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a, int lda, const float* b,
                       int ldb, float beta, float* c, int ldc) {
    cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans, m, n, k, alpha, a, lda,
                b, ldb, beta, c, ldc);
  }

  void BiasActivation(const float* x, const float* bias, int rows, int cols, Activation act, float* y) override {
    if (rows == 1 && cols > kGrain) {  // a flat elementwise call: split the row
      Pool().For(cols, kGrain, [&](int64_t b, int64_t e) {
        BiasActivationRows(x + b, bias ? bias + b : nullptr, 1, static_cast<int>(e - b), act, y + b, cols);
      });
      return;
    }
    Pool().For(rows, std::max<int64_t>(1, kGrain / std::max(cols, 1)), [&](int64_t b, int64_t e) {
      BiasActivationRows(x + b * cols, bias, static_cast<int>(e - b), cols, act, y + b * cols, cols);
    });
  }

  static void BiasActivationRows(const float* x, const float* bias, int rows, int cols, Activation act, float* y, int ld) {
    for (int r = 0; r < rows; ++r) {
      const float* xr = x + static_cast<size_t>(r) * ld;
      float* yr = y + static_cast<size_t>(r) * ld;
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
        case Activation::kGelu: GeluRange(xr, bias, static_cast<size_t>(cols), yr); break;
      }
    }
  }

  void ActivationBackward(Activation act, const float* saved, const float* dy, size_t n, float* dx) override {
    Pool().For(static_cast<int64_t>(n), kGrain, [&](int64_t b, int64_t e) {
      ActivationBackwardRange(act, saved + b, dy + b, static_cast<size_t>(e - b), dx + b);
    });
  }

  static void ActivationBackwardRange(Activation act, const float* saved, const float* dy, size_t n, float* dx) {
    switch (act) {
      case Activation::kNone:
        if (dx != dy) std::memcpy(dx, dy, n * sizeof(float));
        break;
      case Activation::kRelu:
        // dy[i] is loaded unconditionally: a load under the condition is one GCC may not
        // if-convert, and the branchy scalar loop it leaves mispredicts on half the elements
        // (~5x slower at a 16 x 1024 micro-batch). Same bits either way.
        for (size_t i = 0; i < n; ++i) {
          const float g = dy[i];
          dx[i] = saved[i] > 0.0f ? g : 0.0f;
        }
        break;
      case Activation::kGelu: GeluGradRange(saved, dy, n, dx); break;
    }
  }

  // GELU in blocks that stay in L1: the arguments of erf (and exp) gathered, mapped by the
  // vector functions (vector_math.h), then combined. x may alias y, dy may alias dx.
  static constexpr size_t kMathBlock = 256;

  /// y = x' * Phi(x') with x' = x + bias (bias may be null).
  static void GeluRange(const float* x, const float* bias, size_t n, float* y) {
    float t[kMathBlock];
    for (size_t b = 0; b < n; b += kMathBlock) {
      const size_t m = std::min(kMathBlock, n - b);
      for (size_t i = 0; i < m; ++i) {
        const float v = bias ? x[b + i] + bias[b + i] : x[b + i];
        y[b + i] = v;
        t[i] = v * kInvSqrt2;
      }
      VectorErf(t, m, t);
      for (size_t i = 0; i < m; ++i) y[b + i] = 0.5f * y[b + i] * (1.0f + t[i]);
    }
  }

  /// dx = dy * (Phi(v) + v * phi(v)) with v the GELU's input.
  static void GeluGradRange(const float* saved, const float* dy, size_t n, float* dx) {
    float cdf[kMathBlock], pdf[kMathBlock];
    for (size_t b = 0; b < n; b += kMathBlock) {
      const size_t m = std::min(kMathBlock, n - b);
      for (size_t i = 0; i < m; ++i) {
        const float v = saved[b + i];
        cdf[i] = v * kInvSqrt2;
        pdf[i] = -0.5f * v * v;
      }
      VectorErf(cdf, m, cdf);
      VectorExp(pdf, m, pdf);
      for (size_t i = 0; i < m; ++i) {
        const float v = saved[b + i];
        dx[b + i] = dy[b + i] * (0.5f * (1.0f + cdf[i]) + v * (kInvSqrt2Pi * pdf[i]));
      }
    }
  }

  /// y[c] = exp(x[c] - mx) for c < n (y may alias x); returns their sum, added in order.
  static float ExpShifted(const float* x, size_t n, float mx, float* y) {
    for (size_t c = 0; c < n; ++c) y[c] = x[c] - mx;
    VectorExp(y, n, y);
    float sum = 0.0f;
    for (size_t c = 0; c < n; ++c) sum += y[c];
    return sum;
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
    Pool().For(b, std::max<int64_t>(1, kGrain / (int64_t{a} * inner)), [&](int64_t ib, int64_t ie) {
      for (int64_t i = ib; i < ie; ++i)
        for (int j = 0; j < a; ++j)
          std::memcpy(out + (static_cast<size_t>(j) * b + i) * inner, x + (static_cast<size_t>(i) * a + j) * inner,
                      sizeof(float) * inner);
    });
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
      const float inv = 1.0f / ExpShifted(xr, static_cast<size_t>(cols), mx, yr);
      for (int c = 0; c < cols; ++c) yr[c] *= inv;
    }
  }

  double SoftmaxCrossEntropy(const float* logits, const int32_t* labels, int rows, int cols, float grad_scale,
                             float* dlogits) override {
    double total = 0.0;
    std::vector<float> scratch(dlogits ? 0 : static_cast<size_t>(cols));
    for (int r = 0; r < rows; ++r) {
      const float* xr = logits + static_cast<size_t>(r) * cols;
      float* er = dlogits ? dlogits + static_cast<size_t>(r) * cols : scratch.data();  // exp(x - max)
      const float mx = *std::max_element(xr, xr + cols), picked = xr[labels[r]];
      const float sum = ExpShifted(xr, static_cast<size_t>(cols), mx, er);
      const float lse = mx + std::log(sum);
      total += static_cast<double>(lse - picked);
      if (dlogits) {
        const float inv = 1.0f / sum;
        for (int c = 0; c < cols; ++c) er[c] = er[c] * inv * grad_scale;
        er[labels[r]] -= grad_scale;
      }
    }
    return total;
  }

  void Im2Col(const float* x, const ConvGeom& g, float* col) override {
    const int oh = g.out_h(), ow = g.out_w();
    const size_t ncols = static_cast<size_t>(g.batch) * oh * ow;
    const int64_t taps = int64_t{g.channels} * g.kernel_h * g.kernel_w;
    Pool().For(taps * g.batch, std::max<int64_t>(1, kGrain / (int64_t{oh} * ow)), [&](int64_t tb, int64_t te) {
      for (int64_t t = tb; t < te; ++t) {
        const int64_t tap = t / g.batch;
        const int b = static_cast<int>(t % g.batch);
        const int c = static_cast<int>(tap / (g.kernel_h * g.kernel_w));
        const int i = static_cast<int>(tap / g.kernel_w % g.kernel_h);
        const int j = static_cast<int>(tap % g.kernel_w);
        float* row = col + static_cast<size_t>(tap) * ncols;
        const float* plane = x + (static_cast<size_t>(b) * g.channels + c) * g.height * g.width;
        for (int y = 0; y < oh; ++y) {
          float* out = row + (static_cast<size_t>(b) * oh + y) * ow;
          const int iy = y * g.stride - g.pad + i;
          if (iy < 0 || iy >= g.height) {
            std::fill(out, out + ow, 0.0f);
            continue;
          }
          const float* src = plane + static_cast<size_t>(iy) * g.width;
          if (g.stride == 1) {
            const int x0 = std::max(0, g.pad - j), x1 = std::min(ow, g.width + g.pad - j);
            for (int xo = 0; xo < x0; ++xo) out[xo] = 0.0f;
            for (int xo = x0; xo < x1; ++xo) out[xo] = src[xo - g.pad + j];
            for (int xo = std::max(x0, x1); xo < ow; ++xo) out[xo] = 0.0f;
          } else {
            for (int xo = 0; xo < ow; ++xo) {
              const int ix = xo * g.stride - g.pad + j;
              out[xo] = (ix >= 0 && ix < g.width) ? src[ix] : 0.0f;
            }
          }
        }
      }
    });
  }

  void Col2Im(const float* col, const ConvGeom& g, float* dx) override {
    const int oh = g.out_h(), ow = g.out_w();
    const size_t ncols = static_cast<size_t>(g.batch) * oh * ow;
    const size_t plane_size = static_cast<size_t>(g.height) * g.width;
    // One (image, channel) plane of dx per item; taps are added in a fixed order.
    Pool().For(int64_t{g.batch} * g.channels, std::max<int64_t>(1, kGrain / static_cast<int64_t>(plane_size)),
               [&](int64_t pb, int64_t pe) {
                 for (int64_t p = pb; p < pe; ++p) {
                   const int b = static_cast<int>(p / g.channels), c = static_cast<int>(p % g.channels);
                   float* plane = dx + (static_cast<size_t>(b) * g.channels + c) * plane_size;
                   std::fill(plane, plane + plane_size, 0.0f);
                   for (int i = 0; i < g.kernel_h; ++i)
                     for (int j = 0; j < g.kernel_w; ++j) {
                       const float* row = col + ((static_cast<size_t>(c) * g.kernel_h + i) * g.kernel_w + j) * ncols;
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
               });
  }

  void MaxPoolForward(const float* x, const ConvGeom& g, float* y) override {
    const int oh = g.out_h(), ow = g.out_w();
    const int64_t planes = int64_t{g.batch} * g.channels;
    Pool().For(planes, std::max<int64_t>(1, kGrain / (int64_t{g.height} * g.width)), [&](int64_t pb, int64_t pe) {
      for (int64_t p = pb; p < pe; ++p) {
        const float* in = x + p * g.height * g.width;
        float* out = y + p * oh * ow;
        if (g.kernel_h == 2 && g.kernel_w == 2 && g.stride == 2) {  // the common case, inlined
          for (int oy = 0; oy < oh; ++oy) {
            const float* r0 = in + (2 * oy) * g.width;
            const float* r1 = r0 + g.width;
            for (int ox = 0; ox < ow; ++ox) out[oy * ow + ox] = r0[2 * ox + Arg2x2(r0 + 2 * ox, r1 + 2 * ox, g.width)];
          }
          continue;
        }
        for (int oy = 0; oy < oh; ++oy)
          for (int ox = 0; ox < ow; ++ox) {
            const float* w = in + (oy * g.stride) * g.width + ox * g.stride;
            out[oy * ow + ox] = w[ArgMaxWindow(w, g)];
          }
      }
    });
  }

  /// ArgMaxWindow for a 2x2 window given its two rows (same first-maximum and NaN rules).
  static inline int Arg2x2(const float* r0, const float* r1, int width) {
    int arg = 0;
    float best = r0[0];
    if (best != best) return 0;
    if (r0[1] > best || r0[1] != r0[1]) {
      best = r0[1];
      arg = 1;
      if (best != best) return arg;
    }
    if (r1[0] > best || r1[0] != r1[0]) {
      best = r1[0];
      arg = width;
      if (best != best) return arg;
    }
    if (r1[1] > best || r1[1] != r1[1]) arg = width + 1;
    return arg;
  }

  /// Offset (in `w`'s plane) of the first maximum of the window at `w`; NaN wins (propagates).
  static int ArgMaxWindow(const float* w, const ConvGeom& g) {
    int arg = 0;
    float best = w[0];
    if (std::isnan(best)) return 0;
    for (int i = 0; i < g.kernel_h; ++i)
      for (int j = 0; j < g.kernel_w; ++j) {
        const int off = i * g.width + j;
        const float v = w[off];
        if (v > best) {
          best = v;
          arg = off;
        } else if (std::isnan(v)) {
          return off;
        }
      }
    return arg;
  }

  void MaxPoolBackward(const float* x, const float* dy, const ConvGeom& g, float* dx) override {
    const int oh = g.out_h(), ow = g.out_w();
    const int64_t planes = int64_t{g.batch} * g.channels;
    const size_t plane_size = static_cast<size_t>(g.height) * g.width;
    Pool().For(planes, std::max<int64_t>(1, kGrain / static_cast<int64_t>(plane_size)), [&](int64_t pb, int64_t pe) {
      for (int64_t p = pb; p < pe; ++p) {
        const float* in = x + p * plane_size;
        float* din = dx + p * plane_size;
        const float* d = dy + p * oh * ow;
        std::fill(din, din + plane_size, 0.0f);
        if (g.kernel_h == 2 && g.kernel_w == 2 && g.stride == 2) {
          for (int oy = 0; oy < oh; ++oy) {
            const int base = (2 * oy) * g.width;
            for (int ox = 0; ox < ow; ++ox)
              din[base + 2 * ox + Arg2x2(in + base + 2 * ox, in + base + g.width + 2 * ox, g.width)] += d[oy * ow + ox];
          }
          continue;
        }
        for (int oy = 0; oy < oh; ++oy)
          for (int ox = 0; ox < ow; ++ox) {
            const int base = (oy * g.stride) * g.width + ox * g.stride;
            din[base + ArgMaxWindow(in + base, g)] += d[oy * ow + ox];
          }
      }
    });
  }

  void LayerNormForward(const float* x, const float* gamma, const float* beta, int rows, int cols, float eps, float* y,
                        float* mean, float* rstd) override {
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

  void LayerNormBackward(const float* dy, const float* x, const float* gamma, const float* mean, const float* rstd, int rows,
                         int cols, float* dx, float* dgamma, float* dbeta) override {
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
    // Parallel over blocks of 4 elements (one Philox call each).
    Pool().For(static_cast<int64_t>((n + 3) / 4), kGrain / 4, [&](int64_t bb, int64_t be) {
      for (size_t i = static_cast<size_t>(bb) * 4; i < static_cast<size_t>(be) * 4 && i < n; i += 4) {
        const Philox4 r = Philox4x32(seed, i >> 2, 0);
        for (size_t k = 0; k < 4 && i + k < n; ++k) y[i + k] = UniformFromBits(r.v[k]) >= p ? x[i + k] * scale : 0.0f;
      }
    });
  }

  void BatchedGemm(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a, int lda, const float* b, int ldb,
                   float beta, float* c, int ldc, const GemmBatch& batch) override {
    // One single-threaded product per pool part: each C_i comes from one whole product, so the
    // bits do not depend on the thread count.
    const int64_t count = int64_t{batch.outer} * batch.inner;
    const int64_t per = std::max<int64_t>(1, (int64_t{1} << 18) / std::max<int64_t>(1, int64_t{m} * n * k));
    Pool().For(count, per, [&](int64_t b0, int64_t b1) {
      for (int64_t i = b0; i < b1; ++i) {
        const int64_t o = i / batch.inner, j = i % batch.inner;
        OneThreadGemm(trans_a, trans_b, m, n, k, alpha, a + o * batch.a_outer + j * batch.a_inner, lda,
                      b + o * batch.b_outer + j * batch.b_inner, ldb, beta, c + o * batch.c_outer + j * batch.c_inner, ldc);
      }
    });
  }

  void CausalSoftmax(const float* x, int blocks, int t, float* y) override {
    Pool().For(int64_t{blocks} * t, std::max<int64_t>(1, kGrain / std::max(1, t)), [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        const int keep = static_cast<int>(r % t) + 1;
        const float* xr = x + r * t;
        float* yr = y + r * t;
        const float mx = *std::max_element(xr, xr + keep);
        const float inv = 1.0f / ExpShifted(xr, static_cast<size_t>(keep), mx, yr);
        for (int c = 0; c < keep; ++c) yr[c] *= inv;
        std::fill(yr + keep, yr + t, 0.0f);
      }
    });
  }

  void CausalSoftmaxBackward(const float* y, const float* dy, int blocks, int t, float* dx) override {
    Pool().For(int64_t{blocks} * t, std::max<int64_t>(1, kGrain / std::max(1, t)), [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        const int keep = static_cast<int>(r % t) + 1;
        const float* yr = y + r * t;
        const float* dr = dy + r * t;
        float* xr = dx + r * t;
        float dot = 0.0f;
        for (int c = 0; c < keep; ++c) dot += yr[c] * dr[c];
        for (int c = 0; c < keep; ++c) xr[c] = yr[c] * (dr[c] - dot);
        std::fill(xr + keep, xr + t, 0.0f);
      }
    });
  }

  void EmbeddingForward(const float* ids, size_t n, const float* table, int dim, float* out) override {
    for (size_t i = 0; i < n; ++i)
      std::memcpy(out + i * dim, table + static_cast<size_t>(ids[i]) * dim, static_cast<size_t>(dim) * sizeof(float));
  }

  void EmbeddingBackward(const float* ids, size_t n, const float* dy, int vocab, int dim, float beta, float* dtable) override {
    const size_t total = static_cast<size_t>(vocab) * dim;
    if (beta == 0.0f)
      std::fill(dtable, dtable + total, 0.0f);
    else if (beta != 1.0f)
      for (size_t i = 0; i < total; ++i) dtable[i] *= beta;
    for (size_t i = 0; i < n; ++i) {
      float* row = dtable + static_cast<size_t>(ids[i]) * dim;
      const float* d = dy + i * dim;
      for (int c = 0; c < dim; ++c) row[c] += d[c];
    }
  }

  double SumSquares(const float* x, size_t n) override {
    // Chunks of 4096 each summed in double, then the chunk sums in order: the CUDA device's
    // order, so both give the same bits.
    double total = 0.0;
    for (size_t b = 0; b < n; b += 4096) {
      const size_t e = std::min(n, b + 4096);
      double s = 0.0;
      for (size_t i = b; i < e; ++i) s += static_cast<double>(x[i]) * x[i];
      total += s;
    }
    return total;
  }

  void Scale(float* x, size_t n, float a) override {
    for (size_t i = 0; i < n; ++i) x[i] *= a;
  }

  void SgdStep(float* p, const float* g, float* buf, size_t n, float lr, float momentum, float dampening, float weight_decay,
               bool nesterov, bool first) override {
    Pool().For(static_cast<int64_t>(n), kGrain, [=](int64_t b, int64_t e) {
      SgdRange(p + b, g + b, buf ? buf + b : nullptr, static_cast<size_t>(e - b), lr, momentum, dampening, weight_decay, nesterov,
               first);
    });
  }

  // One pass over memory: p and buf are read where they lie and the results written straight to
  // p_out and buf_out (no copies to step in place); with several gradients, each block of their
  // sum is assembled in a stack buffer (L1). The arithmetic is SgdRange's, element by element,
  // so the bits are SgdStep's.
  void SgdStepOutOfPlace(const float* p, const float* const* grads, int ngrads, const float* buf, size_t n, float lr,
                         float momentum, float dampening, float weight_decay, bool nesterov, bool first, float* p_out,
                         float* buf_out) override {
    Pool().For(static_cast<int64_t>(n), kGrain, [=](int64_t b, int64_t e) {
      constexpr size_t kBlock = 1024;
      alignas(64) float sum[kBlock];
      for (size_t i = static_cast<size_t>(b); i < static_cast<size_t>(e); i += kBlock) {
        const size_t len = std::min(kBlock, static_cast<size_t>(e) - i);
        const float* g = grads[0] + i;
        if (ngrads > 1) {
          std::copy(g, g + len, sum);
          for (int k = 1; k < ngrads; ++k) {  // Axpy(1, ...): 1 * x is x exactly
            const float* __restrict x = grads[k] + i;
            for (size_t j = 0; j < len; ++j) sum[j] += x[j];
          }
          g = sum;
        }
        SgdRangeOutOfPlace(p + i, g, first || !buf ? nullptr : buf + i, len, lr, momentum, dampening, weight_decay, nesterov,
                           p_out + i, buf_out ? buf_out + i : nullptr);
      }
    });
  }

  // Branches hoisted out of the loops and restrict pointers, so that GCC vectorizes each case.
  static void SgdRange(float* __restrict p, const float* __restrict g, float* __restrict buf, size_t n, float lr, float momentum,
                       float dampening, float wd, bool nesterov, bool first) {
    if (momentum == 0.0f) {
      for (size_t i = 0; i < n; ++i) p[i] -= lr * (g[i] + wd * p[i]);
      return;
    }
    const float keep = 1.0f - dampening;
    if (first) {
      for (size_t i = 0; i < n; ++i) buf[i] = g[i] + wd * p[i];
    } else if (wd == 0.0f) {
      for (size_t i = 0; i < n; ++i) buf[i] = momentum * buf[i] + keep * g[i];
    } else {
      for (size_t i = 0; i < n; ++i) buf[i] = momentum * buf[i] + keep * (g[i] + wd * p[i]);
    }
    if (nesterov) {
      for (size_t i = 0; i < n; ++i) p[i] -= lr * ((g[i] + wd * p[i]) + momentum * buf[i]);
    } else {
      for (size_t i = 0; i < n; ++i) p[i] -= lr * buf[i];
    }
  }

  // SgdRange reading p and buf (nullptr on the first step) and writing p_out and buf_out:
  // the same operations on each element, in the same order.
  static void SgdRangeOutOfPlace(const float* __restrict p, const float* __restrict g, const float* __restrict buf, size_t n,
                                 float lr, float momentum, float dampening, float wd, bool nesterov, float* __restrict p_out,
                                 float* __restrict buf_out) {
    if (momentum == 0.0f) {
      for (size_t i = 0; i < n; ++i) p_out[i] = p[i] - lr * (g[i] + wd * p[i]);
      return;
    }
    const float keep = 1.0f - dampening;
    if (buf == nullptr) {
      for (size_t i = 0; i < n; ++i) buf_out[i] = g[i] + wd * p[i];
    } else if (wd == 0.0f) {
      for (size_t i = 0; i < n; ++i) buf_out[i] = momentum * buf[i] + keep * g[i];
    } else {
      for (size_t i = 0; i < n; ++i) buf_out[i] = momentum * buf[i] + keep * (g[i] + wd * p[i]);
    }
    if (nesterov) {
      for (size_t i = 0; i < n; ++i) p_out[i] = p[i] - lr * ((g[i] + wd * p[i]) + momentum * buf_out[i]);
    } else {
      for (size_t i = 0; i < n; ++i) p_out[i] = p[i] - lr * buf_out[i];
    }
  }

  void AdamStep(float* p, const float* g, float* m, float* v, size_t n, float lr, float beta1, float beta2, float eps,
                float weight_decay, bool decoupled, int64_t step) override {
    const float bc1 = 1.0f - std::pow(beta1, static_cast<float>(step));
    const float bc2 = 1.0f - std::pow(beta2, static_cast<float>(step));
    const float step_size = lr / bc1;
    const float bc2_sqrt = std::sqrt(bc2);
    const float l2 = decoupled ? 0.0f : weight_decay, keep = decoupled ? 1.0f - lr * weight_decay : 1.0f;
    Pool().For(static_cast<int64_t>(n), kGrain, [&](int64_t b, int64_t e) {
      for (size_t i = static_cast<size_t>(b); i < static_cast<size_t>(e); ++i) {
        if (keep != 1.0f) p[i] *= keep;
        float d = g[i];
        if (l2 != 0.0f) d += l2 * p[i];
        m[i] = beta1 * m[i] + (1.0f - beta1) * d;
        v[i] = beta2 * v[i] + (1.0f - beta2) * d * d;
        const float denom = std::sqrt(v[i]) / bc2_sqrt + eps;
        p[i] -= step_size * m[i] / denom;
      }
    });
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
