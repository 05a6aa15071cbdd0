// Mixed precision (ml/dtype.h): bfloat16 conversion, the bfloat16 product, tensors and their
// encoding with a dtype, and every layer and whole training runs in bf16 against float32.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>
#include <stdexcept>
#include <vector>

#include "ml/layers.h"
#include "ml/loss.h"
#include "ml/models.h"
#include "ml/ops.h"
#include "ml/serialize.h"
#include "ml/text_corpus.h"
#include "ml/trainer.h"
#include "ml/transformer.h"
#include "tests/ml/test_util.h"

using namespace copse::ml;
using copse::ml::testing::RandomTensor;
using copse::ml::testing::RelativeError;

namespace {

float FromBits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

/// The values of `t` rounded to bfloat16 and back, as a float32 tensor.
Tensor Rounded(const Tensor& t) { return t.Cast(DType::kBFloat16).Cast(DType::kFloat32); }

/// op(A) op(B) + beta C in double precision over row-major float matrices.
std::vector<float> ReferenceProduct(bool ta, bool tb, int m, int n, int k, const std::vector<float>& a,
                                    const std::vector<float>& b, float beta, const std::vector<float>& c) {
  std::vector<float> out(static_cast<size_t>(m) * n);
  for (int i = 0; i < m; ++i)
    for (int j = 0; j < n; ++j) {
      double s = 0;
      for (int l = 0; l < k; ++l)
        s += static_cast<double>(ta ? a[static_cast<size_t>(l) * m + i] : a[static_cast<size_t>(i) * k + l]) *
             (tb ? b[static_cast<size_t>(j) * k + l] : b[static_cast<size_t>(l) * n + j]);
      out[static_cast<size_t>(i) * n + j] = static_cast<float>(s + beta * c[static_cast<size_t>(i) * n + j]);
    }
  return out;
}

bool HaveFashionMnist() { return std::filesystem::exists(std::string(kFashionMnistDir) + "/train-images-idx3-ubyte.gz"); }

}  // namespace

TEST_CASE("BFloat16.RoundsToNearestEvenAndKeepsNaN") {
  CHECK(FloatToBFloat16(1.0f) == 0x3f80);
  CHECK(FloatToBFloat16(-2.0f) == 0xc000);
  CHECK(FloatToBFloat16(FromBits(0x3f808000)) == 0x3f80);  // a tie: to the even mantissa below
  CHECK(FloatToBFloat16(FromBits(0x3f818000)) == 0x3f82);  // a tie: to the even mantissa above
  CHECK(FloatToBFloat16(FromBits(0x3f808001)) == 0x3f81);  // just above half: up
  CHECK(FloatToBFloat16(FromBits(0x3f807fff)) == 0x3f80);  // just below half: down
  CHECK(FloatToBFloat16(std::numeric_limits<float>::infinity()) == 0x7f80);
  CHECK(FloatToBFloat16(std::numeric_limits<float>::max()) == 0x7f80);  // rounds up to infinity
  CHECK(FloatToBFloat16(FromBits(0x00000001)) == 0x0000);               // the smallest subnormal: to 0
  CHECK(FloatToBFloat16(FromBits(0x00018000)) == 0x0002);               // subnormals round too
  const uint16_t nan = FloatToBFloat16(std::numeric_limits<float>::quiet_NaN());
  CHECK(std::isnan(BFloat16ToFloat(nan)));
  CHECK(std::isnan(BFloat16ToFloat(FloatToBFloat16(FromBits(0x7f800001)))));  // a NaN whose top bits look like infinity
  for (uint32_t b = 0; b < 0x10000; b += 7) {  // every bfloat16 is a float32 that converts back to itself
    const float f = BFloat16ToFloat(static_cast<uint16_t>(b));
    if (!std::isnan(f)) CHECK(FloatToBFloat16(f) == b);
  }
}

