// float16 mixed precision (ml/dtype.h, Precision::kFloat16) and dynamic loss scaling
// (ml/loss_scaler.h): conversion, the float16 product, tensors and their encoding, a Linear
// against float32, the scaler's decisions, and whole training runs.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>
#include <vector>

#include "ml/layers.h"
#include "ml/loss_scaler.h"
#include "ml/ops.h"
#include "ml/serialize.h"
#include "ml/trainer.h"
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

}  // namespace

TEST_CASE("Float16.RoundsToNearestEvenOverflowsToInfinityAndKeepsNaN") {
  CHECK(FloatToFloat16(1.0f) == 0x3c00);
  CHECK(FloatToFloat16(-2.0f) == 0xc000);
  CHECK(FloatToFloat16(65504.0f) == 0x7bff);    // the largest finite float16
  CHECK(FloatToFloat16(65519.996f) == 0x7bff);  // below the halfway point: down
  CHECK(FloatToFloat16(65520.0f) == 0x7c00);    // the tie rounds to even: infinity
  CHECK(FloatToFloat16(1e6f) == 0x7c00);        // overflow
  CHECK(FloatToFloat16(-std::numeric_limits<float>::infinity()) == 0xfc00);
  CHECK(FloatToFloat16(1.0f + 1.0f / 2048) == 0x3c00);     // a tie: to the even mantissa below
  CHECK(FloatToFloat16(1.0f + 3.0f / 2048) == 0x3c02);     // a tie: to the even mantissa above
  CHECK(FloatToFloat16(std::ldexp(1.0f, -24)) == 0x0001);  // the smallest subnormal
  CHECK(FloatToFloat16(std::ldexp(1.0f, -25)) == 0x0000);  // half of it: a tie, to even (zero)
  CHECK(FloatToFloat16(std::ldexp(1.5f, -25)) == 0x0001);  // above the tie: up
  CHECK(FloatToFloat16(std::ldexp(1.0f, -14)) == 0x0400);  // the smallest normal
  CHECK(FloatToFloat16(-0.0f) == 0x8000);
  CHECK(std::isnan(Float16ToFloat(FloatToFloat16(std::numeric_limits<float>::quiet_NaN()))));
  CHECK(std::isnan(Float16ToFloat(FloatToFloat16(FromBits(0x7f800001)))));
  for (uint32_t h = 0; h < 0x10000; ++h) {  // every float16 is a float32 that converts back to itself
    const float f = Float16ToFloat(static_cast<uint16_t>(h));
    if (!std::isnan(f)) REQUIRE(FloatToFloat16(f) == h);
  }
  // Against the compiler's own conversion, where it has one (GCC 12 on x86-64: _Float16).
#if defined(__FLT16_MAX__)
  const std::vector<float> x = RandomTensor({100000}, 9, -70000.0f, 70000.0f).ToVector();
  for (size_t i = 0; i < x.size(); ++i) {
    const float v = x[i] * (i % 3 == 0 ? 1e-8f : i % 3 == 1 ? 1e-3f : 1.0f);  // subnormal, small and large
    const _Float16 h = static_cast<_Float16>(v);
    uint16_t bits;
    std::memcpy(&bits, &h, 2);
    REQUIRE(FloatToFloat16(v) == bits);
  }
#endif
}

TEST_CASE("Float16.TheDeviceConvertsTensorsAndTheirEncodingCarriesTheType") {
  const size_t n = 200003;  // more than a pool grain: the threaded path
  const Tensor x = RandomTensor({static_cast<int64_t>(n)}, 3, -1e3f, 1e3f);
  const Tensor h = x.Cast(DType::kFloat16);
  CHECK(h.dtype() == DType::kFloat16);
  CHECK(h.bytes() == 2 * n);
  const std::vector<float> v = x.ToVector(), back = h.ToVector();
  size_t wrong = 0;
  for (size_t i = 0; i < n; ++i) wrong += back[i] != Float16ToFloat(FloatToFloat16(v[i]));
  CHECK(wrong == 0);
  CHECK(h.Cast(DType::kFloat32).BitwiseEquals(Tensor::FromVector({static_cast<int64_t>(n)}, back)));
  CHECK(h.Cast(DType::kBFloat16).dtype() == DType::kBFloat16);  // between 16-bit types, through float32
  auto decoded = DeserializeTensors(SerializeTensors({{"h", h}}));
  REQUIRE(decoded.ok());
  CHECK((*decoded)[0].second.dtype() == DType::kFloat16);
  CHECK((*decoded)[0].second.BitwiseEquals(h));
}

