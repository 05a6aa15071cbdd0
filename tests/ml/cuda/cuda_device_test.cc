// Every Device operation on the GPU against the CPU, and whole training steps of the MLP and the
// CNN: results agree within float tolerance (cuBLAS sums in another order); dropout masks and
// the parameter initialization are bit-identical.
#include <doctest/doctest.h>

#include <filesystem>
#include <limits>

#include "ml/loss.h"
#include "ml/models.h"
#include "ml/ops.h"
#include "ml/optimizer.h"
#include "ml/serialize.h"
#include "ml/trainer.h"
#include "tests/ml/test_util.h"

using namespace copse::ml;
using copse::ml::testing::ComparableAfterAdam;
using copse::ml::testing::RandomTensor;
using copse::ml::testing::RelativeError;

namespace {

Device* Gpu() { return *CudaDevice(0); }

Tensor G(const Tensor& t) { return t.To(Gpu()); }

void Close(const Tensor& gpu, const Tensor& cpu, double tol = 1e-5) {
  CHECK(gpu.device()->type() == DeviceType::kCuda);
  CHECK(RelativeError(gpu.To(CpuDevice()), cpu) < tol);
}

}  // namespace

TEST_CASE("Cuda.CopiesRoundTrip") {
  const Tensor x = RandomTensor({3, 5}, 1);
  CHECK(G(x).To(CpuDevice()).BitwiseEquals(x));
  auto back = DeserializeTensor(SerializeTensor(G(x)), Gpu());
  REQUIRE(back.ok());
  CHECK(back->BitwiseEquals(x));
}

TEST_CASE("Cuda.DenseOpsMatchCpu") {
  const Tensor a = RandomTensor({37, 53}, 2), b = RandomTensor({53, 29}, 3);
  const Tensor bt = RandomTensor({29, 53}, 4), at = RandomTensor({53, 37}, 5);
  Close(Matmul(G(a), G(b)), Matmul(a, b));
  Close(Matmul(G(a), G(bt), false, true), Matmul(a, bt, false, true));
  Close(Matmul(G(at), G(b), true, false), Matmul(at, b, true, false));
  const Tensor w = RandomTensor({17, 53}, 6), bias = RandomTensor({17}, 7);
  for (Activation act : {Activation::kNone, Activation::kRelu, Activation::kGelu})
    Close(LinearForward(G(a), G(w), G(bias), act), LinearForward(a, w, bias, act));
  const Tensor x = RandomTensor({8, 33}, 8, -3, 3), dy = RandomTensor({8, 33}, 9);
  Close(Relu(G(x)), Relu(x));
  Close(Gelu(G(x)), Gelu(x));
  Close(ActivationGrad(Activation::kRelu, G(x), G(dy)), ActivationGrad(Activation::kRelu, x, dy));
  Close(ActivationGrad(Activation::kGelu, G(x), G(dy)), ActivationGrad(Activation::kGelu, x, dy));
  Close(BiasAdd(G(x), G(RandomTensor({33}, 10))), BiasAdd(x, RandomTensor({33}, 10)));
  Close(Softmax(G(x)), Softmax(x));
}

TEST_CASE("Cuda.LossMatchesCpu") {
  const Tensor logits = RandomTensor({16, 10}, 11, -4, 4);
  std::vector<int32_t> labels;
  for (int i = 0; i < 16; ++i) labels.push_back(i % 10);
  auto c = CrossEntropyLoss(logits, labels), g = CrossEntropyLoss(G(logits), labels);
  REQUIRE(c.ok());
  REQUIRE(g.ok());
  CHECK(g->loss == doctest::Approx(c->loss).epsilon(1e-6));
  Close(g->grad, c->grad);
}

