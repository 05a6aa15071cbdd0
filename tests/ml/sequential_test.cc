#include <doctest/doctest.h>

#include <algorithm>

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

TEST_CASE("Sequential.UninitializedLayersTakeAnyInitializedModelsParameters") {
  for (const char* name : {"mlp", "cnn"}) {
    CAPTURE(name);
    Sequential init = *BuildModel(name, 7), layers = *BuildModelLayers(name);
    CHECK(layers.Describe() == init.Describe());
    CHECK(layers.ParameterNames() == init.ParameterNames());
    const std::vector<float> w = layers.Parameters()[0]->value.ToVector();
    CHECK(std::all_of(w.begin(), w.end(), [](float v) { return v == 0.0f; }));  // not initialized
    REQUIRE(layers.ImportParameters(init.ExportParameters()).ok());
    CHECK(Digest(layers.ExportParameters()) == Digest(init.ExportParameters()));
  }
  CHECK(!BuildModelLayers("resnet").ok());
}

/// The gradients of `model` on the whole batch (x, labels), in one forward and backward.
NamedTensors BatchGradients(const Sequential& model, const Tensor& x, const std::vector<int32_t>& labels) {
  Stash s;
  auto loss = CrossEntropyLoss(*model.Forward(x, {}, &s), labels);
  REQUIRE(loss.ok());
  REQUIRE(model.Backward(loss->grad, s, false, /*accumulate=*/false).ok());
  return model.ExportGradients();
}

