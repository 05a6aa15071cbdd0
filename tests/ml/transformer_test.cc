// The transformer's layers, spec, text corpus, sampling and optimizer pieces (AdamW, gradient
// clipping, the warmup + cosine schedule). Agreement with PyTorch: gpt_reference_test.cc.
#include <doctest/doctest.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include "ml/language_model.h"
#include "ml/loss.h"
#include "ml/models.h"
#include "ml/optimizer.h"
#include "ml/serialize.h"
#include "ml/text_corpus.h"
#include "ml/trainer.h"
#include "ml/transformer.h"
#include "tests/ml/test_util.h"

using namespace copse::ml;
using copse::ml::testing::GradCheck;
using copse::ml::testing::RandomTensor;

namespace {

/// Non-trivial LayerNorm affine parameters and biases, so that every gradient path carries a
/// signal (the GPT initialization leaves them 1 and 0).
void Perturb(Layer& layer, uint64_t seed) {
  for (Parameter& p : layer.parameters())
    if (p.name.find("bias") != std::string::npos || p.name == "ln.weight")
      p.value.CopyFrom(
          RandomTensor(p.value.shape(), seed++, p.name == "ln.weight" ? 0.5f : -0.3f, p.name == "ln.weight" ? 1.5f : 0.3f));
}

Tensor Ids(const Shape& shape, uint64_t seed, int vocab) {
  PhiloxStream rng(seed, 0);
  std::vector<float> v(static_cast<size_t>(NumElements(shape)));
  for (float& x : v) x = static_cast<float>(rng.NextBelow(static_cast<uint64_t>(vocab)));
  return Tensor::FromVector(shape, v);
}

}  // namespace

TEST_CASE("Transformer.GradCheckAttentionBlock") {
  for (float dropout : {0.0f, 0.25f}) {
    AttentionBlock attn(8, 2, dropout, 0.3f);
    attn.set_index(4);
    attn.InitParameters(5);
    Perturb(attn, 50);
    // Scores of a few units: the softmax is far from uniform, so its backward matters.
    attn.parameters()[2].value.CopyFrom(RandomTensor({24, 8}, 60, -0.6f, 0.6f));
    GradCheck(attn, RandomTensor({2, 5, 8}, 61, -1.5f, 1.5f));
  }
}

TEST_CASE("Transformer.GradCheckMlpBlock") {
  for (float dropout : {0.0f, 0.25f}) {
    MlpBlock mlp(6, dropout, 0.3f);
    mlp.set_index(3);
    mlp.InitParameters(7);
    Perturb(mlp, 70);
    GradCheck(mlp, RandomTensor({2, 3, 6}, 71, -1.5f, 1.5f));
  }
}

TEST_CASE("Transformer.GradCheckEmbeddingAndTheWholeModel") {
  TokenEmbedding emb(11, 4, 6);
  emb.InitParameters(3);
  GradCheck(emb, Ids({3, 5}, 9, 11));  // a repeated id sums its rows' gradients

  // The loss of a whole small GPT against finite differences of a few parameters of each layer.
  Sequential m = *BuildModel("gpt:2-8-2-6", 13);
  for (size_t i = 0; i < m.size(); ++i) Perturb(m.layer(i), 100 + 10 * i);
  const Tensor x = Ids({2, 6}, 14, 256);
  const std::vector<int32_t> labels = [] {
    std::vector<int32_t> l;
    for (int i = 0; i < 12; ++i) l.push_back((i * 37) % 256);
    return l;
  }();
  auto loss_of = [&]() {
    auto y = m.Forward(x, ForwardContext{}, nullptr);
    REQUIRE(y.ok());
    return CrossEntropyLoss(*y, labels)->loss;
  };
  Stash stash;
  auto y = m.Forward(x, ForwardContext{}, &stash);
  REQUIRE(y.ok());
  auto loss = CrossEntropyLoss(*y, labels);
  REQUIRE(loss.ok());
  REQUIRE(m.Backward(loss->grad, stash, false, /*accumulate=*/false).ok());
  for (Parameter* p : m.Parameters()) {
    std::vector<float> host = p->value.ToVector();
    const std::vector<float> grad = p->grad.ToVector();
    for (size_t i : {size_t{0}, host.size() / 2, host.size() - 1}) {
      const float orig = host[i];
      host[i] = orig + 1e-2f;
      p->value.CopyFrom(Tensor::FromVector(p->value.shape(), host));
      const double up = loss_of();
      host[i] = orig - 1e-2f;
      p->value.CopyFrom(Tensor::FromVector(p->value.shape(), host));
      const double down = loss_of();
      host[i] = orig;
      p->value.CopyFrom(Tensor::FromVector(p->value.shape(), host));
      const double numeric = (up - down) / 2e-2;
      INFO(p->name << "[" << i << "] numeric " << numeric << " analytic " << grad[i]);
      CHECK(std::abs(numeric - grad[i]) <= 2e-3 + 3e-2 * std::abs(numeric));
    }
  }
}