TEST_CASE("Cuda.ConvPoolNormDropoutMatchCpu") {
  const Tensor x = RandomTensor({3, 4, 9, 8}, 12), w = RandomTensor({5, 4, 3, 3}, 13);
  const Tensor b = RandomTensor({5}, 14);
  for (int stride : {1, 2}) {
    const Tensor y = Conv2d(x, w, b, stride, 1), yg = Conv2d(G(x), G(w), G(b), stride, 1);
    Close(yg, y);
    const Tensor dy = RandomTensor(y.shape(), 15);
    Conv2dGrads c = Conv2dBackward(x, w, dy, stride, 1, true, true);
    Conv2dGrads g = Conv2dBackward(G(x), G(w), G(dy), stride, 1, true, true);
    Close(g.dx, c.dx);
    Close(g.dw, c.dw);
    Close(g.db, c.db);
  }
  for (int k : {2, 3}) {
    const Tensor y = MaxPool2d(x, k, k == 2 ? 2 : 1);
    Close(MaxPool2d(G(x), k, k == 2 ? 2 : 1), y);
    const Tensor dy = RandomTensor(y.shape(), 16);
    Close(MaxPool2dBackward(G(x), G(dy), k, k == 2 ? 2 : 1), MaxPool2dBackward(x, dy, k, k == 2 ? 2 : 1));
  }
  const Tensor h = RandomTensor({6, 24}, 17, -2, 2), gamma = RandomTensor({24}, 18, 0.5, 1.5);
  const Tensor beta = RandomTensor({24}, 19);
  LayerNormResult lc = LayerNorm(h, gamma, beta, 1e-5f), lg = LayerNorm(G(h), G(gamma), G(beta), 1e-5f);
  Close(lg.y, lc.y);
  const Tensor dh = RandomTensor({6, 24}, 20);
  LayerNormGrads gc = LayerNormBackward(dh, h, gamma, lc.mean, lc.rstd);
  LayerNormGrads gg = LayerNormBackward(G(dh), G(h), G(gamma), lg.mean, lg.rstd);
  Close(gg.dx, gc.dx);
  Close(gg.dgamma, gc.dgamma);
  Close(gg.dbeta, gc.dbeta);
  // Dropout: the same mask bit for bit.
  const Tensor big = RandomTensor({1001}, 21);
  CHECK(Dropout(G(big), 0.4f, 99).To(CpuDevice()).BitwiseEquals(Dropout(big, 0.4f, 99)));
}

TEST_CASE("Cuda.TrainingStepsMatchCpu") {
  for (const char* name : {"mlp", "cnn"}) {
    Sequential cpu = *BuildModel(name, 5), gpu = *BuildModel(name, 5);
    gpu.To(Gpu());
    CHECK(Digest(gpu.ExportParameters()) == Digest(cpu.ExportParameters()));
    Sgd oc(cpu.Parameters(), SgdOptions{0.05f, 0.9f, 0.0f, 0.0f, false});
    Sgd og(gpu.Parameters(), SgdOptions{0.05f, 0.9f, 0.0f, 0.0f, false});
    const Tensor x = RandomTensor({32, 1, 28, 28}, 22, 0, 1);
    std::vector<int32_t> labels;
    for (int i = 0; i < 32; ++i) labels.push_back((i * 7) % 10);
    for (int step = 0; step < 3; ++step) {
      Stash sc, sg;
      auto lc = CrossEntropyLoss(*cpu.Forward(x, {}, &sc), labels);
      auto lg = CrossEntropyLoss(*gpu.Forward(G(x), {}, &sg), labels);
      CHECK(lg->loss == doctest::Approx(lc->loss).epsilon(1e-4));
      REQUIRE(cpu.Backward(lc->grad, sc, false, false).ok());
      REQUIRE(gpu.Backward(lg->grad, sg, false, false).ok());
      oc.Step();
      og.Step();
    }
    const NamedTensors pc = cpu.ExportParameters(), pg = gpu.ExportParameters();
    for (size_t i = 0; i < pc.size(); ++i) {
      INFO(name << " " << pc[i].first);
      CHECK(RelativeError(pg[i].second, pc[i].second) < 1e-4);
    }
  }
}

TEST_CASE("Cuda.AdamMatchesCpu") {
  Sequential cpu = *BuildModel("mlp:784-32-10", 3), gpu = *BuildModel("mlp:784-32-10", 3);
  gpu.To(Gpu());
  for (Parameter* p : cpu.Parameters()) p->grad.CopyFrom(RandomTensor(p->grad.shape(), 23));
  for (Parameter* p : gpu.Parameters()) p->grad.CopyFrom(RandomTensor(p->grad.shape(), 23));
  AdamOptions o;
  o.weight_decay = 1e-3f;
  Adam ac(cpu.Parameters(), o), ag(gpu.Parameters(), o);
  for (int i = 0; i < 3; ++i) ac.Step(), ag.Step();
  const NamedTensors pc = cpu.ExportParameters(), pg = gpu.ExportParameters();
  for (size_t i = 0; i < pc.size(); ++i) CHECK(RelativeError(pg[i].second, pc[i].second) < 1e-5);
}

