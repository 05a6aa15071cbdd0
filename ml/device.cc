#include "ml/device.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <atomic>
#include <thread>

#include "ml/cpu_device.h"

#if COPSE_HAVE_CUDA
#include "ml/cuda/cuda_device.h"
#endif

namespace copse::ml {
namespace {
std::atomic<int> cpu_threads{0};
}  // namespace

Device* CpuDevice() { return internal::MakeCpuDevice(); }

void Device::BatchedGemm(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a, int lda, const float* b,
                         int ldb, float beta, float* c, int ldc, const GemmBatch& batch) {
  for (int o = 0; o < batch.outer; ++o)
    for (int j = 0; j < batch.inner; ++j)
      Gemm(trans_a, trans_b, m, n, k, alpha, a + o * batch.a_outer + j * batch.a_inner, lda,
           b + o * batch.b_outer + j * batch.b_inner, ldb, beta, c + o * batch.c_outer + j * batch.c_inner, ldc);
}

namespace {

/// A product of 16-bit operands through float32 copies of them (`widen` converts), in `d`'s memory.
void WidenedGemm(Device& d, void (Device::*widen)(const uint16_t*, size_t, float*), bool trans_a, bool trans_b, int m, int n,
                 int k, float alpha, const uint16_t* a, int lda, const uint16_t* b, int ldb, float beta, float* c, int ldc) {
  // The elements a row-major operand of `rows` rows of `cols` at stride `ld` spans.
  auto extent = [](int rows, int cols, int ld) { return rows == 0 ? size_t{0} : size_t(rows - 1) * ld + cols; };
  const size_t na = trans_a ? extent(k, m, lda) : extent(m, k, lda);
  const size_t nb = trans_b ? extent(n, k, ldb) : extent(k, n, ldb);
  float* wa = static_cast<float*>(d.Allocate(std::max<size_t>(na, 1) * sizeof(float)));
  float* wb = static_cast<float*>(d.Allocate(std::max<size_t>(nb, 1) * sizeof(float)));
  (d.*widen)(a, na, wa);
  (d.*widen)(b, nb, wb);
  d.Gemm(trans_a, trans_b, m, n, k, alpha, wa, lda, wb, ldb, beta, c, ldc);
  d.Free(wa, std::max<size_t>(na, 1) * sizeof(float));
  d.Free(wb, std::max<size_t>(nb, 1) * sizeof(float));
}

}  // namespace

bool Device::AllFinite(const std::vector<Span>& spans) {
  for (const Span& s : spans)
    if (!std::isfinite(SumSquares(s.x, s.n))) return false;  // no finite float32 square overflows a double
  return true;
}

void Device::GemmBf16(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const uint16_t* a, int lda, const uint16_t* b,
                      int ldb, float beta, float* c, int ldc) {
  WidenedGemm(*this, &Device::BFloat16ToFloat, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

void Device::GemmF16(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const uint16_t* a, int lda, const uint16_t* b,
                     int ldb, float beta, float* c, int ldc) {
  WidenedGemm(*this, &Device::Float16ToFloat, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

void Device::SgdStepOutOfPlace(const float* p, const float* const* grads, int ngrads, const float* buf, size_t n, float lr,
                               float momentum, float dampening, float weight_decay, bool nesterov, bool first, float* p_out,
                               float* buf_out) {
  const size_t bytes = n * sizeof(float);
  float* g = static_cast<float*>(Allocate(bytes));
  CopyOnDevice(g, grads[0], bytes);
  for (int k = 1; k < ngrads; ++k) Axpy(1.0f, grads[k], n, g);
  CopyOnDevice(p_out, p, bytes);
  if (buf_out && !first) CopyOnDevice(buf_out, buf, bytes);
  SgdStep(p_out, g, buf_out, n, lr, momentum, dampening, weight_decay, nesterov, first);
  Free(g, bytes);
}

Result<Device*> CudaDevice(int ordinal) {
#if COPSE_HAVE_CUDA
  return cuda::GetCudaDevice(ordinal);
#else
  return Status::Unavailable("cuda:" + std::to_string(ordinal) + ": copse was built without CUDA support");
#endif
}

int CudaDeviceCount() {
#if COPSE_HAVE_CUDA
  return cuda::CudaDeviceCount();
#else
  return 0;
#endif
}

int64_t SmallestCudaMemoryMb(int gpus) {
  if (gpus < 1 || gpus > CudaDeviceCount()) return 0;
  int64_t smallest = 0;
#if COPSE_HAVE_CUDA
  for (int i = 0; i < gpus; ++i) {
    const int64_t mb = cuda::CudaMemoryMb(i);
    if (mb == 0) return 0;
    smallest = i == 0 ? mb : std::min(smallest, mb);
  }
#endif
  return smallest;
}

Result<Device*> DeviceByName(const std::string& name) {
  if (name == "cpu") return CpuDevice();
  if (name == "cuda" || name == "gpu") return CudaDevice(0);
  if (name.rfind("cuda:", 0) == 0) {
    const std::string rest = name.substr(5);
    if (!rest.empty() && rest.find_first_not_of("0123456789") == std::string::npos) return CudaDevice(std::stoi(rest));
  }
  return Status::InvalidArgument("device '" + name + "': expected cpu, cuda or cuda:N");
}

void SetCpuThreads(int threads) {
  if (threads < 1) threads = 1;
  if (cpu_threads.exchange(threads) != threads) openblas_set_num_threads(internal::SplitGemm() ? 1 : threads);
}

int CpuThreads() {
  const int t = cpu_threads.load();
  if (t > 0) return t;
  SetCpuThreads(static_cast<int>(std::max(1u, std::thread::hardware_concurrency())));
  return cpu_threads.load();
}

}  // namespace copse::ml