TEST_CASE("Transformer.AttentionIsCausal") {
  Sequential m = *BuildModel("gpt:1-8-2-8", 3);
  std::vector<float> ids = Ids({1, 8}, 4, 256).ToVector();
  const std::vector<float> before = m.Predict(Tensor::FromVector({1, 8}, ids))->ToVector();
  ids[5] = static_cast<float>((static_cast<int>(ids[5]) + 1) % 256);  // change token 5
  const std::vector<float> after = m.Predict(Tensor::FromVector({1, 8}, ids))->ToVector();
  for (size_t i = 0; i < before.size(); ++i) {
    const size_t position = i / 256;
    if (position < 5) CHECK(before[i] == after[i]);  // bit for bit: earlier positions never see it
  }
  bool later_changed = false;
  for (size_t i = 5 * 256; i < before.size(); ++i) later_changed |= before[i] != after[i];
  CHECK(later_changed);
}

TEST_CASE("Transformer.SpecErrorsNameWhatIsWrong") {
  auto spec = ParseGptSpec("gpt:4-128-4-64,dropout=0.1");
  REQUIRE(spec.ok());
  CHECK(spec->layers == 4);
  CHECK(spec->dim == 128);
  CHECK(spec->heads == 4);
  CHECK(spec->context == 64);
  CHECK(spec->dropout == doctest::Approx(0.1));
  auto message = [](const std::string& s) { return BuildModel(s, 1).status().message(); };
  CHECK(message("gpt:4-130-4-64").find("WIDTH 130 is not a multiple of HEADS 4") != std::string::npos);
  CHECK(message("gpt:4-128-4").find("needs four numbers") != std::string::npos);
  CHECK(message("gpt:0-128-4-64").find("LAYERS must be an integer") != std::string::npos);
  CHECK(message("gpt:2-x-4-64").find("WIDTH must be an integer") != std::string::npos);
  CHECK(message("gpt:2-64-4-64,dropout=1.5").find("dropout must be a number in [0, 1)") != std::string::npos);
  CHECK(message("gpt:2-64-4-64,lr=3").find("unknown option") != std::string::npos);
  CHECK(message("transformer").find("gpt:L-D-H-C") != std::string::npos);

  Sequential m = *BuildModel("gpt:1-8-2-4", 1);
  auto too_long = m.Predict(Ids({1, 5}, 1, 256));
  REQUIRE_FALSE(too_long.ok());
  CHECK(too_long.status().message().find("5 tokens is longer than the model's context of 4") != std::string::npos);
  auto bad_id = m.Predict(Tensor::FromVector({1, 2}, {3.0f, 256.0f}));
  REQUIRE_FALSE(bad_id.ok());
  CHECK(bad_id.status().message().find("token id 256") != std::string::npos);
}

TEST_CASE("Transformer.LinearOverLeadingDimensions") {
  Linear l(5, 3);
  l.InitParameters(2);
  const Tensor x = RandomTensor({2, 4, 5}, 3);
  LayerStash s3, s2;
  const Tensor y3 = *l.Forward(x, ForwardContext{}, &s3);
  const Tensor y2 = *l.Forward(x.Reshape({8, 5}), ForwardContext{}, &s2);
  CHECK(y3.shape() == Shape{2, 4, 3});
  CHECK(y3.Reshape({8, 3}).BitwiseEquals(y2));
  const Tensor dy = RandomTensor({2, 4, 3}, 4);
  const Tensor dx = *l.Backward(dy, s3, true);
  CHECK(dx.shape() == Shape{2, 4, 5});
  GradCheck(l, x);
}

