// The transformer's layers, spec, text corpus, sampling and optimizer pieces (AdamW, gradient
// clipping, the warmup + cosine schedule). Agreement with PyTorch: gpt_reference_test.cc.
#include <doctest/doctest.h>

#include <cmath>
#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <thread>

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

namespace {

/// A tensor-parallel group of threads in one process: each AllReduceSum call waits for every
/// member's part of that call, then each member adds them in rank order.
struct ThreadHub {
  std::mutex mu;
  std::condition_variable cv;
  std::map<int64_t, std::vector<Tensor>> parts;
  std::map<int64_t, int> readers;
};

class ThreadMember final : public TensorParallelGroup {
 public:
  ThreadMember(ThreadHub* hub, int rank, int size) : hub_(hub), rank_(rank), size_(size) {}
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  copse::Result<Tensor> AllReduceSum(const Tensor& partial) override {
    std::vector<Tensor> all;
    {
      std::unique_lock<std::mutex> lock(hub_->mu);
      auto& slot = hub_->parts[call_];
      if (slot.empty()) slot.resize(static_cast<size_t>(size_));
      slot[static_cast<size_t>(rank_)] = partial;
      hub_->cv.notify_all();
      hub_->cv.wait(lock, [&] {
        for (const Tensor& t : hub_->parts[call_])
          if (!t.defined()) return false;
        return true;
      });
      all = hub_->parts[call_];
      if (++hub_->readers[call_] == size_) hub_->parts.erase(call_), hub_->readers.erase(call_);
      ++call_;
    }
    Tensor sum = all[0].Clone();
    for (size_t r = 1; r < all.size(); ++r) sum.device()->Axpy(1.0f, all[r].data(), static_cast<size_t>(sum.numel()), sum.data());
    return sum;
  }

 private:
  ThreadHub* hub_;
  int rank_, size_;
  int64_t call_ = 0;
};

/// Three SGD steps of `model` on (ids, labels); returns the loss of the first.
double TrainThreeSteps(Sequential& model, const Tensor& ids, const std::vector<int32_t>& labels) {
  Sgd sgd(model.Parameters(), SgdOptions{0.1f, 0.9f, 0.0f, 0.0f, false});
  double first = 0;
  for (int step = 0; step < 3; ++step) {
    ForwardContext ctx;
    ctx.seed = MixSeed(9, static_cast<uint64_t>(step));
    Stash stash;
    auto y = model.Forward(ids, ctx, &stash);
    REQUIRE(y.ok());
    auto loss = CrossEntropyLoss(*y, labels);
    REQUIRE(loss.ok());
    if (step == 0) first = loss->loss;
    REQUIRE(model.Backward(loss->grad, stash, false, false).ok());
    sgd.Step();
  }
  return first;
}

}  // namespace

TEST_CASE("Transformer.ShardsJoinBackIntoTheWholeModel") {
  const Sequential full = *BuildModel("gpt:2-16-4-8", 3);
  const NamedTensors whole = full.ExportParameters();
  std::vector<NamedTensors> shards;
  for (int r = 0; r < 2; ++r) {
    // A shard built on its own is initialized as that shard of the whole model, bit for bit.
    const Sequential shard = *BuildModelShard("gpt:2-16-4-8", 3, r, 2);
    const NamedTensors mine = shard.ExportParameters();
    const NamedTensors expected = ShardParameters(whole, r, 2);
    REQUIRE(mine.size() == expected.size());
    for (size_t i = 0; i < mine.size(); ++i) {
      INFO(mine[i].first);
      CHECK(mine[i].second.BitwiseEquals(expected[i].second));
    }
    shards.push_back(mine);
  }
  CHECK(shards[0][4].second.shape() == Shape{24, 16});  // 2.qkv.weight: half of q, k and v
  CHECK(shards[0][6].second.shape() == Shape{16, 8});   // 2.proj.weight: half the columns
  auto joined = UnshardParameters(shards);
  REQUIRE(joined.ok());
  for (size_t i = 0; i < whole.size(); ++i) CHECK(joined->at(i).second.BitwiseEquals(whole[i].second));

  CHECK(BuildModelShard("gpt:2-16-4-8", 1, 0, 3).status().message().find("4 heads cannot be split over 3") != std::string::npos);
  CHECK(BuildModelShard("mlp", 1, 0, 2).status().message().find("gpt models only") != std::string::npos);
  Sequential lonely = *BuildModelShard("gpt:1-8-2-4", 1, 0, 2);
  auto no_group = lonely.Predict(Ids({1, 4}, 1, 256));
  REQUIRE_FALSE(no_group.ok());
  CHECK(no_group.status().message().find("needs its group") != std::string::npos);
}

TEST_CASE("Transformer.TensorParallelTrainingMatchesTheWholeModel") {
  const std::string spec = "gpt:2-32-4-16,dropout=0.1";
  const Tensor ids = Ids({3, 16}, 21, 256);
  std::vector<int32_t> labels;
  for (int i = 0; i < 48; ++i) labels.push_back((i * 53 + 11) % 256);
  Sequential full = *BuildModel(spec, 5);
  const double full_loss = TrainThreeSteps(full, ids, labels);
  const NamedTensors expected = full.ExportParameters();

  for (int ranks : {2, 4}) {
    CAPTURE(ranks);
    auto run = [&]() {
      ThreadHub hub;
      std::vector<NamedTensors> shards(static_cast<size_t>(ranks));
      std::vector<double> losses(static_cast<size_t>(ranks));
      std::vector<std::thread> threads;
      for (int r = 0; r < ranks; ++r) {
        threads.emplace_back([&, r] {
          ThreadMember member(&hub, r, ranks);
          Sequential shard = *BuildModelShard(spec, 5, r, ranks);
          shard.SetTensorParallelGroup(&member);
          losses[static_cast<size_t>(r)] = TrainThreeSteps(shard, ids, labels);
          shards[static_cast<size_t>(r)] = shard.ExportParameters();
        });
      }
      for (auto& t : threads) t.join();
      for (int r = 1; r < ranks; ++r) CHECK(losses[static_cast<size_t>(r)] == losses[0]);  // every member saw the same logits
      CHECK(losses[0] == doctest::Approx(full_loss).epsilon(1e-5));
      // Replicated parameters (embeddings, LayerNorms, row-parallel biases, the head) stay
      // bit-identical on every member without being exchanged.
      for (size_t i = 0; i < shards[0].size(); ++i)
        if (shards[0][i].second.shape() == expected[i].second.shape())  // not split
          for (int r = 1; r < ranks; ++r) CHECK(shards[static_cast<size_t>(r)][i].second.BitwiseEquals(shards[0][i].second));
      return *UnshardParameters(shards);
    };
    const NamedTensors joined = run();
    // The same sums as the whole model's products, split at another point: a few ulps apart.
    for (size_t i = 0; i < expected.size(); ++i) {
      INFO(expected[i].first);
      CHECK(copse::ml::testing::RelativeError(joined[i].second, expected[i].second) < 1e-5);
    }
    const NamedTensors again = run();
    CHECK(Digest(again) == Digest(joined));  // and bit-identical when run again
  }
}
