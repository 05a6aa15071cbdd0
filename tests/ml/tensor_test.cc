#include <doctest/doctest.h>

#include "ml/ops.h"
#include "ml/tensor.h"

using namespace copse::ml;

TEST_CASE("Tensor.MatmulMatchesNaive") {
  Tensor a = Tensor::FromVector({2, 3}, {1, 2, 3, 4, 5, 6});
  Tensor b = Tensor::FromVector({3, 2}, {7, 8, 9, 10, 11, 12});
  CHECK(Matmul(a, b).ToVector() == std::vector<float>{58, 64, 139, 154});
  CHECK(Matmul(a, a, false, true).ToVector() == std::vector<float>{14, 32, 32, 77});
}
