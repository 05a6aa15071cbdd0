// gpt_bench: training throughput (tokens/s) and validation loss of copse's GPT in one process,
// next to the same model in PyTorch on the same machine when python3-torch is installed
// (scripts/torch_gpt.py bench, OMP_WAIT_POLICY=passive). Both sides: the same architecture and
// initialization scheme, byte tokens of the same fortunes windows, batch 16, AdamW (lr 3e-3,
// weight decay 0.1) with a 20-step warmup and cosine decay to 3e-4, gradients clipped to norm
// 1, the same number of steps; validation loss on the first 500 validation windows. Each side
// draws its own initial parameters and batch order (seed = run), so losses agree statistically,
// not bit for bit. Runs alternate copse, torch, copse, ... (interleaved pairs); medians printed.
// A benchmark: it prints figures and never fails on them.
//
//   gpt_bench [--model gpt:4-128-4-64] [--steps 200] [--runs 3] [--threads 2] [--no-torch]
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "ml/trainer.h"

namespace {

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

std::string Python() {
  if (const char* p = std::getenv("COPSE_PYTHON")) return p;
  if (access("/usr/bin/python3", X_OK) == 0) return "/usr/bin/python3";  // Debian's torch
  return "python3";
}

/// One PyTorch run: {tokens/s, validation loss}, or {-1, -1} when torch is unavailable.
std::pair<double, double> TorchRun(const std::string& model, int steps, int threads, int seed) {
  const std::string cmd = "OMP_WAIT_POLICY=passive " + Python() + " " + COPSE_SOURCE_DIR +
                          "/scripts/torch_gpt.py bench --model " + model + " --steps " + std::to_string(steps) + " --threads " +
                          std::to_string(threads) + " --runs 1 --seed " + std::to_string(seed) + " 2>/dev/null";
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) return {-1, -1};
  std::string out;
  std::array<char, 4096> buf;
  while (size_t n = fread(buf.data(), 1, buf.size(), p)) out.append(buf.data(), n);
  if (pclose(p) != 0) return {-1, -1};
  try {
    const auto j = nlohmann::json::parse(out);
    return {j.at("median").get<double>(), j.at("validation_loss_median").get<double>()};
  } catch (const std::exception&) {
    return {-1, -1};
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::string model = "gpt:4-128-4-64";
  int steps = 200, runs = 3, threads = 2;
  bool torch = true;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--model")
      model = next();
    else if (a == "--steps")
      steps = std::stoi(next());
    else if (a == "--runs")
      runs = std::stoi(next());
    else if (a == "--threads")
      threads = std::stoi(next());
    else if (a == "--no-torch")
      torch = false;
    else {
      std::fprintf(stderr, "usage: %s [--model gpt:L-D-H-C] [--steps N] [--runs N] [--threads N] [--no-torch]\n", argv[0]);
      return 2;
    }
  }
  std::printf("gpt_bench: %s, batch 16, AdamW + warmup/cosine + clipping, %d steps, %d threads, median of %d runs\n",
              model.c_str(), steps, threads, runs);
  std::vector<double> ours, ours_loss, theirs, theirs_loss;
  for (int r = 1; r <= runs; ++r) {
    copse::ml::TrainOptions o;
    o.model = model;
    o.optimizer = "adamw";
    o.lr = 3e-3f;
    o.min_lr = 3e-4f;
    o.weight_decay = 0.1f;
    o.lr_schedule = "cosine";
    o.warmup_steps = 20;
    o.clip_norm = 1.0f;
    o.batch = 16;
    o.max_steps = steps;
    o.threads = threads;
    o.test_limit = 500;
    o.sample_bytes = 0;
    o.seed = static_cast<uint64_t>(r);
    auto report = copse::ml::Train(o);
    if (!report.ok()) {
      std::fprintf(stderr, "copse: %s\n", report.status().ToString().c_str());
      return 1;
    }
    ours.push_back(report->images_per_s);
    ours_loss.push_back(report->validation_loss);
    std::printf("run %d: copse %.0f tokens/s, validation loss %.4f", r, ours.back(), ours_loss.back());
    if (torch) {
      const auto [rate, loss] = TorchRun(model, steps, threads, r);
      if (rate > 0) {
        theirs.push_back(rate);
        theirs_loss.push_back(loss);
        std::printf("; torch %.0f tokens/s, validation loss %.4f", rate, loss);
      } else {
        std::printf("; torch n/a");
      }
    }
    std::printf("\n");
    std::fflush(stdout);
  }
  std::printf("%-16s %14s %16s\n", "", "tokens/s", "validation loss");
  std::printf("%-16s %14.0f %16.4f\n", "copse (1 proc)", Median(ours), Median(ours_loss));
  if (!theirs.empty()) {
    std::printf("%-16s %14.0f %16.4f\n", "pytorch", Median(theirs), Median(theirs_loss));
    std::printf("copse / pytorch: %.2fx tokens/s; validation loss %+.2f %%\n", Median(ours) / Median(theirs),
                100.0 * (Median(ours_loss) / Median(theirs_loss) - 1.0));
  }
  return 0;
}