TEST_CASE("Transformer.TextCorpusSplitsEntriesAndCutsWindows") {
  const auto dir = std::filesystem::temp_directory_path() / ("copse-fortunes-" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  {
    std::ofstream a(dir / "a");
    for (int i = 0; i < 12; ++i) a << "entry " << i << "\n%\n";
    std::ofstream(dir / "a.dat") << "binary index, skipped";
    std::ofstream b(dir / "b");
    b << "last entry\n";
  }
  auto c = LoadFortunes(dir.string());
  REQUIRE(c.ok());
  CHECK(c->files == 2);
  CHECK(c->entries == 13);
  CHECK(c->validation == "entry 9\n%\n");  // entry i goes to validation when i % 10 == 9
  CHECK(c->train.find("entry 9") == std::string::npos);
  CHECK(c->train.rfind("last entry\n%\n") != std::string::npos);

  auto w = TextWindows("abcdefghij", 3);
  REQUIRE(w.ok());
  CHECK(w->size() == 3);  // (10 - 1) / 3 windows
  CHECK(w->labels_per_example() == 3);
  const Batch b = w->Gather(std::vector<int64_t>{1});
  CHECK(b.images.ToVector() == std::vector<float>{'d', 'e', 'f'});
  CHECK(b.labels == std::vector<int32_t>{'e', 'f', 'g'});
  CHECK(b.size() == 3);
  CHECK(b.examples() == 1);
  auto short_text = TextWindows("ab", 4);
  REQUIRE_FALSE(short_text.ok());
  CHECK(short_text.status().message().find("fewer than one window of 4") != std::string::npos);
  auto missing = LoadFortunes((dir / "nope").string());
  REQUIRE_FALSE(missing.ok());
  CHECK(missing.status().message().find("apt-get install fortunes") != std::string::npos);
  std::filesystem::remove_all(dir);
}

TEST_CASE("Transformer.GenerateTextIsDeterministic") {
  Sequential m = *BuildModel("gpt:1-16-2-8", 5);
  auto a = GenerateText(m, 8, "Hello, wor", 20, 0.8f, 7);
  auto b = GenerateText(m, 8, "Hello, wor", 20, 0.8f, 7);
  auto c = GenerateText(m, 8, "Hello, wor", 20, 0.8f, 8);
  REQUIRE(a.ok());
  CHECK(a->size() == 20);
  CHECK(*a == *b);
  CHECK(*a != *c);
  auto greedy = GenerateText(m, 8, "x", 5, 0.0f, 1);
  REQUIRE(greedy.ok());
  CHECK(greedy->size() == 5);
}

TEST_CASE("Transformer.AdamWClippingAndSchedule") {
  // AdamW, first step: p' = p (1 - lr wd) - lr * g / (|g| + eps) per element.
  Parameter p{"w", Tensor::FromVector({2}, {1.0f, -2.0f}), Tensor::FromVector({2}, {0.5f, -0.25f})};
  AdamOptions o;
  o.lr = 0.1f;
  o.weight_decay = 0.5f;
  o.decoupled_weight_decay = true;
  Adam adamw({&p}, o);
  adamw.Step();
  const std::vector<float> v = p.value.ToVector();
  CHECK(v[0] == doctest::Approx(1.0 * 0.95 - 0.1).epsilon(1e-6));
  CHECK(v[1] == doctest::Approx(-2.0 * 0.95 + 0.1).epsilon(1e-6));

  Parameter q{"q", Tensor::FromVector({2}, {0, 0}), Tensor::FromVector({2}, {3.0f, 4.0f})};
  CHECK(ClipGradNorm({&q}, 10.0) == doctest::Approx(5.0));
  CHECK(q.grad.ToVector() == std::vector<float>{3.0f, 4.0f});  // under the limit: untouched
  CHECK(ClipGradNorm({&q}, 1.0) == doctest::Approx(5.0));
  CHECK(q.grad.ToVector()[0] == doctest::Approx(0.6).epsilon(1e-5));

  CHECK(WarmupCosineLr(0, 10, 110, 1.0f, 0.1f) == doctest::Approx(1.0 / 11));
  CHECK(WarmupCosineLr(10, 10, 110, 1.0f, 0.1f) == doctest::Approx(1.0));
  CHECK(WarmupCosineLr(60, 10, 110, 1.0f, 0.1f) == doctest::Approx(0.55));
  CHECK(WarmupCosineLr(200, 10, 110, 1.0f, 0.1f) == doctest::Approx(0.1));
}

TEST_CASE("Transformer.TrainingLearnsTheCorpusAndRerunsBitIdentically") {
  if (!std::filesystem::exists(kFortunesDir)) {
    MESSAGE("skipped: no " << kFortunesDir << " (Debian package fortunes)");
    return;
  }
  TrainOptions o;
  o.model = "gpt:1-32-2-16,dropout=0.1";
  o.optimizer = "adamw";
  o.lr = 3e-3f;
  o.weight_decay = 0.1f;
  o.batch = 16;
  o.max_steps = 60;
  o.lr_schedule = "cosine";
  o.warmup_steps = 5;
  o.clip_norm = 1.0f;
  o.test_limit = 100;
  o.sample_bytes = 30;
  auto a = Train(o);
  REQUIRE(a.ok());
  CHECK(a->language_model);
  CHECK(a->steps == 60);
  CHECK(a->train_tokens == 60 * 16 * 16);
  CHECK(a->validation_loss < 3.2);  // from ln(256) = 5.55 at the start
  CHECK(a->perplexity == doctest::Approx(std::exp(a->validation_loss)));
  CHECK(a->sample.size() == 30);
  auto b = Train(o);
  REQUIRE(b.ok());
  CHECK(a->parameter_digest == b->parameter_digest);
  CHECK(a->sample == b->sample);
}