TEST_CASE("Cuda.SgdStepOutOfPlaceMatchesCpu") {
  Sequential cpu = *BuildModel("mlp:784-32-10", 4), gpu = *BuildModel("mlp:784-32-10", 4);
  gpu.To(Gpu());
  Sgd oc(cpu.Parameters(), SgdOptions{0.05f, 0.9f, 0.0f, 1e-3f, false});
  Sgd og(gpu.Parameters(), SgdOptions{0.05f, 0.9f, 0.0f, 1e-3f, false});
  for (int step = 0; step < 3; ++step) {
    std::vector<Tensor> keep;  // the gradients: two sets, on each device
    std::vector<std::vector<const float*>> gc, gg;
    for (Parameter* p : cpu.Parameters()) {
      gc.emplace_back(), gg.emplace_back();
      for (int k = 0; k < 2; ++k) {
        const Tensor g = RandomTensor(p->value.shape(), 30 + 10 * step + k);
        keep.push_back(g), keep.push_back(G(g));
        gc.back().push_back(keep[keep.size() - 2].data());
        gg.back().push_back(keep.back().data());
      }
    }
    const Tensor before = gpu.Parameters()[0]->value;
    const std::vector<float> before_values = before.ToVector();
    oc.StepOutOfPlace(gc);
    og.StepOutOfPlace(gg);
    CHECK(before.ToVector() == before_values);  // replaced, not written
  }
  const NamedTensors pc = cpu.ExportParameters(), pg = gpu.ExportParameters();
  for (size_t i = 0; i < pc.size(); ++i) CHECK(RelativeError(pg[i].second, pc[i].second) < 1e-5);
}

TEST_CASE("Cuda.GptMatchesCpu") {
  // The transformer's kernels (batched products, causal softmax, embeddings, AdamW, clipping)
  // through a whole model: forward, backward and three AdamW steps with clipping.
  Sequential cpu = *BuildModel("gpt:2-32-4-16,dropout=0.1", 3), gpu = *BuildModel("gpt:2-32-4-16,dropout=0.1", 3);
  gpu.To(Gpu());
  std::vector<float> ids;
  for (int i = 0; i < 3 * 16; ++i) ids.push_back(static_cast<float>((i * 29 + 7) % 256));
  std::vector<int32_t> labels;
  for (int i = 0; i < 3 * 16; ++i) labels.push_back((i * 31 + 3) % 256);
  const Tensor x = Tensor::FromVector({3, 16}, ids);
  AdamOptions a;
  a.lr = 1e-2f;
  a.weight_decay = 0.1f;
  a.decoupled_weight_decay = true;
  Adam opt_cpu(cpu.Parameters(), a), opt_gpu(gpu.Parameters(), a);
  for (int step = 0; step < 3; ++step) {
    ForwardContext ctx;
    ctx.seed = MixSeed(1, static_cast<uint64_t>(step));
    Stash sc, sg;
    const Tensor yc = *cpu.Forward(x, ctx, &sc), yg = *gpu.Forward(G(x), ctx, &sg);
    Close(yg, yc, 1e-4);
    auto lc = CrossEntropyLoss(yc, labels), lg = CrossEntropyLoss(yg, labels);
    REQUIRE(cpu.Backward(lc->grad, sc, false, false).ok());
    REQUIRE(gpu.Backward(lg->grad, sg, false, false).ok());
    CHECK(ClipGradNorm(gpu.Parameters(), 0.5) == doctest::Approx(ClipGradNorm(cpu.Parameters(), 0.5)).epsilon(1e-4));
    opt_cpu.Step();
    opt_gpu.Step();
  }
  const NamedTensors pc = cpu.ExportParameters(), pg = gpu.ExportParameters();
  for (size_t i = 0; i < pc.size(); ++i) {
    INFO(pc[i].first);
    CHECK(RelativeError(ComparableAfterAdam(pg[i].first, pg[i].second), ComparableAfterAdam(pc[i].first, pc[i].second)) < 1e-3);
  }
}

