// The matrix products of the MLP's pipeline stage 1 (Linear 1024->1024) on one thread, through
// copse's CPU device (oneDNN or OpenBLAS, as COPSE_ML_GEMM picks: cpu_device.h), at a
// micro-batch of 16 rows (1F1B M=8 of a 128 batch) and a whole batch of 128: forward (x W^T),
// weight gradient (dz^T x, accumulated) and input gradient (dz W). Prints the median of 300
// runs in ms and GFLOP/s, the backend, and which OpenBLAS kernel set OPENBLAS_CORETYPE pins
// (docs/ml-graphs.md compares them with PyTorch). Then the stage's SGD step (momentum 0.9, out of
// place as a pipeline update runs it: Sgd::StepOutOfPlace) over its 1,049,600 parameters on one
// and two threads, in ms and in GB/s of the five arrays it reads and writes.
//
//   <build>/bench/gemm_bench;  COPSE_ML_GEMM=openblas-split <build>/bench/gemm_bench
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <vector>

#include "ml/cpu_device.h"
#include "ml/device.h"

namespace {

double MedianMs(const std::function<void()>& f) {
  for (int i = 0; i < 20; ++i) f();
  std::vector<double> ms;
  for (int i = 0; i < 300; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    f();
    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  std::nth_element(ms.begin(), ms.begin() + ms.size() / 2, ms.end());
  return ms[ms.size() / 2];
}

}  // namespace

int main() {
  using copse::ml::CpuDevice;
  copse::ml::SetCpuThreads(1);
  const char* coretype = std::getenv("OPENBLAS_CORETYPE");
  std::printf("gemm_bench: Linear 1024->1024, 1 thread; products: %s; OpenBLAS kernels: %s\n\n",
              copse::ml::internal::GemmBackend(), coretype ? coretype : "chosen by OpenBLAS for this CPU");
  constexpr int kF = 1024;
  std::vector<float> w(kF * kF, 0.01f), g(kF * kF, 0.f), x(128 * kF, 0.5f), dz(128 * kF, 0.2f), y(128 * kF);
  auto* dev = CpuDevice();
  std::printf("%5s %22s %22s %22s\n", "rows", "forward ms (GFLOP/s)", "dW ms (GFLOP/s)", "dX ms (GFLOP/s)");
  for (int n : {16, 128}) {
    const double flop = 2.0 * n * kF * kF;
    const double fwd = MedianMs([&] { dev->Gemm(false, true, n, kF, kF, 1.f, x.data(), kF, w.data(), kF, 0.f, y.data(), kF); });
    const double dw = MedianMs([&] { dev->Gemm(true, false, kF, kF, n, 1.f, dz.data(), kF, x.data(), kF, 1.f, g.data(), kF); });
    const double dx = MedianMs([&] { dev->Gemm(false, false, n, kF, kF, 1.f, dz.data(), kF, w.data(), kF, 0.f, y.data(), kF); });
    std::printf("%5d %12.3f (%6.1f) %13.3f (%6.1f) %13.3f (%6.1f)\n", n, fwd, flop / fwd / 1e6, dw, flop / dw / 1e6, dx,
                flop / dx / 1e6);
  }
  std::printf("\n%8s %22s\n", "threads", "SGD step ms (GB/s)");
  const size_t np = size_t{kF} * kF + kF;
  std::vector<float> p(np, 0.01f), mom(np, 0.001f), grad(np, 0.002f), p_out(np), mom_out(np);
  const float* grads[] = {grad.data()};
  for (int threads : {1, 2}) {
    copse::ml::SetCpuThreads(threads);
    const double ms = MedianMs([&] {
      dev->SgdStepOutOfPlace(p.data(), grads, 1, mom.data(), np, 0.05f, 0.9f, 0.f, 0.f, false, false, p_out.data(),
                             mom_out.data());
    });
    std::printf("%8d %12.3f (%6.1f)\n", threads, ms, 5.0 * np * sizeof(float) / ms / 1e6);
  }
  return 0;
}
