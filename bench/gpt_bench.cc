// gpt_bench: training throughput (tokens/s) and validation loss of copse's GPT in one process,
// next to the same model in PyTorch on the same machine when python3-torch is installed
// (scripts/torch_gpt.py bench, OMP_WAIT_POLICY=passive). Both sides: the same architecture and
// initialization scheme, byte tokens of the same fortunes windows, batch 16, AdamW (lr 3e-3,
// weight decay 0.1) with a 20-step warmup and cosine decay to 3e-4, gradients clipped to norm
// 1, the same number of steps; validation loss on the first 500 validation windows. Each side
// draws its own initial parameters and batch order (seed = run), so losses agree statistically,
// not bit for bit. Then the same model, batch and steps as copse jobs on the same two cores
// (`copse run --daemons 2`, 1 thread per vertex): tensor-parallel 2 (a gang per step on one
// daemon, shm channels), data-parallel 2 (parameter server) and a 2-stage 1F1B pipeline of 4
// micro-batches, with the same AdamW schedule, clipped like the single process except the
// pipeline (its norm would span stages). Each round runs every row once, in turn; medians
// printed. A benchmark: it prints figures and never fails on them.
//
//   gpt_bench [--model gpt:4-128-4-64] [--steps 200] [--runs 3] [--threads 2] [--no-torch] [--no-graphs]
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench/flags.h"
#include "ml/graph_gen.h"
#include "bench/torch_compare.h"
#include "ml/trainer.h"

namespace {

using copse::bench::Median;
using copse::bench::Python;

/// One PyTorch run: {tokens/s, validation loss}, or {-1, -1} when torch is unavailable.
std::pair<double, double> TorchRun(const std::string& model, int steps, int threads, int seed) {
  const std::string cmd = "OMP_WAIT_POLICY=passive " + Python() + " " + COPSE_SOURCE_DIR +
                          "/scripts/torch_gpt.py bench --model " + model + " --steps " + std::to_string(steps) + " --threads " +
                          std::to_string(threads) + " --runs 1 --seed " + std::to_string(seed) + " 2>/dev/null";
  const auto out = copse::bench::CommandOutput(cmd);
  if (!out) return {-1, -1};
  try {
    const auto j = nlohmann::json::parse(*out);
    return {j.at("median").get<double>(), j.at("validation_loss_median").get<double>()};
  } catch (const std::exception&) {
    return {-1, -1};
  }
}

/// One copse job of `o`: {tokens/s, validation loss} from its metrics.json, or {-1, -1}.
std::pair<double, double> GraphRun(const copse::ml::GraphOptions& o, const std::filesystem::path& dir) {
  auto job = copse::ml::GenerateTrainingGraph(o);
  if (!job.ok()) {
    std::fprintf(stderr, "generate: %s\n", job.status().ToString().c_str());
    return {-1, -1};
  }
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "job.json") << job->dump();
  const std::string cmd = std::string(COPSE_BINARY_DIR) + "/cli/copse run " + (dir / "job.json").string() +
                          " --daemons 2 --cpus 2 --output " + (dir / "out").string() + " -o json >/dev/null 2>&1";
  if (std::system(cmd.c_str()) != 0) return {-1, -1};
  std::ifstream mf(dir / "out" / "metrics.json");
  const auto metrics = nlohmann::json::parse(mf, nullptr, false);
  if (metrics.is_discarded()) return {-1, -1};
  return {metrics.value("tokens_per_s", -1.0), metrics.value("validation_loss", -1.0)};
}

}  // namespace

int main(int argc, char** argv) {
  std::string model = "gpt:4-128-4-64";
  int steps = 200, runs = 3, threads = 2;
  bool torch = true, graphs = true;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&] { return copse::bench::FlagValue(argc, argv, &i); };
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
    else if (a == "--no-graphs")
      graphs = false;
    else {
      std::fprintf(stderr, "usage: %s [--model gpt:L-D-H-C] [--steps N] [--runs N] [--threads N] [--no-torch] [--no-graphs]\n",
                   argv[0]);
      return 2;
    }
  }
  std::printf("gpt_bench: %s, batch 16, AdamW + warmup/cosine + clipping, %d steps, %d threads, median of %d runs\n",
              model.c_str(), steps, threads, runs);
  std::vector<double> ours, ours_loss, theirs, theirs_loss;
  struct GraphRow {
    std::string name;
    copse::ml::GraphOptions options;
    std::vector<double> rate, loss;
  };
  std::vector<GraphRow> rows;
  if (graphs) {
    copse::ml::GraphOptions g;
    g.model = model;
    g.batch = 16;
    g.steps = steps;
    g.optimizer = "adamw";
    g.lr = 3e-3;
    g.lr_schedule = "cosine";
    g.warmup_steps = 20;
    g.min_lr = 3e-4;
    g.weight_decay = 0.1;
    g.test_limit = 500;
    g.threads = 1;
    g.daemon_cpus = 2;
    copse::ml::GraphOptions dp = g, pp = g;
    dp.clip_norm = 1.0;  // as the single process (pipelines cannot clip yet)
    dp.kind = "data-parallel";
    dp.workers = 2;
    dp.reducer = "ps";
    pp.kind = "pipeline";
    pp.stages = 2;
    pp.microbatches = 4;
    pp.schedule = "1f1b";
    copse::ml::GraphOptions tp = g;
    tp.kind = "tensor-parallel";
    tp.tensor_parallel = 2;
    tp.tp_channel = "shm";
    tp.clip_norm = 1.0;
    rows.push_back({"tensor-parallel 2 shm", tp, {}, {}});
    rows.push_back({"data-parallel 2", dp, {}, {}});
    rows.push_back({"pipeline 2 1F1B M=4", pp, {}, {}});
  }
  const auto scratch = std::filesystem::temp_directory_path() / ("copse-gpt-bench-" + std::to_string(getpid()));
  for (int r = 1; r <= runs; ++r) {
    copse::ml::TrainOptions o = copse::bench::GptRecipe(model, steps, threads);
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
    for (GraphRow& row : rows) {
      const auto [rate, loss] = GraphRun(row.options, scratch / "job");
      if (rate <= 0) continue;
      row.rate.push_back(rate);
      row.loss.push_back(loss);
      std::printf("; %s %.0f", row.name.c_str(), rate);
    }
    std::printf("\n");
    std::fflush(stdout);
  }
  std::filesystem::remove_all(scratch);
  std::printf("%-22s %14s %16s\n", "", "tokens/s", "validation loss");
  std::printf("%-22s %14.0f %16.4f\n", "copse (1 process)", Median(ours), Median(ours_loss));
  for (const GraphRow& row : rows) {
    if (row.rate.empty()) continue;
    std::printf("%-22s %14.0f %16.4f   %.2fx copse's single process\n", row.name.c_str(), Median(row.rate), Median(row.loss),
                Median(row.rate) / Median(ours));
  }
  if (!theirs.empty()) {
    std::printf("%-22s %14.0f %16.4f\n", "pytorch (1 process)", Median(theirs), Median(theirs_loss));
    std::printf("copse / pytorch: %.2fx tokens/s; validation loss %+.2f %%\n", Median(ours) / Median(theirs),
                100.0 * (Median(ours_loss) / Median(theirs_loss) - 1.0));
  }
  return 0;
}