TEST_CASE("BFloat16.TheDeviceConvertsAsTheScalarDefinition") {
  // More elements than one pool grain, so that the threaded, vectorized path runs; special
  // values scattered through it.
  const size_t n = 200003;
  std::vector<float> x = RandomTensor({static_cast<int64_t>(n)}, 3, -1e3f, 1e3f).ToVector();
  const float specials[] = {0.0f,
                            -0.0f,
                            std::numeric_limits<float>::infinity(),
                            -std::numeric_limits<float>::infinity(),
                            std::numeric_limits<float>::quiet_NaN(),
                            std::numeric_limits<float>::max(),
                            std::numeric_limits<float>::denorm_min(),
                            FromBits(0x3f808000),
                            FromBits(0x3f818000)};
  for (size_t i = 0; i < sizeof(specials) / sizeof(float); ++i) x[i * 9973] = specials[i];
  std::vector<uint16_t> y(n);
  CpuDevice()->FloatToBFloat16(x.data(), n, y.data());
  size_t wrong = 0;
  for (size_t i = 0; i < n; ++i) wrong += y[i] != FloatToBFloat16(x[i]);
  CHECK(wrong == 0);
  std::vector<float> back(n);
  CpuDevice()->BFloat16ToFloat(y.data(), n, back.data());
  for (size_t i = 0; i < n; i += 997) {
    const float expected = BFloat16ToFloat(y[i]);
    CHECK(std::memcmp(&back[i], &expected, 4) == 0);
  }
}

TEST_CASE("Tensor.CarriesItsTypeThroughCastsCopiesAndComparisons") {
  const Tensor x = RandomTensor({4, 5}, 1);
  CHECK(x.dtype() == DType::kFloat32);
  CHECK(x.Cast(DType::kFloat32).data() == x.data());  // the same type: the same tensor
  const Tensor b = x.Cast(DType::kBFloat16);
  CHECK(b.dtype() == DType::kBFloat16);
  CHECK(b.shape() == x.shape());
  CHECK(b.bytes() == x.bytes() / 2);
  CHECK_THROWS_AS(b.data(), std::logic_error);  // a float32 kernel would misread its bytes
  CHECK_THROWS_AS(x.bf16_data(), std::logic_error);
  const std::vector<float> xv = x.ToVector(), bv = b.ToVector();
  for (size_t i = 0; i < xv.size(); ++i) CHECK(bv[i] == BFloat16ToFloat(FloatToBFloat16(xv[i])));
  CHECK(Rounded(x).ToVector() == bv);
  // Views and copies keep the type; comparisons see it.
  CHECK(b.Rows(1, 3).ToVector() == std::vector<float>(bv.begin() + 5, bv.begin() + 15));
  CHECK(b.Clone().BitwiseEquals(b));
  CHECK_FALSE(Rounded(x).BitwiseEquals(b));  // the same values, another type
  CHECK_THROWS_AS(Tensor::Empty({4, 5}).CopyFrom(b), std::invalid_argument);
  CHECK(Tensor().BitwiseEquals(Tensor()));
  CHECK_FALSE(Tensor().BitwiseEquals(Tensor::Zeros({})));
}

TEST_CASE("Serialize.BFloat16TensorsTravelAtTwoBytesAnElement") {
  const Tensor b = RandomTensor({3, 7}, 2).Cast(DType::kBFloat16);
  const NamedTensors set{{"act", b}, {"w", RandomTensor({2, 2}, 3)}};
  const std::string bytes = SerializeTensors(set);
  CHECK(bytes.size() == EncodedSize(set));
  CHECK(EncodedSize({{"act", b}}) + 21 * 2 == EncodedSize({{"act", b.Cast(DType::kFloat32)}}));
  auto back = DeserializeTensors(bytes);
  REQUIRE(back.ok());
  CHECK((*back)[0].second.dtype() == DType::kBFloat16);
  CHECK((*back)[0].second.BitwiseEquals(b));
  CHECK((*back)[1].second.BitwiseEquals(set[1].second));
  std::string scratch;
  std::string joined;
  for (auto span : SerializedSpans(set, &scratch)) joined.append(span);
  CHECK(joined == bytes);

  // A type this copse does not know, with a valid checksum: named, never read as float32.
  std::string bad = SerializeTensors({{"a", b}});
  const size_t dtype_at = 8 + 4 + 4 + 4 + 1;  // magic, version, count, name length, name "a"
  REQUIRE(static_cast<uint8_t>(bad[dtype_at]) == 1);
  bad[dtype_at] = 7;
  const uint64_t sum = Checksum(std::string_view(bad).substr(0, bad.size() - 8));
  std::memcpy(bad.data() + bad.size() - 8, &sum, 8);
  auto r = DeserializeTensors(bad);
  REQUIRE_FALSE(r.ok());
  CHECK(r.status().code() == copse::StatusCode::kDataLoss);
  CHECK(r.status().message().find("unknown dtype 7") != std::string::npos);
}