TEST_CASE("GemmF16.IsTheFloat32ProductOfTheRoundedOperands") {
  const Tensor a = RandomTensor({33, 65}, 11).Cast(DType::kFloat16), b = RandomTensor({17, 65}, 12).Cast(DType::kFloat16);
  const Tensor got = Matmul(a, b, false, true);
  const Tensor want = Matmul(a.Cast(DType::kFloat32), b.Cast(DType::kFloat32), false, true);
  CHECK(got.BitwiseEquals(want));  // the CPU widens: the same float32 product
  CHECK_THROWS_AS(Matmul(a, RandomTensor({17, 65}, 1).Cast(DType::kBFloat16), false, true), std::invalid_argument);
}

TEST_CASE("Linear.InFloat16StaysWithinRoundingOfFloat32") {
  Linear layer(96, 64, Activation::kGelu);
  layer.InitParameters(3);
  const Tensor x = RandomTensor({32, 96}, 4), dy = RandomTensor({32, 64}, 5);
  ForwardContext fp32, fp16;
  fp16.precision = Precision::kFloat16;
  LayerStash s32, s16;
  const Tensor y32 = *layer.Forward(x, fp32, &s32), y16 = *layer.Forward(x, fp16, &s16);
  CHECK(s16.tensors[0].dtype() == DType::kFloat16);  // the operand it multiplied, at half the bytes
  const double err = RelativeError(y16.ToVector(), y32.ToVector());
  MESSAGE("fp16 Linear forward against fp32: " << err);
  CHECK(err < 2e-3);  // float16's 11 bits: 4.9e-4 per rounding
  CHECK(err > 0);
  const Tensor dx32 = *layer.Backward(dy, s32, true), dx16 = *layer.Backward(dy, s16, true);
  CHECK(RelativeError(dx16.ToVector(), dx32.ToVector()) < 2e-3);
}

TEST_CASE("LossScale.HalvesOnOverflowAndDoublesAfterAnIntervalOfGoodSteps") {
  LossScale s;
  CHECK(s.scale == 65536.0f);
  s = s.Next(false);
  CHECK(s.scale == 32768.0f);
  CHECK(s.good_steps == 0);
  for (int64_t i = 0; i < LossScale::kGrowthInterval - 1; ++i) s = s.Next(true);
  CHECK(s.scale == 32768.0f);
  CHECK(s.good_steps == LossScale::kGrowthInterval - 1);
  s = s.Next(true);
  CHECK(s.scale == 65536.0f);
  CHECK(s.good_steps == 0);

  // Unscaling divides by the scale exactly (a power of two), unless a gradient is not finite.
  Linear layer(4, 3);
  layer.InitParameters(1);
  std::vector<Parameter*> params;
  for (Parameter& p : layer.parameters()) params.push_back(&p), p.grad = RandomTensor(p.value.shape(), 2);
  const std::vector<float> before = params[0]->grad.ToVector();
  CHECK(UnscaleGradients(params, LossScale{1024.0f, 0}));
  const std::vector<float> after = params[0]->grad.ToVector();
  for (size_t i = 0; i < before.size(); ++i) CHECK(after[i] == before[i] / 1024.0f);
  params[1]->grad = Tensor::FromVector(params[1]->grad.shape(), {1.0f, std::numeric_limits<float>::infinity(), 0.0f});
  CHECK_FALSE(UnscaleGradients(params, LossScale{1024.0f, 0}));
  CHECK(params[0]->grad.ToVector() == after);  // left as they were: the step is skipped
}

TEST_CASE("Trainer.Fp16TrainsTheMlpAsWellAsFloat32Deterministically") {
  if (!std::filesystem::exists(std::string(kFashionMnistDir) + "/train-images-idx3-ubyte.gz")) {
    MESSAGE("skipped: no Fashion-MNIST");
    return;
  }
  TrainOptions o;
  o.model = "mlp:784-128-10";
  o.limit = 3000;
  o.test_limit = 2000;
  o.epochs = 2;
  o.seed = 4;
  auto fp32 = Train(o);
  o.precision = "fp16";
  auto fp16 = Train(o), again = Train(o);
  REQUIRE(fp32.ok());
  REQUIRE(fp16.ok());
  REQUIRE(again.ok());
  CHECK(fp16->precision == "fp16");
  CHECK(fp16->parameter_digest != fp32->parameter_digest);
  CHECK(again->parameter_digest == fp16->parameter_digest);
  MESSAGE("fp16: test accuracy " << fp16->test_accuracy << " (fp32 " << fp32->test_accuracy << "), loss scale "
                                 << fp16->loss_scale << ", skipped steps " << fp16->skipped_steps);
  CHECK(std::abs(fp16->test_accuracy - fp32->test_accuracy) < 0.01);
  CHECK(std::abs(fp16->final_loss - fp32->final_loss) < 0.02 * fp32->final_loss);
  CHECK(fp16->loss_scale > 0);
}
