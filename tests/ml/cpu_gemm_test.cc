// The CPU device's matrix products, whichever backend serves them (oneDNN for reductions of 32
// and more where built, OpenBLAS otherwise: cpu_device.h), against a double-precision reference,
// and the bit-for-bit repeatability that recovery relies on.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "ml/cpu_device.h"
#include "ml/device.h"
#include "ml/onednn_gemm.h"

using namespace copse::ml;

namespace {

struct Product {
  bool ta, tb;
  int m, n, k;
  int pad;  // extra columns in every leading dimension
  float beta;
  int lda() const { return (ta ? m : k) + pad; }
  int ldb() const { return (tb ? k : n) + pad; }
  int ldc() const { return n + pad; }
};

std::vector<float> Values(size_t count, uint32_t seed) {
  std::vector<float> v(count);
  for (auto& x : v) {
    seed = seed * 1664525u + 1013904223u;
    x = static_cast<float>(seed >> 8) / static_cast<float>(1u << 24) * 2.0f - 1.0f;
  }
  return v;
}

struct Operands {
  std::vector<float> a, b, c;
  explicit Operands(const Product& p)
      : a(Values(static_cast<size_t>(p.ta ? p.k : p.m) * p.lda(), 1)),
        b(Values(static_cast<size_t>(p.tb ? p.n : p.k) * p.ldb(), 2)),
        c(Values(static_cast<size_t>(p.m) * p.ldc(), 3)) {}
  float A(const Product& p, int i, int l) const { return p.ta ? a[size_t(l) * p.lda() + i] : a[size_t(i) * p.lda() + l]; }
  float B(const Product& p, int l, int j) const { return p.tb ? b[size_t(j) * p.ldb() + l] : b[size_t(l) * p.ldb() + j]; }
};

// Checks c (after the product) against the reference computed from the operands and c0, and
// that the padding columns of C were left alone.
void CheckAgainstReference(const Product& p, const Operands& in, const std::vector<float>& c) {
  int bad = 0;
  for (int i = 0; i < p.m; ++i) {
    for (int j = 0; j < p.ldc(); ++j) {
      const size_t at = size_t(i) * p.ldc() + j;
      if (j >= p.n) {
        bad += c[at] != in.c[at];
        continue;
      }
      double ref = p.beta * static_cast<double>(in.c[at]), scale = std::fabs(ref);
      for (int l = 0; l < p.k; ++l) {
        const double t = static_cast<double>(in.A(p, i, l)) * in.B(p, l, j);
        ref += t;
        scale += std::fabs(t);
      }
      bad += std::fabs(c[at] - ref) > 1e-5 * scale + 1e-6;
    }
  }
  CHECK_MESSAGE(bad == 0, "ta=" << p.ta << " tb=" << p.tb << " m=" << p.m << " n=" << p.n << " k=" << p.k << " pad=" << p.pad
                                << " beta=" << p.beta << ": " << bad << " wrong elements");
}

std::vector<Product> Products() {
  std::vector<Product> out;
  // Short reductions (OpenBLAS), long ones (oneDNN where built), a micro-batch's shapes, and
  // shapes large enough for the device to split them across its pool.
  const int shapes[][3] = {{1, 1, 1}, {3, 5, 7}, {16, 64, 16}, {16, 96, 64}, {7, 33, 129}, {128, 256, 200}, {300, 40, 48}};
  for (const auto& s : shapes)
    for (bool ta : {false, true})
      for (bool tb : {false, true})
        for (float beta : {0.0f, 1.0f}) out.push_back({ta, tb, s[0], s[1], s[2], (s[0] + s[2]) % 3, beta});
  return out;
}

std::vector<float> RunDevice(const Product& p, const Operands& in) {
  std::vector<float> c = in.c;
  CpuDevice()->Gemm(p.ta, p.tb, p.m, p.n, p.k, 1.0f, in.a.data(), p.lda(), in.b.data(), p.ldb(), p.beta, c.data(), p.ldc());
  return c;
}

}  // namespace

TEST_CASE("CpuGemm.EveryLayoutMatchesADoubleReferenceOnOneAndTwoThreads") {
  for (int threads : {1, 2}) {
    SetCpuThreads(threads);
    for (const Product& p : Products()) {
      const Operands in(p);
      CheckAgainstReference(p, in, RunDevice(p, in));
    }
  }
  SetCpuThreads(1);
}

TEST_CASE("CpuGemm.AProductGivesTheSameBitsOnEveryThreadAndEveryCall") {
  // Recovery re-runs a vertex on whatever worker thread is free: each thread builds its own
  // oneDNN primitives, and they must agree bit for bit.
  SetCpuThreads(1);
  for (const Product& p : Products()) {
    const Operands in(p);
    const std::vector<float> first = RunDevice(p, in), again = RunDevice(p, in);
    std::vector<float> other;
    std::thread([&] { other = RunDevice(p, in); }).join();
    CHECK(std::memcmp(first.data(), again.data(), first.size() * sizeof(float)) == 0);
    CHECK(std::memcmp(first.data(), other.data(), first.size() * sizeof(float)) == 0);
  }
}

TEST_CASE("CpuGemm.OneDnnServesWhatItCanAndRefusesTheRest") {
#ifdef COPSE_HAVE_ONEDNN
  const char* pick = std::getenv("COPSE_ML_GEMM");
  if (!pick) CHECK(std::string(internal::GemmBackend()) == "onednn");  // built with it: in force
#endif
  if (!internal::OneDnnGemmBuilt()) {
    MESSAGE("built without oneDNN: its own checks skipped");
    return;
  }
  for (const Product& p : Products()) {
    const Operands in(p);
    std::vector<float> c = in.c;
    REQUIRE(internal::OneDnnGemm(DType::kFloat32, p.ta, p.tb, p.m, p.n, p.k, 1.0f, in.a.data(), p.lda(), in.b.data(), p.ldb(),
                                 p.beta, c.data(), p.ldc()));
    CheckAgainstReference(p, in, c);
  }
  // alpha scales the product (by a power of two here: exactly) before C is added.
  const Product p{false, false, 4, 4, 4, 0, 0.0f};
  const Operands in(p);
  std::vector<float> product = in.c;
  REQUIRE(internal::OneDnnGemm(DType::kFloat32, false, false, 4, 4, 4, 1.0f, in.a.data(), 4, in.b.data(), 4, 0.0f, product.data(),
                               4));
  for (const float beta : {0.0f, 1.0f}) {
    std::vector<float> scaled = in.c;
    REQUIRE(internal::OneDnnGemm(DType::kFloat32, false, false, 4, 4, 4, 0.125f, in.a.data(), 4, in.b.data(), 4, beta,
                                 scaled.data(), 4));
    for (size_t i = 0; i < scaled.size(); ++i) CHECK(scaled[i] == doctest::Approx(0.125f * product[i] + beta * in.c[i]));
  }
  // What the matmul primitive cannot express is refused, with C untouched.
  std::vector<float> c = in.c;
  CHECK_FALSE(
      internal::OneDnnGemm(DType::kFloat32, false, false, 4, 4, 4, 1.0f, in.a.data(), 4, in.b.data(), 4, 0.5f, c.data(), 4));
  CHECK(c == in.c);
}