TEST_CASE("GemmBf16.IsTheFloat32ProductOfTheRoundedOperands") {
  SetCpuThreads(2);
  struct Case {
    bool ta, tb;
    int m, n, k;
    float beta;
  };
  // Small ones, ones the CPU device splits over its threads, odd sizes, transposes, accumulation.
  const Case cases[] = {{false, true, 16, 24, 40, 0.0f},   {false, false, 33, 17, 65, 1.0f},  {true, false, 40, 31, 16, 0.0f},
                        {true, true, 9, 12, 7, 1.0f},      {false, true, 256, 512, 96, 0.0f}, {true, false, 384, 200, 128, 1.0f},
                        {false, false, 64, 96, 300, 0.0f}, {false, true, 5, 3, 1, 0.0f}};
  for (const Case& c : cases) {
    INFO("m " << c.m << " n " << c.n << " k " << c.k << " ta " << c.ta << " tb " << c.tb << " beta " << c.beta);
    const Tensor a = RandomTensor({c.ta ? c.k : c.m, c.ta ? c.m : c.k}, 11).Cast(DType::kBFloat16);
    const Tensor b = RandomTensor({c.tb ? c.n : c.k, c.tb ? c.k : c.n}, 12).Cast(DType::kBFloat16);
    const Tensor c0 = RandomTensor({c.m, c.n}, 13);
    const std::vector<float> want =
        ReferenceProduct(c.ta, c.tb, c.m, c.n, c.k, a.ToVector(), b.ToVector(), c.beta, c0.ToVector());
    const Tensor got = c0.Clone();
    MatmulInto(a, b, c.ta, c.tb, c.beta, got);
    CHECK(RelativeError(got.ToVector(), want) < 1e-5);  // float32 accumulation of exact products
    // The device's fallback (widen, then the float32 product) agrees, and repeats bit for bit.
    const Tensor slow = c0.Clone();
    CpuDevice()->Device::GemmBf16(c.ta, c.tb, c.m, c.n, c.k, 1.0f, a.bf16_data(), static_cast<int>(a.dim(1)), b.bf16_data(),
                                  static_cast<int>(b.dim(1)), c.beta, slow.data(), c.n);
    CHECK(RelativeError(slow.ToVector(), want) < 1e-5);
    const Tensor again = c0.Clone();
    MatmulInto(a, b, c.ta, c.tb, c.beta, again);
    CHECK(again.BitwiseEquals(got));
  }
  CHECK_THROWS_AS(Matmul(RandomTensor({2, 3}, 1), RandomTensor({3, 2}, 1).Cast(DType::kBFloat16)), std::invalid_argument);
}

TEST_CASE("Linear.InBFloat16StaysWithinRoundingOfFloat32AndStashesHalfTheBytes") {
  // GELU, smooth: a ReLU's mask flips where z is near 0, which is no measure of precision.
  Linear layer(96, 64, Activation::kGelu);
  layer.InitParameters(5);
  const Tensor x = RandomTensor({32, 96}, 6);
  const Tensor dy = RandomTensor({32, 64}, 7);
  ForwardContext fp32, bf16;
  bf16.precision = Precision::kBFloat16;

  LayerStash s32, s16;
  auto y32 = layer.Forward(x, fp32, &s32);
  auto y16 = layer.Forward(x, bf16, &s16);
  REQUIRE(y32.ok());
  REQUIRE(y16.ok());
  CHECK(y16->dtype() == DType::kFloat32);
  CHECK(RelativeError(*y16, *y32) < 2e-2);
  CHECK_FALSE(y16->BitwiseEquals(*y32));  // it did compute in bfloat16
  // The product is exactly the float32 product of the rounded operands.
  const Tensor rounded =
      LinearForward(Rounded(x), Rounded(layer.parameters()[0].value), layer.parameters()[1].value, Activation::kGelu);
  CHECK(RelativeError(*y16, rounded) < 1e-5);
  REQUIRE(s16.tensors.size() == 2);
  CHECK(s16.tensors[0].dtype() == DType::kBFloat16);
  CHECK(s16.tensors[0].bytes() == s32.tensors[0].bytes() / 2);
  REQUIRE(s16.weights.size() == 1);  // the weight as multiplied, kept in this process only
  CHECK(s16.weights[0].dtype() == DType::kBFloat16);
  CHECK(s32.weights.empty());

  layer.ZeroGrad();
  auto dx32 = layer.Backward(dy, s32, true);
  const Tensor dw32 = layer.parameters()[0].grad.Clone(), db32 = layer.parameters()[1].grad.Clone();
  layer.ZeroGrad();
  auto dx16 = layer.Backward(dy, s16, true);
  REQUIRE(dx32.ok());
  REQUIRE(dx16.ok());
  CHECK(dx16->dtype() == DType::kFloat32);
  CHECK(RelativeError(*dx16, *dx32) < 3e-2);
  CHECK(RelativeError(layer.parameters()[0].grad, dw32) < 3e-2);
  CHECK(RelativeError(layer.parameters()[1].grad, db32) < 3e-2);
  const Tensor dw16 = layer.parameters()[0].grad.Clone();

  // The deferred weight gradients (zero-bubble pipelines) give the same bits as Backward.
  Tensor wgrad;
  auto dx_only = layer.BackwardInput(dy, s16, true, &wgrad);
  REQUIRE(dx_only.ok());
  CHECK(dx_only->BitwiseEquals(*dx16));
  REQUIRE(layer.WeightGradients({{&s16, &wgrad}}).ok());
  CHECK(layer.parameters()[0].grad.BitwiseEquals(dw16));
  // A stash that travelled as a message comes without the weight copy: converted again, the
  // same bits.
  LayerStash travelled = s16;
  travelled.weights.clear();
  layer.ZeroGrad();
  auto dx_travelled = layer.Backward(dy, travelled, true);
  REQUIRE(dx_travelled.ok());
  CHECK(dx_travelled->BitwiseEquals(*dx16));
  CHECK(layer.parameters()[0].grad.BitwiseEquals(dw16));
  // A stash that does not fit the layer is refused, never read out of bounds.
  LayerStash broken = s16;
  broken.tensors[1] = Tensor();  // the activation's z
  CHECK_FALSE(layer.Backward(dy, broken, true).ok());
  broken.tensors[1] = RandomTensor({3, 64}, 1);
  CHECK_FALSE(layer.Backward(dy, broken, true).ok());
  // ... and refuse micro-batches stashed in two precisions.
  Tensor wgrad32;
  REQUIRE(layer.BackwardInput(dy, s32, false, &wgrad32).ok());
  CHECK_FALSE(layer.WeightGradients({{&s16, &wgrad}, {&s32, &wgrad32}}).ok());

  // An activation that crossed a stage boundary in bfloat16 gives the same bits as float32 input.
  auto from_bf16 = layer.Forward(x.Cast(DType::kBFloat16), bf16, nullptr);
  REQUIRE(from_bf16.ok());
  CHECK(from_bf16->BitwiseEquals(*y16));
}