/// A product of 16-bit operands of `precision`'s type, and a Linear layer's forward and backward
/// in that precision, on the GPU against the CPU.
static void ProductAndLinearMatchCpu(Precision precision) {
  const DType type = ProductType(precision);
  const Tensor a = RandomTensor({37, 53}, 2).Cast(type), b = RandomTensor({29, 53}, 3).Cast(type);
  Close(Matmul(G(a), G(b), false, true), Matmul(a, b, false, true), 1e-5);

  Linear cpu_layer(53, 29, Activation::kGelu), gpu_layer(53, 29, Activation::kGelu);
  cpu_layer.InitParameters(4);
  gpu_layer.InitParameters(4);
  gpu_layer.To(Gpu());
  ForwardContext ctx;
  ctx.precision = precision;
  const Tensor in = RandomTensor({37, 53}, 5), dy = RandomTensor({37, 29}, 6);
  LayerStash sc, sg;
  Close(*gpu_layer.Forward(G(in), ctx, &sg), *cpu_layer.Forward(in, ctx, &sc), 1e-5);
  Close(*gpu_layer.Backward(G(dy), sg, true), *cpu_layer.Backward(dy, sc, true), 1e-4);
  Close(gpu_layer.parameters()[0].grad, cpu_layer.parameters()[0].grad, 1e-4);
}

TEST_CASE("Cuda.BFloat16MatchesCpu") {
  // Conversion gives the CPU's bits (round to nearest even, NaN kept); the bfloat16 product
  // accumulates in float32 as the CPU's does (in another order); a Linear layer's mixed
  // precision forward and backward agree.
  std::vector<float> v = RandomTensor({4097}, 8, -300.0f, 300.0f).ToVector();
  v[0] = std::numeric_limits<float>::quiet_NaN();
  v[1] = std::numeric_limits<float>::infinity();
  v[2] = std::numeric_limits<float>::denorm_min();
  const Tensor x = Tensor::FromVector({4097}, v);
  const Tensor cpu = x.Cast(DType::kBFloat16), gpu = G(x).Cast(DType::kBFloat16);
  CHECK(gpu.device()->type() == DeviceType::kCuda);
  CHECK(gpu.To(CpuDevice()).BitwiseEquals(cpu));
  CHECK(G(cpu).Cast(DType::kFloat32).To(CpuDevice()).BitwiseEquals(cpu.Cast(DType::kFloat32)));

  ProductAndLinearMatchCpu(Precision::kBFloat16);
}

TEST_CASE("Cuda.Float16MatchesCpu") {
  // The same conversion function compiled for both (round to nearest even, overflow to
  // infinity, subnormals), cuBLAS's float16 product against the CPU's widened one, a Linear in
  // fp16, and a whole fp16 training run with its loss scaling.
  std::vector<float> v = RandomTensor({4097}, 8, -70000.0f, 70000.0f).ToVector();
  for (size_t i = 0; i < v.size(); i += 3) v[i] *= 1e-9f;  // subnormals and zeros
  v[0] = std::numeric_limits<float>::quiet_NaN();
  v[1] = std::numeric_limits<float>::infinity();
  v[2] = 65520.0f;
  const Tensor x = Tensor::FromVector({4097}, v);
  const Tensor cpu = x.Cast(DType::kFloat16), gpu = G(x).Cast(DType::kFloat16);
  CHECK(gpu.To(CpuDevice()).BitwiseEquals(cpu));
  CHECK(G(cpu).Cast(DType::kFloat32).To(CpuDevice()).BitwiseEquals(cpu.Cast(DType::kFloat32)));
  // The loss scaler's overflow check: one flag for many tensors.
  const Tensor finite = G(RandomTensor({5000}, 9)), inf = G(x);
  CHECK(Gpu()->AllFinite({{finite.data(), 5000}, {finite.data(), 17}}));
  CHECK_FALSE(Gpu()->AllFinite({{finite.data(), 5000}, {inf.data(), 4097}}));
  CHECK(Gpu()->AllFinite({{inf.data() + 3, 4094}}) == CpuDevice()->AllFinite({{x.data() + 3, 4094}}));

  ProductAndLinearMatchCpu(Precision::kFloat16);

  if (std::filesystem::exists(std::string(kFashionMnistDir) + "/train-images-idx3-ubyte.gz")) {
    TrainOptions o;
    o.model = "mlp:784-128-10";
    o.limit = 3000;
    o.test_limit = 1000;
    o.precision = "fp16";
    auto on_cpu = Train(o);
    o.device = "cuda";
    auto on_gpu = Train(o);
    REQUIRE(on_cpu.ok());
    REQUIRE(on_gpu.ok());
    MESSAGE("fp16 training: test accuracy GPU " << on_gpu->test_accuracy << ", CPU " << on_cpu->test_accuracy << "; loss scale "
                                                << on_gpu->loss_scale);
    CHECK(std::abs(on_gpu->test_accuracy - on_cpu->test_accuracy) < 0.01);
    CHECK(on_gpu->skipped_steps == on_cpu->skipped_steps);
  }
}
