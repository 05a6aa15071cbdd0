#include "ml/vector_math.h"

#include <cmath>

#if defined(COPSE_HAVE_LIBMVEC) && defined(__x86_64__)
#include <immintrin.h>

// glibc's AVX-512 vector variants (the x86-64 vector function ABI: 16 floats in a zmm register).
extern "C" __m512 _ZGVeN16v_erff(__m512);
extern "C" __m512 _ZGVeN16v_expf(__m512);
#endif

namespace copse::ml::internal {
namespace {

template <float (*Scalar)(float)>
void ScalarMap(const float* x, size_t n, float* y) {
  for (size_t i = 0; i < n; ++i) y[i] = Scalar(x[i]);
}

float ScalarErf(float v) { return std::erf(v); }
float ScalarExp(float v) { return std::exp(v); }

#if defined(COPSE_HAVE_LIBMVEC) && defined(__x86_64__)

bool HaveAvx512() {
  static const bool have = __builtin_cpu_supports("avx512f");
  return have;
}

/// y = f(x) over 16 lanes at a time; the last lanes masked (unused lanes read 0, never stored).
template <__m512 (*F)(__m512)>
__attribute__((target("avx512f"))) void Avx512Map(const float* x, size_t n, float* y) {
  size_t i = 0;
  for (; i + 16 <= n; i += 16) _mm512_storeu_ps(y + i, F(_mm512_loadu_ps(x + i)));
  if (i < n) {
    const __mmask16 lanes = static_cast<__mmask16>((1u << (n - i)) - 1);
    _mm512_mask_storeu_ps(y + i, lanes, F(_mm512_maskz_loadu_ps(lanes, x + i)));
  }
}

#endif

}  // namespace

const char* VectorMathPath() {
#if defined(COPSE_HAVE_LIBMVEC) && defined(__x86_64__)
  if (HaveAvx512()) return "libmvec avx512";
#endif
  return "scalar";
}

void VectorErf(const float* x, size_t n, float* y) {
#if defined(COPSE_HAVE_LIBMVEC) && defined(__x86_64__)
  if (HaveAvx512()) return Avx512Map<_ZGVeN16v_erff>(x, n, y);
#endif
  ScalarMap<ScalarErf>(x, n, y);
}

void VectorExp(const float* x, size_t n, float* y) {
#if defined(COPSE_HAVE_LIBMVEC) && defined(__x86_64__)
  if (HaveAvx512()) return Avx512Map<_ZGVeN16v_expf>(x, n, y);
#endif
  ScalarMap<ScalarExp>(x, n, y);
}

}  // namespace copse::ml::internal
