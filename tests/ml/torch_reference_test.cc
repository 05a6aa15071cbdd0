// copse::ml against PyTorch 1.13 (values in tests/data/ml/torch_reference.bin, written by
// scripts/torch_reference.py): same weights and batch => same logits, loss, gradients and
// optimizer trajectories within 1e-4 relative.
#include <doctest/doctest.h>

#include "ml/loss.h"
#include "ml/ops.h"
#include "ml/optimizer.h"
#include "ml/sequential.h"
#include "tests/ml/test_util.h"

using namespace copse::ml;
using copse::ml::testing::LoadReference;
using copse::ml::testing::ReferencePath;
using copse::ml::testing::RelativeError;

namespace {

constexpr double kTolerance = 1e-4;

Sequential RefMlp() {
  Sequential m;
  m.Add(std::make_shared<Flatten>());
  m.Add(std::make_shared<Linear>(784, 16, Activation::kRelu));
  m.Add(std::make_shared<Linear>(16, 32));
  m.Add(std::make_shared<LayerNormLayer>(32));
  m.Add(std::make_shared<ActivationLayer>(Activation::kGelu));
  m.Add(std::make_shared<Linear>(32, 10));
  return m;
}

Sequential RefCnn() {
  Sequential m;
  m.Add(std::make_shared<Conv2dLayer>(1, 4, 3, 1, 1, Activation::kRelu));
  m.Add(std::make_shared<MaxPool2dLayer>(2, 2));
  m.Add(std::make_shared<Conv2dLayer>(4, 8, 3, 1, 1, Activation::kRelu));
  m.Add(std::make_shared<MaxPool2dLayer>(2, 2));
  m.Add(std::make_shared<Flatten>());
  m.Add(std::make_shared<Linear>(8 * 7 * 7, 10));
  return m;
}

NamedTensors Prefixed(const std::map<std::string, Tensor>& ref, const std::string& prefix) {
  NamedTensors out;
  for (const auto& [name, t] : ref)
    if (name.rfind(prefix, 0) == 0) out.emplace_back(name.substr(prefix.size()), t);
  return out;
}

std::vector<int32_t> Labels(const Tensor& t) {
  std::vector<int32_t> out;
  for (float v : t.ToVector()) out.push_back(static_cast<int32_t>(v));
  return out;
}

void CheckModel(const std::string& prefix, Sequential model, const std::vector<std::string>& optimizers) {
  const auto ref = LoadReference(ReferencePath());
  REQUIRE(model.ImportParameters(Prefixed(ref, prefix + ".param.")).ok());
  const Tensor x = ref.at(prefix + ".input");
  const std::vector<int32_t> labels = Labels(ref.at(prefix + ".labels"));

  Stash stash;
  auto logits = model.Forward(x, ForwardContext{}, &stash);
  REQUIRE(logits.ok());
  CHECK(RelativeError(*logits, ref.at(prefix + ".logits")) < kTolerance);
  auto loss = CrossEntropyLoss(*logits, labels);
  REQUIRE(loss.ok());
  CHECK(loss->loss == doctest::Approx(ref.at(prefix + ".loss").ToVector()[0]).epsilon(kTolerance));
  model.ZeroGrad();
  auto dx = model.Backward(loss->grad, stash, /*need_input_grad=*/true);
  REQUIRE(dx.ok());
  CHECK(RelativeError(*dx, ref.at(prefix + ".dx")) < kTolerance);
  for (const auto& [name, grad] : model.ExportGradients()) {
    INFO(prefix << " gradient " << name);
    CHECK(RelativeError(grad, ref.at(prefix + ".grad." + name)) < kTolerance);
  }

  const NamedTensors initial = model.ExportParameters();
  for (const std::string& opt_name : optimizers) {
    REQUIRE(model.ImportParameters(initial).ok());
    std::unique_ptr<Optimizer> opt;
    if (opt_name == "sgd") {
      opt = std::make_unique<Sgd>(model.Parameters(), SgdOptions{0.1f, 0.9f, 0.0f, 1e-3f, false});
    } else {
      AdamOptions a;
      a.lr = 1e-2f;
      a.weight_decay = 1e-3f;
      opt = std::make_unique<Adam>(model.Parameters(), a);
    }
    for (int step = 0; step < 3; ++step) {
      Stash s;
      auto out = model.Forward(x, ForwardContext{}, &s);
      REQUIRE(out.ok());
      auto l = CrossEntropyLoss(*out, labels);
      REQUIRE(l.ok());
      REQUIRE(model.Backward(l->grad, s, false, /*accumulate=*/false).ok());
      opt->Step();
    }
    for (const auto& [name, value] : model.ExportParameters()) {
      INFO(prefix << " " << opt_name << " parameter " << name);
      CHECK(RelativeError(value, ref.at(prefix + "." + opt_name + "." + name)) < kTolerance);
    }
  }
}

}  // namespace

TEST_CASE("TorchReference.MlpWithLayerNormAndGelu") { CheckModel("mlp", RefMlp(), {"sgd", "adam"}); }

TEST_CASE("TorchReference.Cnn") { CheckModel("cnn", RefCnn(), {"sgd"}); }

TEST_CASE("TorchReference.SoftmaxAndGelu") {
  const auto ref = LoadReference(ReferencePath());
  CHECK(RelativeError(Softmax(ref.at("op.softmax.input")), ref.at("op.softmax.output")) < kTolerance);
  CHECK(RelativeError(Gelu(ref.at("op.gelu.input")), ref.at("op.gelu.output")) < kTolerance);
}