TEST_CASE("Sequential.MicroBatchGradientsSumToTheBatchGradient") {
  Sequential model = *BuildModel("mlp:784-32-10", 5);
  const Tensor x = RandomTensor({8, 1, 28, 28}, 2, 0, 1);
  const std::vector<int32_t> labels{0, 1, 2, 3, 4, 5, 6, 7};
  const NamedTensors full = BatchGradients(model, x, labels);
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

// The B/W split of a pipeline stage: BackwardInputs per micro-batch (dL/dx only), then one
// WeightGradients over every micro-batch, must give the batch's gradients.
TEST_CASE("Sequential.BatchedWeightGradientsSumTheMicroBatches") {
  Sequential model = *BuildModel("mlp:784-32-16-10", 5);
  REQUIRE(model.DefersWeightGradients());
  const Tensor x = RandomTensor({8, 1, 28, 28}, 2, 0, 1);
  const std::vector<int32_t> labels{0, 1, 2, 3, 4, 5, 6, 7};
  const NamedTensors full = BatchGradients(model, x, labels);

  Sequential tail = model.Slice(2, model.size());  // a later stage: it needs dL/dx as well
  std::vector<Stash> stashes(2), tail_stashes(2);
  std::vector<std::vector<Tensor>> parts(2), tail_parts(2);
  for (int m = 0; m < 2; ++m) {
    const std::vector<int32_t> part(labels.begin() + 4 * m, labels.begin() + 4 * m + 4);
    auto l = CrossEntropyLoss(*model.Forward(x.Rows(4 * m, 4 * m + 4), {}, &stashes[m]), part, 8);
    const NamedTensors before = model.ExportGradients();
    auto dx = model.BackwardInputs(l->grad, stashes[m], /*need_input_grad=*/false, &parts[m]);
    REQUIRE(dx.ok());
    CHECK(!dx->defined());
    const NamedTensors after = model.ExportGradients();
    for (size_t i = 0; i < before.size(); ++i) CHECK(after[i].second.BitwiseEquals(before[i].second));
    CHECK(!parts[m][0].defined());  // Flatten has no parameters
    CHECK(parts[m][1].shape() == Shape{4, 32});

    // dL/dx of a later stage: the bits of the full backward's.
    Stash ts;
    const Tensor h = *model.Slice(0, 2).Forward(x.Rows(4 * m, 4 * m + 4), {}, &ts);
    auto tl = CrossEntropyLoss(*tail.Forward(h, {}, &tail_stashes[m]), part, 8);
    auto split_dx = tail.BackwardInputs(tl->grad, tail_stashes[m], true, &tail_parts[m]);
    auto whole_dx = tail.Backward(tl->grad, tail_stashes[m], true);
    REQUIRE(split_dx.ok());
    REQUIRE(whole_dx.ok());
    CHECK(split_dx->BitwiseEquals(*whole_dx));
  }
  REQUIRE(model.WeightGradients({&stashes[0], &stashes[1]}, {&parts[0], &parts[1]}).ok());
  const NamedTensors batched = model.ExportGradients();
  for (size_t i = 0; i < full.size(); ++i) {
    CAPTURE(full[i].first);
    CHECK(RelativeError(batched[i].second, full[i].second) < 1e-5);
  }
  REQUIRE(model.WeightGradients({&stashes[0], &stashes[1]}, {&parts[0], &parts[1]}).ok());
  const NamedTensors again = model.ExportGradients();
  for (size_t i = 0; i < full.size(); ++i) CHECK(again[i].second.BitwiseEquals(batched[i].second));
  CHECK(!model.WeightGradients({&stashes[0]}, {}).ok());

  // Layers that cannot split their backward say so instead of computing something else.
  Sequential cnn = *BuildModel("cnn", 1);
  CHECK(!cnn.DefersWeightGradients());
  Stash cs;
  const Tensor logits = *cnn.Forward(RandomTensor({2, 1, 28, 28}, 3, 0, 1), {}, &cs);
  std::vector<Tensor> cp;
  CHECK(cnn.BackwardInputs(logits, cs, false, &cp).status().code() == copse::StatusCode::kFailedPrecondition);
}

TEST_CASE("Sequential.BadInputIsAnError") {
  Sequential model = *BuildModel("mlp", 1);
  auto r = model.Predict(Tensor::Zeros({2, 1, 20, 20}));
  CHECK(r.status().code() == copse::StatusCode::kInvalidArgument);
  CHECK(r.status().message().find("layer 1") != std::string::npos);
  CHECK(!BuildModel("resnet", 1).ok());
  CHECK(!BuildModel("mlp:784-x-10", 1).ok());
  // Fashion-MNIST's images and classes: any other first or last width fails only at run time.
  CHECK(BuildModel("mlp:5-10", 1).status().message().find("first width must be 784") != std::string::npos);
  CHECK(!BuildModel("mlp:784-64-9", 1).ok());
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

namespace {

/// Random gradients for every parameter of `m`, one set per seed.
std::vector<NamedTensors> RandomGradientSets(const Sequential& m, int sets, uint64_t seed) {
  std::vector<NamedTensors> out(static_cast<size_t>(sets));
  const auto names = m.ParameterNames();
  const auto params = m.Parameters();
  for (int k = 0; k < sets; ++k)
    for (size_t i = 0; i < params.size(); ++i)
      out[static_cast<size_t>(k)].emplace_back(names[i], RandomTensor(params[i]->value.shape(), seed + 100 * k + i));
  return out;
}

}  // namespace

TEST_CASE("Optimizer.SgdStepOutOfPlaceIsSumThenStepBitForBit") {
  const SgdOptions cases[] = {{0.1f, 0.0f, 0.0f, 0.0f, false},
                              {0.1f, 0.9f, 0.0f, 0.0f, false},
                              {0.05f, 0.9f, 0.1f, 1e-3f, false},
                              {0.05f, 0.9f, 0.0f, 1e-3f, true}};
  for (const SgdOptions& o : cases) {
    for (int ngrads = 1; ngrads <= 3; ++ngrads) {
      CAPTURE(o.momentum);
      CAPTURE(o.nesterov);
      CAPTURE(ngrads);
      // mlp:784-64-10's first weight (50,176 floats) spans several of the kernel's work items.
      Sequential a = *BuildModel("mlp:784-64-10", 3), b = *BuildModel("mlp:784-64-10", 3);
      Sgd in_place(a.Parameters(), o), out_of_place(b.Parameters(), o);
      for (int step = 0; step < 3; ++step) {
        const auto sets = RandomGradientSets(a, ngrads, 10 * step + 1);
        REQUIRE(a.ImportGradients(sets[0]).ok());
        for (int k = 1; k < ngrads; ++k)
          for (size_t i = 0; i < sets[0].size(); ++i)
            CpuDevice()->Axpy(1.0f, sets[k][i].second.data(), static_cast<size_t>(sets[k][i].second.numel()),
                              a.Parameters()[i]->grad.data());
        in_place.Step();
        const NamedTensors before = b.ExportParameters();
        NamedTensors old_values;  // the values themselves, as a message would share them
        for (size_t i = 0; i < b.Parameters().size(); ++i)
          old_values.emplace_back(b.ParameterNames()[i], b.Parameters()[i]->value);
        const NamedTensors old_state = out_of_place.StateHandles();
        const std::string old_state_digest = Digest(out_of_place.ExportState());
        std::vector<std::vector<const float*>> grads(b.Parameters().size());
        for (size_t i = 0; i < grads.size(); ++i)
          for (int k = 0; k < ngrads; ++k) grads[i].push_back(sets[k][i].second.data());
        out_of_place.StepOutOfPlace(grads);
        CHECK(Digest(a.ExportParameters()) == Digest(b.ExportParameters()));
        CHECK(Digest(in_place.ExportState()) == Digest(out_of_place.ExportState()));
        // Nothing that was handed out was written.
        CHECK(Digest(old_values) == Digest(before));
        CHECK(Digest(old_state) == old_state_digest);
      }
    }
  }
}

TEST_CASE("Optimizer.DeviceDefaultSgdStepOutOfPlaceMatchesTheCpuKernel") {
  const size_t n = 100'000;
  const Tensor p = RandomTensor({static_cast<int64_t>(n)}, 1), buf = RandomTensor({static_cast<int64_t>(n)}, 2);
  const Tensor g0 = RandomTensor({static_cast<int64_t>(n)}, 3), g1 = RandomTensor({static_cast<int64_t>(n)}, 4);
  const float* grads[] = {g0.data(), g1.data()};
  Tensor p1 = Tensor::Empty({static_cast<int64_t>(n)}), b1 = Tensor::Empty({static_cast<int64_t>(n)});
  Tensor p2 = Tensor::Empty({static_cast<int64_t>(n)}), b2 = Tensor::Empty({static_cast<int64_t>(n)});
  Device* cpu = CpuDevice();
  cpu->SgdStepOutOfPlace(p.data(), grads, 2, buf.data(), n, 0.1f, 0.9f, 0.0f, 1e-4f, false, false, p1.data(), b1.data());
  cpu->Device::SgdStepOutOfPlace(p.data(), grads, 2, buf.data(), n, 0.1f, 0.9f, 0.0f, 1e-4f, false, false, p2.data(), b2.data());
  CHECK(p1.ToVector() == p2.ToVector());
  CHECK(b1.ToVector() == b2.ToVector());
}

TEST_CASE("Sequential.SharedParametersAndFreshGradientsLeaveHandedOutTensorsAlone") {
  Sequential a = *BuildModel("mlp:784-32-10", 1), b = *BuildModel("mlp:784-32-10", 2);
  const NamedTensors values = a.ExportParameters();
  REQUIRE(b.ShareParameters(values).ok());
  for (size_t i = 0; i < values.size(); ++i) CHECK(b.Parameters()[i]->value.data() == values[i].second.data());
  // Gradients handed out (as a message would carry them) survive the next backward.
  const Tensor x = RandomTensor({4, 1, 28, 28}, 2, 0, 1);
  const std::vector<int32_t> labels{0, 1, 2, 3};
  auto backward = [&] {
    Stash s;
    auto loss = CrossEntropyLoss(*b.Forward(x, {}, &s), labels);
    REQUIRE(b.Backward(loss->grad, s, false, /*accumulate=*/false).ok());
  };
  backward();
  NamedTensors handed_out;
  for (size_t i = 0; i < b.Parameters().size(); ++i) handed_out.emplace_back(b.ParameterNames()[i], b.Parameters()[i]->grad);
  const std::string digest = Digest(handed_out);
  b.FreshGradients();
  for (Parameter* p : b.Parameters()) p->grad.Fill(7.0f);
  backward();
  CHECK(Digest(handed_out) == digest);
  CHECK(Digest(b.ExportGradients()) == digest);  // the same gradients again, in new tensors
  // Shapes are checked as ImportParameters checks them.
  Sequential c = *BuildModel("mlp:784-16-10", 1);
  auto bad = c.ShareParameters(values);
  CHECK(bad.code() == copse::StatusCode::kInvalidArgument);
  CHECK(bad.message().find("shape") != std::string::npos);
}