TEST_CASE("WeightCasts.ConvertEachWeightOnceAndGiveTheSameBits") {
  Linear layer(40, 24);
  layer.InitParameters(3);
  ForwardContext ctx;
  ctx.precision = Precision::kBFloat16;
  const Tensor x = RandomTensor({8, 40}, 4);
  LayerStash a, b, c;
  auto ya = layer.Forward(x, ctx, &a);  // no casts: converted in the pass
  WeightCasts casts;
  layer.SetWeightCasts(&casts);
  auto yb = layer.Forward(x, ctx, &b);
  auto yc = layer.Forward(x.Rows(0, 4), ctx, &c);
  REQUIRE(ya.ok());
  REQUIRE(yb.ok());
  REQUIRE(yc.ok());
  CHECK(yb->BitwiseEquals(*ya));
  CHECK(b.weights[0].raw_data() == c.weights[0].raw_data());  // one copy for both passes
  CHECK(b.weights[0].BitwiseEquals(a.weights[0]));
  // A backward whose stash travelled without the copy takes the same one.
  const Tensor dy = RandomTensor({8, 24}, 5);
  b.weights.clear();
  auto dx = layer.Backward(dy, b, true);
  REQUIRE(dx.ok());
  CHECK(dx->BitwiseEquals(*layer.Backward(dy, a, true)));
  // Parameters replaced (the ML programs never write them in place): a new copy.
  layer.parameters()[0].value = RandomTensor({24, 40}, 9);
  LayerStash d;
  REQUIRE(layer.Forward(x, ctx, &d).ok());
  CHECK(d.weights[0].BitwiseEquals(layer.parameters()[0].value.Cast(DType::kBFloat16)));
  layer.SetWeightCasts(nullptr);
}

