// The CPU device's vector erf and exp (ml/vector_math.h): glibc's accuracy, and the same bits
// for an element wherever it sits in the array (the thread split must not change results).
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "ml/vector_math.h"

using copse::ml::internal::VectorErf;
using copse::ml::internal::VectorExp;

namespace {

/// Units in the last place between two finite floats of one sign (or both zero).
int64_t Ulps(float a, float b) {
  int32_t ia, ib;
  std::memcpy(&ia, &a, 4);
  std::memcpy(&ib, &b, 4);
  const int64_t d = static_cast<int64_t>(ia) - ib;
  return d < 0 ? -d : d;
}

template <typename Map, typename Scalar>
void CheckMap(Map map, Scalar scalar, float lo, float hi) {
  const size_t n = 100003;
  std::vector<float> x(n), y(n);
  for (size_t i = 0; i < n; ++i) x[i] = lo + (hi - lo) * static_cast<float>(i) / static_cast<float>(n);
  map(x.data(), n, y.data());
  int64_t worst = 0;
  for (size_t i = 0; i < n; ++i) {
    const float want = scalar(x[i]);
    if (want == 0.0f || std::signbit(want) != std::signbit(y[i])) {
      CHECK(std::fabs(y[i] - want) < 1e-37f);
      continue;
    }
    worst = std::max(worst, Ulps(y[i], want));
  }
  MESSAGE(std::string(copse::ml::internal::VectorMathPath())
          << ": largest difference from the scalar function: " << worst << " ulp");
  CHECK(worst <= 8);  // glibc states up to 4 for its vector erff and expf; a margin for other versions
  // Any offset and length, in place or not: the same bits for every element.
  for (size_t offset : {size_t{0}, size_t{1}, size_t{7}, size_t{15}, size_t{16}, size_t{33}}) {
    for (size_t len : {size_t{1}, size_t{5}, size_t{16}, size_t{17}, size_t{250}}) {
      std::vector<float> part(x.begin() + offset, x.begin() + offset + len);
      map(part.data(), len, part.data());
      CHECK(std::memcmp(part.data(), y.data() + offset, len * sizeof(float)) == 0);
    }
  }
}

}  // namespace

TEST_CASE("VectorMath.ErfMatchesTheScalarFunctionAndIsPositionIndependent") {
  CheckMap(
      VectorErf, [](float v) { return std::erf(v); }, -6.0f, 6.0f);
}

TEST_CASE("VectorMath.ExpMatchesTheScalarFunctionAndIsPositionIndependent") {
  CheckMap(
      VectorExp, [](float v) { return std::exp(v); }, -87.0f, 88.0f);
  float special[3] = {-200.0f, 0.0f, 100.0f};  // underflow, 1, overflow
  VectorExp(special, 3, special);
  CHECK(special[0] == 0.0f);
  CHECK(special[1] == 1.0f);
  CHECK(std::isinf(special[2]));
}
