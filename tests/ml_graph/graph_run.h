#pragma once
// What the training-graph suites share: small training settings, a job run by `copse run` on a
// local cluster of real processes with its outputs read back, the single-process reference,
// and the measure of how far two parameter sets are apart.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include <doctest/doctest.h>

#include "common/json_util.h"
#include "ml/graph_gen.h"
#include "ml/serialize.h"
#include "ml/trainer.h"

namespace copse::ml::graph_test {

namespace fs = std::filesystem;

inline std::string Copse() { return std::string(COPSE_BINARY_DIR) + "/cli/copse"; }

class TempDir {
 public:
  TempDir() {
    char tmpl[] = "/tmp/copse-mlgraph-XXXXXX";
    REQUIRE(mkdtemp(tmpl) != nullptr);
    path = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  fs::path path;
};

struct RunResult {
  Json summary;
  Json metrics;
  NamedTensors params;
  std::string digest;
};

inline GraphOptions Small() {
  GraphOptions o;
  o.model = "mlp:784-64-10";
  o.limit = 512;
  o.test_limit = 1000;
  o.batch = 64;
  o.epochs = 1;  // 8 steps
  o.lr = 0.05;
  o.momentum = 0.9;
  o.seed = 7;
  return o;
}

/// Small() with a 3-layer MLP (784-64-32-10): two Linear layers to split a pipeline between.
inline GraphOptions SmallDeep() {
  GraphOptions o = Small();
  o.model = "mlp:784-64-32-10";
  return o;
}

/// Small() as a one-step pipeline of 2 stages: for tests of the generated graph's shape.
inline GraphOptions SmallPipeline() {
  GraphOptions o = Small();
  o.kind = "pipeline";
  o.stages = 2;
  o.steps = 1;
  return o;
}

/// `base` as a pipeline (or hybrid) of that shape.
inline GraphOptions PipelineOf(GraphOptions base, const std::string& kind, int stages, int micro, const std::string& schedule,
                               bool recompute, const std::string& weight_grads) {
  base.kind = kind;
  base.stages = stages;
  base.microbatches = micro;
  base.schedule = schedule;
  base.recompute = recompute;
  base.weight_grads = weight_grads;
  return base;
}

/// What shell command `cmd` printed on its standard output; `*rc` gets its wait status.
inline std::string Output(const std::string& cmd, int* rc) {
  FILE* p = popen(cmd.c_str(), "r");
  REQUIRE(p != nullptr);
  std::string text;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) text.append(buf, n);
  *rc = pclose(p);
  return text;
}

/// Writes `job` into `dir`, runs it with `copse run` (`env`: "NAME=value " settings for the
/// cluster's processes; `flags`: more of copse run's, " --gpus 1"), returns the summary and
/// eval's outputs.
inline RunResult RunJob(const Json& job, const fs::path& dir, int daemons, int cpus = 2, const std::string& env = "",
                        const std::string& flags = "") {
  const fs::path file = dir / "job.json", out = dir / "out";
  { std::ofstream(file) << job.dump(1); }
  const std::string cmd = env + Copse() + " run " + file.string() + " --daemons " + std::to_string(daemons) + " --cpus " +
                          std::to_string(cpus) + flags + " --output " + out.string() + " -o json 2>" +
                          (dir / "stderr.txt").string();
  int rc = 0;
  const std::string text = Output(cmd, &rc);
  INFO("copse run output: " << text);
  if (rc != 0) {
    std::ifstream err(dir / "stderr.txt");
    std::stringstream e;
    e << err.rdbuf();
    INFO("copse run errors: " << e.str());
    REQUIRE(rc == 0);
  }
  RunResult r;
  r.summary = Json::parse(text);
  REQUIRE(r.summary["state"] == "completed");
  std::ifstream mf(out / "metrics.json");
  r.metrics = Json::parse(mf);
  std::ifstream pf(out / "params.bin", std::ios::binary);
  std::stringstream ss;
  ss << pf.rdbuf();
  auto params = DeserializeTensors(ss.str());
  REQUIRE(params.ok());
  r.params = *params;
  r.digest = Digest(r.params);
  CHECK(r.digest == r.metrics["parameter_digest"].get<std::string>());
  return r;
}

/// `copse train`'s settings for g's training, on `device` (not g.device: the graphs' reference
/// is the CPU unless a test says otherwise).
inline TrainOptions SingleProcessOptions(const GraphOptions& g, const std::string& device = "cpu") {
  TrainOptions o;
  o.model = g.model;
  o.limit = g.limit;
  o.batch = g.batch;
  o.epochs = g.epochs;
  o.lr = static_cast<float>(g.lr);
  o.momentum = static_cast<float>(g.momentum);
  o.seed = g.seed;
  o.lr_schedule = g.lr_schedule;
  o.warmup_steps = g.warmup_steps;
  o.min_lr = static_cast<float>(g.min_lr);
  o.clip_norm = static_cast<float>(g.clip_norm);
  o.optimizer = g.optimizer;
  o.weight_decay = static_cast<float>(g.weight_decay);
  o.precision = g.precision;
  o.init_loss_scale = static_cast<float>(g.init_loss_scale);
  o.threads = 1;
  o.device = device;
  o.evaluate = false;
  return o;
}

/// The parameters `copse train` reaches with g's settings (SingleProcessOptions).
inline NamedTensors SingleProcess(const GraphOptions& g, const std::string& device = "cpu") {
  auto r = Train(SingleProcessOptions(g, device));
  REQUIRE(r.ok());
  return r->final_parameters;
}

/// max |a - b| over every parameter, divided by max |b|.
inline double RelativeDifference(const NamedTensors& a, const NamedTensors& b) {
  REQUIRE(a.size() == b.size());
  double diff = 0, scale = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    REQUIRE(a[i].first == b[i].first);
    REQUIRE(a[i].second.numel() == b[i].second.numel());
    for (int64_t k = 0; k < a[i].second.numel(); ++k) {
      diff = std::max(diff, static_cast<double>(std::fabs(a[i].second.data()[k] - b[i].second.data()[k])));
      scale = std::max(scale, static_cast<double>(std::fabs(b[i].second.data()[k])));
    }
  }
  return diff / scale;
}

}  // namespace copse::ml::graph_test