TEST_CASE("Transformer.InBFloat16StaysCloseToFloat32") {
  auto model = BuildModel("gpt:2-64-4-16", 3);
  REQUIRE(model.ok());
  std::vector<float> ids(2 * 16);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<float>((i * 37 + 11) % 256);
  const Tensor x = Tensor::FromVector({2, 16}, ids);
  std::vector<int32_t> labels(ids.size());
  for (size_t i = 0; i < labels.size(); ++i) labels[i] = static_cast<int32_t>((i * 53 + 5) % 256);

  auto run = [&](Precision p, NamedTensors* grads) {
    ForwardContext ctx;
    ctx.precision = p;
    Stash stash;
    auto logits = model->Forward(x, ctx, &stash);
    REQUIRE(logits.ok());
    auto loss = CrossEntropyLoss(*logits, labels);
    REQUIRE(loss.ok());
    REQUIRE(model->Backward(loss->grad, stash, false, /*accumulate=*/false).ok());
    *grads = model->ExportGradients();
    return *logits;
  };
  NamedTensors g32, g16;
  const Tensor l32 = run(Precision::kFloat32, &g32), l16 = run(Precision::kBFloat16, &g16);

  // A block's stash that does not fit (as a damaged message could carry) is refused before any
  // kernel reads it; parameters in bfloat16 are refused by name.
  ForwardContext ctx;
  ctx.precision = Precision::kBFloat16;
  Stash stash;
  REQUIRE(model->Forward(x, ctx, &stash).ok());
  for (size_t layer : {2, 3}) {  // an AttentionBlock, an MlpBlock
    CAPTURE(layer);
    for (size_t i = 1; i < stash.layers[layer].tensors.size(); ++i) {
      LayerStash bad = stash.layers[layer];
      bad.tensors[i] = bad.tensors[i].Rows(0, 1);
      auto r = model->layer(layer).Backward(RandomTensor({2, 16, 64}, 1), bad, true);
      CHECK_FALSE(r.ok());
    }
  }
  NamedTensors params = model->ExportParameters();
  params[0].second = params[0].second.Cast(DType::kBFloat16);
  const copse::Status refused = model->ShareParameters(params);
  CHECK(refused.message().find("bfloat16") != std::string::npos);
  CHECK(RelativeError(l16, l32) < 3e-2);
  CHECK_FALSE(l16.BitwiseEquals(l32));
  for (size_t i = 0; i < g32.size(); ++i) {
    INFO(g32[i].first);
    // The key third of qkv.bias has a gradient of exactly 0 in exact arithmetic (test_util.h):
    // both sides hold rounding noise there, relative to nothing.
    if (g32[i].first.find("qkv.bias") != std::string::npos) continue;
    CHECK(RelativeError(g16[i].second, g32[i].second) < 6e-2);
  }
}

TEST_CASE("Trainer.Bf16TrainsTheMlpAsWellAsFloat32Deterministically") {
  if (!HaveFashionMnist()) {
    MESSAGE("skipped: no Fashion-MNIST (Debian package dataset-fashion-mnist)");
    return;
  }
  TrainOptions o;
  o.model = "mlp";
  o.limit = 6000;
  o.test_limit = 2000;
  o.epochs = 2;
  o.seed = 4;
  auto fp32 = Train(o);
  o.precision = "bf16";
  auto bf16 = Train(o), again = Train(o);
  REQUIRE(fp32.ok());
  REQUIRE(bf16.ok());
  REQUIRE(again.ok());
  CHECK(bf16->precision == "bf16");
  CHECK(bf16->parameter_digest != fp32->parameter_digest);   // it trained in bfloat16
  CHECK(again->parameter_digest == bf16->parameter_digest);  // and does so bit for bit
  MESSAGE("test accuracy fp32 " << fp32->test_accuracy << ", bf16 " << bf16->test_accuracy << "; loss " << fp32->final_loss
                                << ", " << bf16->final_loss);
  CHECK(std::abs(bf16->test_accuracy - fp32->test_accuracy) < 0.01);  // 2000 test images: 1 point is 20
  CHECK(std::abs(bf16->final_loss - fp32->final_loss) < 0.02 * fp32->final_loss);
}

TEST_CASE("Trainer.Bf16TrainsTheTransformerAsWellAsFloat32") {
  if (!std::filesystem::exists(kFortunesDir)) {
    MESSAGE("skipped: no " << kFortunesDir << " (Debian package fortunes)");
    return;
  }
  TrainOptions o;
  o.model = "gpt:2-64-4-32";
  o.optimizer = "adamw";
  o.lr = 3e-3f;
  o.batch = 16;
  o.max_steps = 150;
  o.test_limit = 200;
  o.sample_bytes = 0;
  auto fp32 = Train(o);
  o.precision = "bf16";
  auto bf16 = Train(o);
  REQUIRE(fp32.ok());
  REQUIRE(bf16.ok());
  MESSAGE("validation loss fp32 " << fp32->validation_loss << ", bf16 " << bf16->validation_loss);
  CHECK(bf16->parameter_digest != fp32->parameter_digest);
  CHECK(std::abs(bf16->validation_loss - fp32->validation_loss) < 0.02 * fp32->validation_loss);
}
