// ml_train_bench: training throughput (images/s) of copse::ml's reference trainer for the MLP
// (784-1024-1024-10) and the CNN of ml/models.h, next to PyTorch on the same machine when
// python3-torch is installed (scripts/torch_bench.py, run with OMP_WAIT_POLICY=passive, its best
// setting here). Both sides: batch 128, SGD lr 0.05 momentum 0.9, the same Fashion-MNIST images,
// the median of --runs runs. With --device cuda both train on the GPU (images in host memory,
// each batch copied over) for a whole epoch. A benchmark: it prints figures and never fails on
// them.
//
//   ml_train_bench [--threads 2] [--runs 5] [--model mlp|cnn|all] [--device cpu|cuda] [--no-torch]
//   ml_train_bench --accuracy-epochs 3 [--seeds 3] [--model mlp]   (test accuracy per epoch,
//                                                                    copse and PyTorch, per seed)
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench/flags.h"
#include "bench/torch_compare.h"
#include "ml/trainer.h"

namespace {

using copse::ml::Train;
using copse::ml::TrainOptions;

using copse::bench::Median;
using copse::bench::Python;

/// Median images/s of PyTorch, or a negative value when torch is unavailable.
double TorchMedian(const std::string& model, const std::string& device, int threads, int64_t images, int runs,
                   const std::string& data_dir) {
  const std::string cmd = "OMP_WAIT_POLICY=passive " + Python() + " " + COPSE_SOURCE_DIR + "/scripts/torch_bench.py --model " +
                          model + " --device " + device + " --threads " + std::to_string(threads) + " --images " +
                          std::to_string(images) + " --runs " + std::to_string(runs) + " --data-dir '" + data_dir +
                          "' 2>/dev/null";
  const auto out = copse::bench::CommandOutput(cmd);
  if (!out) return -1;
  try {
    return nlohmann::json::parse(*out).at("median").get<double>();
  } catch (const std::exception&) {
    return -1;
  }
}

}  // namespace

int main(int argc, char** argv) {
  int threads = 2, runs = 5;
  std::string which = "all", device = "cpu", data_dir = copse::ml::kFashionMnistDir;
  bool torch = true;
  int accuracy_epochs = 0, seeds = 3;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&] { return copse::bench::FlagValue(argc, argv, &i); };
    if (a == "--threads")
      threads = std::stoi(next());
    else if (a == "--runs")
      runs = std::stoi(next());
    else if (a == "--model")
      which = next();
    else if (a == "--data-dir")
      data_dir = next();
    else if (a == "--device")
      device = next();
    else if (a == "--no-torch")
      torch = false;
    else if (a == "--accuracy-epochs")
      accuracy_epochs = std::stoi(next());
    else if (a == "--seeds")
      seeds = std::stoi(next());
    else {
      std::fprintf(stderr,
                   "usage: %s [--threads N] [--runs N] [--model mlp|cnn|all] "
                   "[--device cpu|cuda] [--data-dir DIR] [--no-torch]\n",
                   argv[0]);
      return 2;
    }
  }
  if (accuracy_epochs > 0) {
    const std::string model = which == "all" ? "mlp" : which;
    std::printf("test accuracy per epoch, %s, batch 128, SGD lr 0.05 momentum 0.9, full data\n", model.c_str());
    for (int seed = 1; seed <= seeds; ++seed) {
      TrainOptions o;
      o.model = model;
      o.threads = threads;
      o.data_dir = data_dir;
      o.epochs = accuracy_epochs;
      o.seed = static_cast<uint64_t>(seed);
      auto report = Train(o);
      if (!report.ok()) {
        std::fprintf(stderr, "%s\n", report.status().ToString().c_str());
        return 1;
      }
      std::printf("copse seed %d:", seed);
      for (const auto& e : report->epochs) std::printf(" %.2f", 100 * e.test_accuracy);
      std::printf("   (%.0f img/s)\n", report->images_per_s);
      std::fflush(stdout);
      if (torch) {
        const std::string cmd = "OMP_WAIT_POLICY=passive " + Python() + " " + COPSE_SOURCE_DIR +
                                "/scripts/torch_bench.py --model " + model + " --threads " + std::to_string(threads) +
                                " --accuracy-epochs " + std::to_string(accuracy_epochs) + " --seed " + std::to_string(seed) +
                                " --data-dir '" + data_dir + "' 2>/dev/null";
        FILE* p = popen(cmd.c_str(), "r");
        std::string out;
        std::array<char, 4096> buf;
        while (p != nullptr) {
          const size_t n = fread(buf.data(), 1, buf.size(), p);
          if (n == 0) break;
          out.append(buf.data(), n);
        }
        if (p != nullptr && pclose(p) == 0) {
          try {
            std::printf("torch seed %d:", seed);
            for (double a : nlohmann::json::parse(out).at("test_accuracy")) std::printf(" %.2f", 100 * a);
            std::printf("\n");
          } catch (const std::exception&) {
            std::printf(" n/a\n");
          }
        }
        std::fflush(stdout);
      }
    }
    return 0;
  }
  const bool gpu = device != "cpu";
  std::printf("ml_train_bench: %s, batch 128, SGD lr 0.05 momentum 0.9, %d threads, median of %d runs\n", device.c_str(), threads,
              runs);
  std::printf("%-5s %8s %14s %14s %7s\n", "model", "images", "copse img/s", "torch img/s", "ratio");
  for (const std::string model : {"mlp", "cnn"}) {
    if (which != "all" && which != model) continue;
    TrainOptions o;
    o.model = model;
    o.device = device;
    o.threads = threads;
    o.data_dir = data_dir;
    o.limit = gpu ? 60000 : model == "mlp" ? 12800 : 6400;  // a GPU step is short: a whole epoch
    o.evaluate = false;
    std::vector<double> rates;
    for (int r = 0; r < runs; ++r) {
      o.seed = static_cast<uint64_t>(r + 1);
      auto report = Train(o);
      if (!report.ok()) {
        std::fprintf(stderr, "%s: %s\n", model.c_str(), report.status().ToString().c_str());
        return 1;
      }
      rates.push_back(report->images_per_s);
    }
    const double ours = Median(rates);
    const double theirs = torch ? TorchMedian(model, device, threads, o.limit, runs, data_dir) : -1;
    if (theirs > 0) {
      std::printf("%-5s %8lld %14.0f %14.0f %7.2f\n", model.c_str(), static_cast<long long>(o.limit), ours, theirs,
                  ours / theirs);
    } else {
      std::printf("%-5s %8lld %14.0f %14s %7s\n", model.c_str(), static_cast<long long>(o.limit), ours, "n/a", "");
    }
    std::fflush(stdout);
  }
  return 0;
}
