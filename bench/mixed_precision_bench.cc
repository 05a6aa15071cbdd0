// mixed_precision_bench: float32 against bf16 mixed precision (ml/dtype.h) in one run. Speed:
// training throughput of the MLP (images/s: batch 128, SGD lr 0.05 momentum 0.9, 12800 images)
// and of a GPT (tokens/s: gpt_bench's recipe, copse::bench::GptRecipe), runs interleaved fp32, bf16, fp32, ... so that the
// machine's noise falls on both alike; medians and the bf16/fp32 ratio, next to PyTorch's fp32
// and bf16 autocast on the same cores for the MLP (scripts/torch_bench.py --precision, when
// python3-torch is installed). Quality (--quality): the MLP's test accuracy after --epochs full
// epochs and the GPT's validation loss after --gpt-steps steps, in both precisions, same seeds.
// With --device cuda both precisions train on the GPU (cuBLAS's bfloat16 products), and PyTorch
// too. A benchmark: it prints figures and never fails on them.
//
//   mixed_precision_bench [--runs 5] [--threads 2] [--device cpu|cuda] [--gpt gpt:4-256-4-128] [--gpt-steps 40] [--no-torch]
//   mixed_precision_bench --quality [--epochs 3] [--gpt-steps 600]
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench/flags.h"
#include "bench/torch_compare.h"
#include "ml/trainer.h"

namespace {

using copse::bench::Median;
using copse::ml::TrainOptions;
using copse::ml::TrainReport;

std::string g_device = "cpu";

TrainOptions Mlp(int threads) {
  TrainOptions o;
  o.device = g_device;
  o.model = "mlp";
  o.threads = threads;
  o.limit = 12800;
  o.evaluate = false;
  return o;
}

TrainOptions Gpt(const std::string& model, int steps, int threads) {
  TrainOptions o = copse::bench::GptRecipe(model, steps, threads);
  o.device = g_device;
  return o;
}

TrainReport MustTrain(TrainOptions o, const std::string& precision) {
  o.precision = precision;
  auto r = copse::ml::Train(o);
  if (!r.ok()) {
    std::fprintf(stderr, "%s %s: %s\n", o.model.c_str(), precision.c_str(), r.status().ToString().c_str());
    std::exit(1);
  }
  return std::move(r).value();
}

/// PyTorch's median images/s for the MLP in `precision`, or a negative value without torch.
double TorchMlp(const std::string& precision, int threads, int runs) {
  const auto out = copse::bench::CommandOutput("OMP_WAIT_POLICY=passive " + copse::bench::Python() + " " + COPSE_SOURCE_DIR +
                                               "/scripts/torch_bench.py --model mlp --images 12800 --device " + g_device +
                                               " --precision " + precision + " --threads " + std::to_string(threads) +
                                               " --runs " + std::to_string(runs) + " 2>/dev/null");
  if (!out) return -1;
  try {
    return nlohmann::json::parse(*out).at("median").get<double>();
  } catch (const std::exception&) {
    return -1;
  }
}

}  // namespace

int main(int argc, char** argv) {
  int runs = 5, threads = 2, epochs = 3, gpt_steps = -1;
  std::string gpt = "gpt:4-256-4-128";
  bool torch = true, quality = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&] { return copse::bench::FlagValue(argc, argv, &i); };
    if (a == "--runs")
      runs = std::stoi(next());
    else if (a == "--threads")
      threads = std::stoi(next());
    else if (a == "--epochs")
      epochs = std::stoi(next());
    else if (a == "--device")
      g_device = next();
    else if (a == "--gpt")
      gpt = next();
    else if (a == "--gpt-steps")
      gpt_steps = std::stoi(next());
    else if (a == "--no-torch")
      torch = false;
    else if (a == "--quality")
      quality = true;
    else {
      std::fprintf(stderr,
                   "usage: %s [--runs N] [--threads N] [--device cpu|cuda] [--gpt MODEL] [--gpt-steps N] [--no-torch] | "
                   "--quality [--epochs N] "
                   "[--gpt-steps N]\n",
                   argv[0]);
      return 2;
    }
  }

  if (quality) {
    std::printf("mixed_precision_bench --quality: %d threads, same seeds in both precisions\n", threads);
    TrainOptions mlp = Mlp(threads);
    mlp.limit = -1;
    mlp.epochs = epochs;
    mlp.evaluate = true;
    const TrainReport a = MustTrain(mlp, "fp32"), b = MustTrain(mlp, "bf16");
    std::printf(
        "mlp, %d epochs of 60000 images: test accuracy fp32 %.2f %%, bf16 %.2f %% (%+.2f points); final loss %.4f, "
        "%.4f\n",
        epochs, 100 * a.test_accuracy, 100 * b.test_accuracy, 100 * (b.test_accuracy - a.test_accuracy), a.final_loss,
        b.final_loss);
    const int steps = gpt_steps > 0 ? gpt_steps : 600;
    const TrainReport c = MustTrain(Gpt(gpt, steps, threads), "fp32"), d = MustTrain(Gpt(gpt, steps, threads), "bf16");
    std::printf("%s, %d steps: validation loss fp32 %.4f, bf16 %.4f (%+.2f %%)\n", gpt.c_str(), steps, c.validation_loss,
                d.validation_loss, 100 * (d.validation_loss / c.validation_loss - 1));
    return 0;
  }

  std::printf("mixed_precision_bench: %s, %d threads, medians of %d interleaved runs per precision\n", g_device.c_str(), threads,
              runs);
  std::printf("%-18s %12s %12s %8s %14s %14s\n", "model", "fp32", "bf16", "bf16/fp32", "torch fp32", "torch bf16");
  struct Row {
    std::string name, unit;
    TrainOptions options;
  };
  const int steps = gpt_steps > 0 ? gpt_steps : 40;
  for (const Row& row : {Row{"mlp", "images/s", Mlp(threads)}, Row{gpt, "tokens/s", Gpt(gpt, steps, threads)}}) {
    std::vector<double> fp32, bf16;
    for (int r = 0; r < runs; ++r) {
      fp32.push_back(MustTrain(row.options, "fp32").images_per_s);
      bf16.push_back(MustTrain(row.options, "bf16").images_per_s);
    }
    const double f = Median(fp32), b = Median(bf16);
    const bool compare = torch && row.name == "mlp";
    const double tf = compare ? TorchMlp("fp32", threads, runs) : -1, tb = compare ? TorchMlp("bf16", threads, runs) : -1;
    auto torch_cell = [](double v) { return v > 0 ? std::to_string(static_cast<long long>(v)) : std::string("n/a"); };
    std::printf("%-18s %12.0f %12.0f %8.2fx %14s %14s   (%s)\n", row.name.c_str(), f, b, b / f, torch_cell(tf).c_str(),
                torch_cell(tb).c_str(), row.unit.c_str());
    std::fflush(stdout);
  }
  return 0;
}
