// The GPT of copse::ml against PyTorch 1.13 (tests/data/ml/gpt_reference.bin, written by
// scripts/torch_gpt.py reference): from the same parameters and batch, the same logits, loss and
// gradients within 1e-4 relative (float32 sums taken in another order differ by a few ulps),
// and the same parameters after three AdamW steps with gradient clipping within 3e-4.
#include <doctest/doctest.h>

#include "ml/loss.h"
#include "ml/models.h"
#include "ml/optimizer.h"
#include "tests/ml/test_util.h"

using namespace copse::ml;
using copse::ml::testing::ComparableAfterAdam;
using copse::ml::testing::LoadReference;
using copse::ml::testing::RelativeError;

namespace {

constexpr double kTolerance = 1e-4;
// Adam divides each gradient by its own running magnitude, so the relative rounding differences
// of small gradients reach the parameters undamped: three steps leave up to ~1.1e-4 here.
constexpr double kOptimizerTolerance = 3e-4;

NamedTensors Prefixed(const std::map<std::string, Tensor>& ref, const std::string& prefix) {
  NamedTensors out;
  for (const auto& [name, t] : ref)
    if (name.rfind(prefix, 0) == 0) out.emplace_back(name.substr(prefix.size()), t);
  return out;
}

}  // namespace

TEST_CASE("TorchReference.Gpt") {
  const auto ref = LoadReference(std::string(COPSE_SOURCE_DIR) + "/tests/data/ml/gpt_reference.bin");
  Sequential model = *BuildModelLayers("gpt:2-16-2-8");
  REQUIRE(model.ImportParameters(Prefixed(ref, "gpt.param.")).ok());
  const Tensor ids = ref.at("gpt.input");
  std::vector<int32_t> labels;
  for (float v : ref.at("gpt.labels").ToVector()) labels.push_back(static_cast<int32_t>(v));

  ForwardContext ctx;
  ctx.training = false;
  Stash stash;
  auto logits = model.Forward(ids, ctx, &stash);
  REQUIRE(logits.ok());
  CHECK(RelativeError(*logits, ref.at("gpt.logits")) < kTolerance);
  auto loss = CrossEntropyLoss(*logits, labels);
  REQUIRE(loss.ok());
  CHECK(loss->loss == doctest::Approx(ref.at("gpt.loss").ToVector()[0]).epsilon(kTolerance));
  REQUIRE(model.Backward(loss->grad, stash, false, /*accumulate=*/false).ok());
  for (const auto& [name, grad] : model.ExportGradients()) {
    INFO("gradient " << name);
    CHECK(RelativeError(grad, ref.at("gpt.grad." + name)) < kTolerance);
  }

  AdamOptions a;
  a.lr = 1e-2f;
  a.weight_decay = 0.1f;
  a.decoupled_weight_decay = true;
  Adam adamw(model.Parameters(), a);
  const std::vector<float> norms = ref.at("gpt.adamw.norms").ToVector();
  for (int step = 0; step < 3; ++step) {
    Stash s;
    auto out = model.Forward(ids, ctx, &s);
    REQUIRE(out.ok());
    auto l = CrossEntropyLoss(*out, labels);
    REQUIRE(l.ok());
    REQUIRE(model.Backward(l->grad, s, false, /*accumulate=*/false).ok());
    CHECK(ClipGradNorm(model.Parameters(), 0.5) == doctest::Approx(norms[static_cast<size_t>(step)]).epsilon(kTolerance));
    adamw.Step();
  }
  for (const auto& [name, value] : model.ExportParameters()) {
    INFO("parameter after AdamW " << name);
    CHECK(RelativeError(ComparableAfterAdam(name, value), ComparableAfterAdam(name, ref.at("gpt.adamw." + name))) <
          kOptimizerTolerance);
  }
}
