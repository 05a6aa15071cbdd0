#include <doctest/doctest.h>

#include "ml/loss.h"
#include "ml/models.h"
#include "ml/optimizer.h"
#include "ml/serialize.h"
#include "tests/ml/test_util.h"

using namespace copse::ml;
using copse::ml::testing::RandomTensor;
using copse::ml::testing::RelativeError;

TEST_CASE("Sequential.SlicesComposeToTheWholeModel") {
  Sequential model = *BuildModel("cnn", 3);
  const Tensor x = RandomTensor({4, 1, 28, 28}, 1, 0, 1);
  const std::vector<int32_t> labels{1, 2, 3, 4};
  Stash whole;
  Tensor logits = *model.Forward(x, {}, &whole);
  auto loss = CrossEntropyLoss(logits, labels);
  REQUIRE(loss.ok());
  model.ZeroGrad();
  REQUIRE(model.Backward(loss->grad, whole, false).ok());
  const NamedTensors expected = model.ExportGradients();

  // Two pipeline stages cut at layer 3: same logits, same gradients, same parameter names.
  Sequential s0 = model.Slice(0, 3), s1 = model.Slice(3, model.size());
  CHECK(s1.layer(0).index() == 3);
  Stash a, b;
  Tensor h = *s0.Forward(x, {}, &a);
  Tensor logits2 = *s1.Forward(h, {}, &b);
  CHECK(logits2.BitwiseEquals(logits));
  model.ZeroGrad();
  Tensor dh = *s1.Backward(loss->grad, b, true);
  REQUIRE(s0.Backward(dh, a, false).ok());
  NamedTensors got = s0.ExportGradients();
  for (auto& g : s1.ExportGradients()) got.push_back(g);
  REQUIRE(got.size() == expected.size());
  for (size_t i = 0; i < got.size(); ++i) {
    CHECK(got[i].first == expected[i].first);
    CHECK(got[i].second.BitwiseEquals(expected[i].second));
  }
}

TEST_CASE("Sequential.InitDependsOnlyOnSeedAndLayerIndex") {
  Sequential a = *BuildModel("mlp", 7), b = *BuildModel("mlp", 7), c = *BuildModel("mlp", 8);
  CHECK(Digest(a.ExportParameters()) == Digest(b.ExportParameters()));
  CHECK(Digest(a.ExportParameters()) != Digest(c.ExportParameters()));
  // A stage re-initialized on its own gets the values the whole model has.
  Sequential stage = b.Slice(2, 4);
  stage.InitParameters(7);
  CHECK(Digest(stage.ExportParameters()) == Digest(a.Slice(2, 4).ExportParameters()));
  // PyTorch's default bound: U(-1/sqrt(fan_in), 1/sqrt(fan_in)).
  const std::vector<float> w = a.Parameters()[0]->value.ToVector();
  float lo = 1, hi = -1;
  for (float v : w) lo = std::min(lo, v), hi = std::max(hi, v);
  CHECK(hi <= 1.0f / 28.0f);
  CHECK(lo >= -1.0f / 28.0f);
  CHECK(hi > 0.9f / 28.0f);
}

TEST_CASE("Sequential.MicroBatchGradientsSumToTheBatchGradient") {
  Sequential model = *BuildModel("mlp:784-32-10", 5);
  const Tensor x = RandomTensor({8, 1, 28, 28}, 2, 0, 1);
  const std::vector<int32_t> labels{0, 1, 2, 3, 4, 5, 6, 7};
  Stash s;
  auto loss = CrossEntropyLoss(*model.Forward(x, {}, &s), labels);
  REQUIRE(model.Backward(loss->grad, s, false, /*accumulate=*/false).ok());
  const NamedTensors full = model.ExportGradients();
  model.ZeroGrad();
  for (int m = 0; m < 2; ++m) {
    Stash ms;
    const std::vector<int32_t> part(labels.begin() + 4 * m, labels.begin() + 4 * m + 4);
    auto l = CrossEntropyLoss(*model.Forward(x.Rows(4 * m, 4 * m + 4), {}, &ms), part, 8);
    REQUIRE(model.Backward(l->grad, ms, false).ok());
  }
  const NamedTensors summed = model.ExportGradients();
  for (size_t i = 0; i < full.size(); ++i) CHECK(RelativeError(summed[i].second, full[i].second) < 1e-5);
}

TEST_CASE("Sequential.BadInputIsAnError") {
  Sequential model = *BuildModel("mlp", 1);
  auto r = model.Predict(Tensor::Zeros({2, 1, 20, 20}));
  CHECK(r.status().code() == copse::StatusCode::kInvalidArgument);
  CHECK(r.status().message().find("layer 1") != std::string::npos);
  CHECK(!BuildModel("resnet", 1).ok());
  CHECK(!BuildModel("mlp:784-x-10", 1).ok());
}

TEST_CASE("Optimizer.StateRoundTrips") {
  Sequential a = *BuildModel("mlp:784-16-10", 1), b = *BuildModel("mlp:784-16-10", 1);
  Sgd oa(a.Parameters(), SgdOptions{0.1f, 0.9f, 0.0f, 0.0f, false});
  for (Parameter* p : a.Parameters()) p->grad.Fill(0.5f);
  oa.Step();
  Sgd ob(b.Parameters(), SgdOptions{0.1f, 0.9f, 0.0f, 0.0f, false});
  REQUIRE(b.ImportParameters(a.ExportParameters()).ok());
  REQUIRE(ob.ImportState(oa.ExportState()).ok());
  CHECK(ob.steps() == 1);
  for (Parameter* p : b.Parameters()) p->grad.Fill(0.25f);
  for (Parameter* p : a.Parameters()) p->grad.Fill(0.25f);
  oa.Step();
  ob.Step();
  CHECK(Digest(a.ExportParameters()) == Digest(b.ExportParameters()));
}
