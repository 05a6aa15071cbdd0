// Finite-difference gradient checks of every layer and of the loss.
#include <doctest/doctest.h>

#include "ml/loss.h"
#include "tests/ml/test_util.h"

using namespace copse::ml;
using copse::ml::testing::GradCheck;
using copse::ml::testing::RandomTensor;

namespace {
template <typename L>
void Init(L& layer, int index = 3) {
  layer.set_index(index);
  layer.InitParameters(11);
}
}  // namespace

TEST_CASE("GradCheck.Linear") {
  for (Activation act : {Activation::kNone, Activation::kRelu, Activation::kGelu}) {
    Linear l(7, 5, act);
    Init(l);
    GradCheck(l, RandomTensor({4, 7}, 3, -2, 2));
  }
  Linear nobias(6, 3, Activation::kNone, /*bias=*/false);
  Init(nobias);
  GradCheck(nobias, RandomTensor({2, 6}, 4));
}

TEST_CASE("GradCheck.Activations") {
  ActivationLayer relu(Activation::kRelu), gelu(Activation::kGelu);
  GradCheck(relu, RandomTensor({3, 9}, 5, -2, 2));
  GradCheck(gelu, RandomTensor({3, 9}, 6, -3, 3));
}

TEST_CASE("GradCheck.Conv2d") {
  Conv2dLayer same(2, 3, 3, 1, 1);
  Init(same);
  GradCheck(same, RandomTensor({2, 2, 5, 5}, 7));
  Conv2dLayer strided(3, 2, 3, 2, 0, Activation::kRelu);
  Init(strided);
  GradCheck(strided, RandomTensor({2, 3, 7, 6}, 8));
  Conv2dLayer gelu(1, 2, 2, 1, 1, Activation::kGelu);
  Init(gelu);
  GradCheck(gelu, RandomTensor({1, 1, 4, 4}, 9));
}

TEST_CASE("GradCheck.MaxPoolAndFlatten") {
  MaxPool2dLayer pool(2, 2);
  GradCheck(pool, RandomTensor({2, 3, 6, 6}, 10));
  MaxPool2dLayer overlapping(3, 1);
  GradCheck(overlapping, RandomTensor({1, 2, 5, 5}, 11));
  Flatten flatten;
  GradCheck(flatten, RandomTensor({2, 3, 2, 2}, 12));
}

TEST_CASE("GradCheck.LayerNorm") {
  LayerNormLayer ln(8);
  Init(ln);
  // Non-trivial affine parameters so that dgamma and dbeta are both exercised.
  ln.parameters()[0].value.CopyFrom(RandomTensor({8}, 13, 0.5f, 1.5f));
  ln.parameters()[1].value.CopyFrom(RandomTensor({8}, 14));
  GradCheck(ln, RandomTensor({4, 8}, 15, -2, 2));
}

TEST_CASE("GradCheck.Dropout") {
  DropoutLayer d(0.3f);
  d.set_index(2);
  GradCheck(d, RandomTensor({4, 16}, 16));
}

TEST_CASE("GradCheck.CrossEntropy") {
  const Tensor logits = RandomTensor({5, 4}, 17, -3, 3);
  const std::vector<int32_t> labels{0, 3, 2, 1, 3};
  auto out = CrossEntropyLoss(logits, labels);
  REQUIRE(out.ok());
  std::vector<float> v = logits.ToVector();
  const std::vector<float> grad = out->grad.ToVector();
  const double eps = 1e-3;
  for (size_t i = 0; i < v.size(); ++i) {
    const float orig = v[i];
    v[i] = orig + static_cast<float>(eps);
    const double up = CrossEntropyLoss(Tensor::FromVector({5, 4}, v), labels)->loss;
    v[i] = orig - static_cast<float>(eps);
    const double down = CrossEntropyLoss(Tensor::FromVector({5, 4}, v), labels)->loss;
    v[i] = orig;
    CHECK((up - down) / (2 * eps) == doctest::Approx(grad[i]).epsilon(1e-2).scale(0.05));
  }
  // A label outside [0, C) is an error, not a crash.
  CHECK(CrossEntropyLoss(logits, std::vector<int32_t>{0, 1, 2, 3, 4}).status().code() == copse::StatusCode::kInvalidArgument);
}
