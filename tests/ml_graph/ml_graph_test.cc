// Training as graphs, end to end: generated job files run by `copse run` on a local cluster
// of real processes reach the parameters of single-process training, and a daemon killed
// mid-epoch changes nothing in the result.
//
// Tolerance (data-parallel and pipeline vs single-process): the graph sums per-shard /
// per-micro-batch gradients (each normalized by the global batch) in a fixed order, the
// single process computes the whole-batch gradient in one product. Both are the same sum of
// the same float32 terms, reassociated, so each gradient differs by a few ulps (~1e-7
// relative); SGD with momentum carries these differences forward without amplifying them
// much over a few steps of a small MLP. We allow 2e-5 of the largest parameter magnitude
// after 8 steps: about 100x what reassociation gives (measured ~1e-7), and far below what a
// real error (a lost or doubled micro-batch, a wrong normalizer, a stale parameter version:
// each moves parameters by >= 1e-3 of their magnitude after one step) would produce.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <tuple>

#include <doctest/doctest.h>

#include "common/json_util.h"
#include "ml/graph_gen.h"
#include "ml/models.h"
#include "ml/pipeline_bubble.h"
#include "ml/programs/register.h"
#include "tests/ml_graph/graph_run.h"
#include "ml/programs/support.h"
#include "ml/serialize.h"
#include "ml/trainer.h"
#include "vertex/program_registry.h"

namespace copse::ml {
namespace {

using namespace graph_test;

constexpr double kTolerance = 2e-5;

TEST_CASE("MlGraph.DataParallelMatchesSingleProcessTraining" * doctest::timeout(240)) {
  const GraphOptions base = Small();
  const NamedTensors reference = SingleProcess(base);
  struct Case {
    int workers;
    std::string reducer;
  };
  for (Case c : {Case{2, "tree"}, Case{4, "tree"}, Case{2, "ps"}, Case{3, "ring"}}) {
    CAPTURE(c.workers);
    CAPTURE(c.reducer);
    GraphOptions o = base;
    o.kind = "data-parallel";
    o.workers = c.workers;
    o.reducer = c.reducer;
    auto job = GenerateTrainingGraph(o);
    REQUIRE(job.ok());
    TempDir dir;
    const RunResult r = RunJob(*job, dir.path, 2);
    const double rel = RelativeDifference(r.params, reference);
    MESSAGE("data-parallel W=" << c.workers << " " << c.reducer << ": relative difference " << rel);
    CHECK(rel < kTolerance);
    CHECK(r.metrics["train_images"] == 512);
    CHECK(r.metrics["test_accuracy"].get<double>() > 0.3);
  }
}

TEST_CASE("MlGraph.PipelineMatchesSingleProcessTraining" * doctest::timeout(240)) {
  GraphOptions base = SmallDeep();
  const NamedTensors reference = SingleProcess(base);
  struct Case {
    int stages, micro;
    std::string schedule;
    bool recompute;
    std::string weight_grads = "batched";
  };
  std::map<std::string, std::string> digest_of;  // two-stage runs, by how weight gradients are summed
  for (Case c : {Case{2, 4, "1f1b", false}, Case{2, 4, "gpipe", false}, Case{2, 4, "gpipe", true},
                 Case{2, 4, "1f1b", false, "per-microbatch"}, Case{3, 4, "1f1b", false}, Case{2, 4, "interleaved", false}}) {
    CAPTURE(c.stages);
    CAPTURE(c.schedule);
    CAPTURE(c.recompute);
    CAPTURE(c.weight_grads);
    auto job = GenerateTrainingGraph(PipelineOf(base, "pipeline", c.stages, c.micro, c.schedule, c.recompute, c.weight_grads));
    REQUIRE(job.ok());
    TempDir dir;
    const RunResult r = RunJob(*job, dir.path, c.stages);
    const double rel = RelativeDifference(r.params, reference);
    MESSAGE("pipeline P=" << c.stages << " M=" << c.micro << " " << c.schedule << std::string(c.recompute ? " recompute" : "")
                          << std::string(c.weight_grads == "batched" && !c.recompute ? " batched" : " per-micro-batch")
                          << " weight gradients: relative difference " << rel);
    CHECK(rel < kTolerance);
    // The summary measures the bubble from the job manager's spans, next to the theory.
    REQUIRE(r.summary.contains("pipeline_bubble"));
    const Json& bubble = r.summary["pipeline_bubble"];
    const int chunks = c.schedule == "interleaved" ? 2 : 1;  // interleaved: 2 model chunks a daemon
    CHECK(bubble["theory"].get<double>() == doctest::Approx((c.stages - 1.0) / (chunks * c.micro + c.stages - 1.0)));
    CHECK(bubble["measured"].get<double>() > 0);
    CHECK(bubble["measured"].get<double>() < 1);
    // Each stage's idle share, and the bubble replayed without gaps, which only removes idle time.
    REQUIRE(bubble["stage_idle"].size() == static_cast<size_t>(c.stages));
    REQUIRE(bubble.contains("without_gaps"));
    CHECK(bubble["without_gaps"].get<double>() <= bubble["measured"].get<double>() + 1e-9);
    CHECK(bubble["without_gaps"].get<double>() >= 0);
    // The loss stage's updates report live progress; the summary keeps the last step's.
    REQUIRE(r.summary.contains("progress"));
    CHECK(r.summary["progress"]["step"] == r.summary["progress"]["steps"]);
    CHECK(r.summary["progress"]["loss"].get<double>() > 0);
    // The schedule and recomputation change when work runs, not what is summed in which order;
    // batching the weight gradients (one product over every micro-batch, never with
    // recomputation) changes the order, so the bits.
    if (c.stages == 2) {
      const bool batched = c.weight_grads == "batched" && !c.recompute;
      std::string& digest = digest_of[batched ? "batched" : "per-microbatch"];
      if (digest.empty()) digest = r.digest;
      CHECK(r.digest == digest);
    }
  }
  REQUIRE(digest_of.size() == 2);
  CHECK(digest_of["batched"] != digest_of["per-microbatch"]);  // the batched path really ran
}

// Mixed precision as graphs: bfloat16 products round each operand element by element, whatever
// the batch split, so data-parallel shards still differ from the single process only by float32
// reassociation. A pipeline's activations and gradients cross stages in bfloat16: the next
// Linear rounds its input so anyway, but the gradient's rounding also reaches the previous
// stage's bias gradients (summed in float32 in one process), a difference of bfloat16's
// precision (2^-9) in those terms only. Both stay far below what bf16 itself changes against
// float32 training, which the test measures too.
TEST_CASE("MlGraph.Bf16GraphsMatchSingleProcessBf16" * doctest::timeout(240)) {
  GraphOptions fp32 = SmallDeep();
  GraphOptions bf16 = fp32;
  bf16.precision = "bf16";
  const NamedTensors reference = SingleProcess(bf16);
  const double bf16_vs_fp32 = RelativeDifference(reference, SingleProcess(fp32));
  MESSAGE("single process, bf16 against fp32: relative difference " << bf16_vs_fp32);

  GraphOptions dp = bf16;
  dp.kind = "data-parallel";
  dp.workers = 2;
  auto dp_job = GenerateTrainingGraph(dp);
  REQUIRE(dp_job.ok());
  REQUIRE((*dp_job)["stages"][0]["params"]["precision"] == "bf16");
  TempDir dp_dir;
  const double dp_rel = RelativeDifference(RunJob(*dp_job, dp_dir.path, 2).params, reference);
  MESSAGE("data-parallel bf16: relative difference " << dp_rel);
  CHECK(dp_rel < kTolerance);

  std::map<std::string, int64_t> remote;
  double pipeline_rel = 0;
  for (const GraphOptions& g : {fp32, bf16}) {
    auto job = GenerateTrainingGraph(PipelineOf(g, "pipeline", 2, 4, "1f1b", false, "batched"));
    REQUIRE(job.ok());
    TempDir dir;
    const RunResult r = RunJob(*job, dir.path, 2);
    remote[g.precision] = r.summary["input_bytes"]["remote"].get<int64_t>();
    if (g.precision == "bf16") pipeline_rel = RelativeDifference(r.params, reference);
  }
  MESSAGE("pipeline bf16: relative difference " << pipeline_rel << "; bytes read across daemons fp32 " << remote["fp32"]
                                                << ", bf16 " << remote["bf16"]);
  CHECK(pipeline_rel < 0.1 * bf16_vs_fp32);
  // What crosses daemons depends on where the updates and the evaluation ran, so the bytes are
  // reported, not checked; Bf16BoundariesAreBFloat16OnlyBeforeALayerThatMultipliesInBf16 checks
  // the boundary's type and size.
}

// fp16 as a data-parallel graph: each worker's gradient of the loss scaled by S (a power of two,
// exact), the update sums, divides by S and checks for overflow, and the scale's state rides in
// the chain: the single process's fp16 results up to float32 reassociation. Pipelines refuse it.
TEST_CASE("MlGraph.Fp16DataParallelMatchesSingleProcessFp16" * doctest::timeout(240)) {
  GraphOptions fp16 = Small();
  fp16.precision = "fp16";
  const NamedTensors reference = SingleProcess(fp16);
  GraphOptions dp = fp16;
  dp.kind = "data-parallel";
  dp.workers = 2;
  for (const std::string reducer : {"tree", "ring"}) {
    dp.reducer = reducer;
    auto job = GenerateTrainingGraph(dp);
    REQUIRE(job.ok());
    TempDir dir;
    const RunResult r = RunJob(*job, dir.path, 2);
    const double rel = RelativeDifference(r.params, reference);
    MESSAGE("data-parallel fp16 (" << reducer << "): relative difference " << rel);
    CHECK(rel < kTolerance);
    CHECK(r.summary["progress"]["loss_scale"].get<double>() == 65536.0);
  }
  // Not in a pipeline of tensor-parallel gangs: its step check spans one member per stage.
  GraphOptions gangs = PipelineOf(fp16, "pipeline", 2, 4, "1f1b", false, "batched");
  gangs.model = "gpt:2-32-4-16";
  gangs.tensor_parallel = 2;
  auto refused = GenerateTrainingGraph(gangs);
  REQUIRE_FALSE(refused.ok());
  CHECK(refused.status().message().find("--precision fp16: expected --tensor-parallel 1 in a pipeline") == 0);
  GraphOptions scaled = Small();
  scaled.init_loss_scale = 1024;
  CHECK(GenerateTrainingGraph(scaled).status().message() ==
        "--init-loss-scale: expected the default with --precision fp32 (it is fp16's)");
}

TEST_CASE("MlGraph.Bf16BoundariesAreBFloat16OnlyBeforeALayerThatMultipliesInBf16") {
  programs::TrainSettings s;
  s.precision = Precision::kBFloat16;
  s.model = "mlp:784-64-32-10";  // Flatten, Linear, Linear, Linear
  const Tensor t = Tensor::Zeros({4, 64});
  CHECK(programs::BoundaryTensor(s, 2, t).dtype() == DType::kBFloat16);
  // Half the bytes on the wire, but for the header and checksum.
  CHECK(SerializeTensor(programs::BoundaryTensor(s, 2, t)).size() + 4 * 64 * 2 == SerializeTensor(t).size());
  CHECK(programs::BoundaryTensor(s, 0, t).dtype() == DType::kFloat32);  // before Flatten
  s.model = "gpt:2-32-4-16";                                            // a block's residual stream
  CHECK(programs::BoundaryTensor(s, 3, t).dtype() == DType::kFloat32);
  s.model = "mlp:784-64-32-10";
  s.precision = Precision::kFloat32;
  CHECK(programs::BoundaryTensor(s, 2, t).dtype() == DType::kFloat32);
}

/// A two-block GPT on 256 windows of 16 tokens, 8 steps of 32 windows under a cosine schedule
/// (the rates copse train would use at each step).
GraphOptions SmallGpt() {
  GraphOptions o = Small();
  o.model = "gpt:2-32-4-16";
  o.limit = 256;
  o.test_limit = 64;
  o.batch = 32;
  o.lr_schedule = "cosine";
  o.warmup_steps = 2;
  o.min_lr = 0.005;
  return o;
}

// fp16 overflow that only some stages see: with the loss scale starting at 2^24, the final
// LayerNorm's backward (dividing by the small residual stream's deviation) makes the gradients
// below it overflow float16 while the head's stay finite. A pipeline split there must still skip
// those steps in every stage, as the single process does: stage 0's last backward gathers the
// step check and sends it to both updates. (Were each update to decide from its own gradients,
// the head would train on through the 3 overflowed steps: measured loss 5.65 against 5.21.) The
// tensor-parallel members agree the same way, over their gang; a hybrid's updates take the check
// of each of its pipelines.
TEST_CASE("MlGraph.Fp16StagesAndMembersSkipOverflowedStepsTogether" * doctest::timeout(300)) {
  if (!fs::exists("/usr/share/games/fortunes")) {
    MESSAGE("skipped: no /usr/share/games/fortunes (Debian package fortunes)");
    return;
  }
  GraphOptions base = SmallGpt();
  base.precision = "fp16";
  base.init_loss_scale = 16777216;  // 2^24
  auto single = Train(SingleProcessOptions(base));
  REQUIRE(single.ok());
  REQUIRE(single->skipped_steps == 3);
  const double final_scale = single->loss_scale;  // 2^21 after three halvings
  for (const std::string kind : {"pipeline", "hybrid", "tensor-parallel"}) {
    CAPTURE(kind);
    GraphOptions o = kind == "tensor-parallel" ? base : PipelineOf(base, kind, 2, 4, "1f1b", false, "batched");
    o.kind = kind;
    o.workers = 2;
    if (kind == "tensor-parallel") o.tensor_parallel = 2;
    if (kind != "tensor-parallel") o.split = {0, 6, 8};  // the head (LayerNorm, Linear) alone in stage 1
    auto job = GenerateTrainingGraph(o);
    REQUIRE(job.ok());
    TempDir dir;
    const RunResult r = RunJob(*job, dir.path, 2);
    const double rel = RelativeDifference(r.params, single->final_parameters);
    MESSAGE("gpt fp16 " << kind << " with overflowed steps: relative difference " << rel);
    CHECK(rel < kTolerance);
    CHECK(r.summary["progress"]["loss_scale"].get<double>() == final_scale);
  }
}

// The transformer as graphs: its pipeline stages split at block boundaries (the residual stream
// [B, T, D] is what crosses), data-parallel shards of text windows, and a hybrid of both, each
// reaching single-process training's parameters (SGD: Adam would turn the attention key bias's
// exactly-zero gradient, rounding noise on either side, into +-lr steps that never touch the
// output but do move that bias); a daemon killed mid-run changes no bit of the result.
TEST_CASE("MlGraph.GptPipelineDataParallelAndHybridMatchSingleProcessTraining" * doctest::timeout(300)) {
  if (!fs::exists("/usr/share/games/fortunes")) {
    MESSAGE("skipped: no /usr/share/games/fortunes (Debian package fortunes)");
    return;
  }
  const GraphOptions base = SmallGpt();
  const NamedTensors reference = SingleProcess(base);
  std::string clean_pipeline_digest;
  for (const std::string kind : {"pipeline", "data-parallel", "hybrid"}) {
    CAPTURE(kind);
    GraphOptions o = kind == "data-parallel" ? base : PipelineOf(base, kind, 2, 4, "1f1b", false, "batched");
    o.kind = kind;
    o.workers = 2;
    auto job = GenerateTrainingGraph(o);
    REQUIRE(job.ok());
    TempDir dir;
    const RunResult r = RunJob(*job, dir.path, 2);
    const double rel = RelativeDifference(r.params, reference);
    MESSAGE("gpt " << kind << ": relative difference " << rel);
    CHECK(rel < kTolerance);
    CHECK(r.metrics["train_tokens"] == 256 * 16);
    CHECK(r.metrics["validation_loss"].get<double>() < 5.0);      // ln(256) = 5.55 untrained
    CHECK(r.metrics["sample"].get<std::string>().size() >= 200);  // bytes not valid UTF-8 become U+FFFD
    if (kind == "pipeline") clean_pipeline_digest = r.digest;
  }
  // Stage 1's daemon killed mid-run: the pipeline's result is bit-identical to the clean run's.
  GraphOptions o = PipelineOf(base, "pipeline", 2, 4, "1f1b", false, "batched");
  auto job = GenerateTrainingGraph(o);
  REQUIRE(job.ok());
  Json faulty = *job;
  faulty["faults"] = Json::array({{{"kill_daemon_of", "fwd1[20]"}, {"when", {{"completed", 70}}}}});
  TempDir dir;
  const RunResult r = RunJob(faulty, dir.path, 3);
  REQUIRE(r.summary["faults"].size() == 1);
  REQUIRE(r.summary["recoveries"].size() > 0);
  CHECK(r.digest == clean_pipeline_digest);
}

// Tensor parallelism as a job: per step a gang of two ml.tp_step members joined by live
// channels — shm on one daemon, or stream across daemons — reaches the whole model's
// single-process parameters (the same sums split at another point), and a killed member's
// daemon restarts the gang: bit-identical parameters. So does data x pipeline x tensor
// parallelism in one job.
TEST_CASE("MlGraph.GptTensorParallelAnd3DMatchSingleProcessTraining" * doctest::timeout(300)) {
  if (!fs::exists("/usr/share/games/fortunes")) {
    MESSAGE("skipped: no /usr/share/games/fortunes (Debian package fortunes)");
    return;
  }
  const GraphOptions base = SmallGpt();
  const NamedTensors reference = SingleProcess(base);
  std::string digest;
  for (const std::string channel : {"shm", "stream"}) {
    CAPTURE(channel);
    GraphOptions o = base;
    o.kind = "tensor-parallel";
    o.tensor_parallel = 2;
    o.tp_channel = channel;
    auto job = GenerateTrainingGraph(o);
    REQUIRE(job.ok());
    TempDir dir;
    const RunResult r = RunJob(*job, dir.path, 2, channel == "shm" ? 2 : 1);  // stream: one slot each, members apart
    const double rel = RelativeDifference(r.params, reference);
    MESSAGE("gpt tensor-parallel 2 over " << channel << ": relative difference " << rel);
    CHECK(rel < kTolerance);
    CHECK(r.metrics["config"]["tensor_parallel"] == 2);
    if (digest.empty()) digest = r.digest;
    CHECK(r.digest == digest);  // the channel kind moves bytes, it changes no sum
  }
  GraphOptions o = base;
  o.kind = "tensor-parallel";
  o.tensor_parallel = 2;
  o.tp_channel = "stream";
  auto job = GenerateTrainingGraph(o);
  REQUIRE(job.ok());
  Json faulty = *job;
  faulty["faults"] = Json::array({{{"kill_daemon_of", "tp1[5]"}, {"when", {{"completed", 12}}}}});
  TempDir dir;
  const RunResult r = RunJob(faulty, dir.path, 3, 1);
  REQUIRE(r.summary["faults"].size() == 1);
  REQUIRE(r.summary["recoveries"].size() > 0);
  CHECK(r.digest == digest);

  // Data x pipeline x tensor parallelism in one job: 2 pipelines of 2 stages, each forward and
  // backward a gang of 2 tensor-parallel members (shm), 8 vertices per micro-batch slot.
  GraphOptions three_d = PipelineOf(base, "hybrid", 2, 2, "1f1b", false, "batched");
  three_d.workers = 2;
  three_d.tensor_parallel = 2;
  auto job3 = GenerateTrainingGraph(three_d);
  REQUIRE(job3.ok());
  TempDir dir3;
  const RunResult r3 = RunJob(*job3, dir3.path, 2);
  const double rel3 = RelativeDifference(r3.params, reference);
  MESSAGE("gpt data 2 x pipeline 2 x tensor 2: relative difference " << rel3);
  CHECK(rel3 < kTolerance);
  CHECK(r3.metrics["config"]["tensor_parallel"] == 2);

  // Clipped to a norm below the gradients' (so every step clips): a data-parallel job (its
  // update holds every gradient), a tensor-parallel one (the members add their shards' squares)
  // and pipelines (their stages' squares gathered by the step check) follow single-process
  // training, and differ from unclipped training.
  GraphOptions clipped = base;
  clipped.clip_norm = 0.05;
  clipped.optimizer = "adamw";
  clipped.lr = 0.003;
  clipped.min_lr = 0.0003;
  const NamedTensors clipped_reference = SingleProcess(clipped);
  for (const std::string kind : {"data-parallel", "tensor-parallel"}) {
    CAPTURE(kind);
    GraphOptions c = clipped;
    c.kind = kind;
    c.workers = 2;
    c.reducer = "ps";
    c.tensor_parallel = kind == "tensor-parallel" ? 2 : 1;
    auto clipped_job = GenerateTrainingGraph(c);
    REQUIRE(clipped_job.ok());
    TempDir clipped_dir;
    const RunResult rc = RunJob(*clipped_job, clipped_dir.path, 2);
    const double rel_c = RelativeDifference(rc.params, clipped_reference);
    MESSAGE("gpt " << kind << " clipped: relative difference " << rel_c);
    // AdamW divides each gradient by its own running magnitude: the key bias's rounding noise
    // (gpt_reference_test.cc) moves it by +-lr per step; compare everything else.
    NamedTensors ours, theirs;
    for (size_t i = 0; i < rc.params.size(); ++i) {
      if (rc.params[i].first.find("qkv.bias") != std::string::npos) continue;
      ours.push_back(rc.params[i]);
      theirs.push_back(clipped_reference[i]);
    }
    CHECK(RelativeDifference(ours, theirs) < 1e-4);
  }
  GraphOptions unclipped = clipped;
  unclipped.clip_norm = 0;
  const NamedTensors unclipped_reference = SingleProcess(unclipped);
  // Adam divides out most of a gradient's scale, so clipping moves the parameters little — but
  // 70x the tolerance above (measured 7e-3).
  CHECK(RelativeDifference(unclipped_reference, clipped_reference) > 1e-3);
  // A pipeline clips too: its stages' squares gathered by the step check (and interleaved, over
  // four model chunks).
  for (const std::string schedule : {"1f1b", "interleaved"}) {
    CAPTURE(schedule);
    GraphOptions p = PipelineOf(clipped, "pipeline", 2, 4, schedule, false, "batched");
    p.virtual_stages = 2;
    auto clipped_job = GenerateTrainingGraph(p);
    REQUIRE(clipped_job.ok());
    TempDir clipped_dir;
    const RunResult rc = RunJob(*clipped_job, clipped_dir.path, 2);
    NamedTensors ours, theirs;
    for (size_t i = 0; i < rc.params.size(); ++i) {
      if (rc.params[i].first.find("qkv.bias") != std::string::npos) continue;
      ours.push_back(rc.params[i]);
      theirs.push_back(clipped_reference[i]);
    }
    const double rel_p = RelativeDifference(ours, theirs);
    MESSAGE("gpt pipeline " << schedule << " clipped: relative difference " << rel_p);
    CHECK(rel_p < 1e-4);
  }
  GraphOptions clipped_hybrid = PipelineOf(clipped, "hybrid", 2, 4, "1f1b", false, "batched");
  clipped_hybrid.workers = 2;
  CHECK(GenerateTrainingGraph(clipped_hybrid).status().message().find("--clip-norm: expected 0 for hybrid jobs") == 0);

  GraphOptions bad = base;
  bad.kind = "tensor-parallel";
  bad.tensor_parallel = 3;
  CHECK(GenerateTrainingGraph(bad).status().message().find("4 heads cannot be split over 3") != std::string::npos);
  bad.model = "mlp";
  CHECK(GenerateTrainingGraph(bad).status().message().find("gpt models only") != std::string::npos);
}

// The stage split minimizes the largest stage's estimated cost (3 x parameters per layer, 2 x
// for the first layer with parameters, + 1), and of the optimal splits picks the
// lexicographically smallest: checked against every split of small models, and a 64-block GPT
// in 16 stages (2^60 candidate splits) is split at once.
TEST_CASE("MlGraph.BalancedSplitIsTheBruteForceOptimum") {
  for (const std::string model : {"mlp", "cnn", "mlp:784-64-32-16-10", "gpt:3-16-2-8"}) {
    const Sequential m = *BuildModelLayers(model);
    const int n = static_cast<int>(m.size());
    std::vector<double> cost;
    bool first = true;
    for (int i = 0; i < n; ++i) {
      double p = 0;
      for (const Parameter& q : m.layer(static_cast<size_t>(i)).parameters()) p += static_cast<double>(q.value.numel());
      cost.push_back((first && p > 0 ? 2.0 : 3.0) * p + 1.0);
      if (p > 0) first = false;
    }
    for (int stages = 1; stages <= std::min(n, 4); ++stages) {
      CAPTURE(model);
      CAPTURE(stages);
      std::vector<int> best, cur = {0};
      double best_max = std::numeric_limits<double>::infinity();
      std::function<void(int)> all = [&](int start) {  // every split, in lexicographic order
        if (static_cast<int>(cur.size()) == stages) {
          cur.push_back(n);
          double mx = 0;
          for (size_t k = 0; k + 1 < cur.size(); ++k) {
            double c = 0;
            for (int i = cur[k]; i < cur[k + 1]; ++i) c += cost[static_cast<size_t>(i)];
            mx = std::max(mx, c);
          }
          if (mx < best_max) best_max = mx, best = cur;
          cur.pop_back();
          return;
        }
        for (int end = start + 1; end <= n - (stages - static_cast<int>(cur.size())); ++end) {
          cur.push_back(end);
          all(end);
          cur.pop_back();
        }
      };
      all(0);
      auto split = BalancedSplit(model, stages);
      REQUIRE(split.ok());
      CHECK(*split == best);
    }
  }
  auto deep = BalancedSplit("gpt:64-128-4-64", 16);
  REQUIRE(deep.ok());
  CHECK(deep->size() == 17);
  CHECK(deep->back() == 132);
}

// A pipeline stage's backward passes a gradient log, not its accumulated gradients, to the next
// micro-batch (ml/programs/gradient_log.h); the daemon's cached model holds the sum. With the
// model cache off every backward of micro-batch m > 0 rebuilds the sum by replaying the log —

// An epoch's last step may hold fewer images than it has micro-batches (66 images in batches
// of 64: the second step has 2 for 4 micro-batches, or 8 in a hybrid of 2 workers): the empty
// micro-batches pass empty activations and gradients, add nothing, and the job reaches the
// parameters of single-process training with its short last batch, whichever way the
// weight gradients are summed, with the model cache or without it (the replay path).
TEST_CASE("MlGraph.AShortLastStepWithEmptyMicroBatchesMatchesSingleProcessTraining" * doctest::timeout(240)) {
  GraphOptions base = SmallDeep();
  base.limit = 66;
  const NamedTensors reference = SingleProcess(base);
  struct Case {
    std::string kind;
    int stages;
    std::string schedule;
    bool recompute;
    std::string weight_grads;
    std::string env = "";
  };
  for (const Case& c : {Case{"pipeline", 2, "1f1b", false, "batched"}, Case{"pipeline", 2, "gpipe", true, "per-microbatch"},
                        Case{"pipeline", 3, "1f1b", false, "per-microbatch", "COPSE_ML_MODEL_CACHE=off "},
                        Case{"hybrid", 2, "1f1b", false, "batched"}}) {
    CAPTURE(c.kind);
    CAPTURE(c.stages);
    CAPTURE(c.recompute);
    CAPTURE(c.weight_grads);
    CAPTURE(c.env);
    GraphOptions o = PipelineOf(base, c.kind, c.stages, 4, c.schedule, c.recompute, c.weight_grads);
    o.workers = 2;
    auto job = GenerateTrainingGraph(o);
    REQUIRE(job.ok());
    TempDir dir;
    const RunResult r = RunJob(*job, dir.path, 2, 2, c.env);
    CHECK(r.metrics["train_images"] == 66);
    const double rel = RelativeDifference(r.params, reference);
    MESSAGE(c.kind << " P=" << c.stages << " with empty micro-batches: relative difference " << rel);
    CHECK(rel < kTolerance);
  }
}
// the path of a re-run or a cold daemon — and must reach the very same parameters.
TEST_CASE("MlGraph.APipelineWithoutCachedModelsReplaysItsGradientLogsBitIdentically" * doctest::timeout(240)) {
  for (const bool recompute : {false, true}) {
    CAPTURE(recompute);
    GraphOptions base = SmallDeep();
    // Batched weight gradients keep no sum to replay: per micro-batch.
    auto job =
        GenerateTrainingGraph(PipelineOf(base, "pipeline", 2, 4, recompute ? "gpipe" : "1f1b", recompute, "per-microbatch"));
    REQUIRE(job.ok());
    TempDir warm_dir, cold_dir;
    const RunResult warm = RunJob(*job, warm_dir.path, 2);
    const RunResult cold = RunJob(*job, cold_dir.path, 2, 2, "COPSE_ML_MODEL_CACHE=off ");
    CHECK(cold.digest == warm.digest);
    CHECK(cold.metrics["final_loss"] == warm.metrics["final_loss"]);
  }
}

TEST_CASE("MlGraph.ScheduleIsOrderingEdgesBetweenOneStagesVertices") {
  auto seq = ScheduleOrder("1f1b", 0, 2, 4);
  std::string s;
  for (auto [k, m] : seq) s += k + std::to_string(m) + " ";
  CHECK(s == "F0 F1 B0 F2 B1 F3 B2 B3 ");
  seq = ScheduleOrder("gpipe", 1, 2, 2);
  s.clear();
  for (auto [k, m] : seq) s += k + std::to_string(m) + " ";
  CHECK(s == "F0 F1 B0 B1 ");
  GraphOptions o = SmallPipeline();
  o.microbatches = 4;
  auto job = GenerateTrainingGraph(o);
  REQUIRE(job.ok());
  int order_edges = 0;
  for (const auto& e : (*job)["edges"]) {
    if (e["channel"] != "order") continue;
    ++order_edges;
    const std::string from = e["from"], to = e["to"];
    CHECK(from.substr(3, 1) == to.substr(3, 1));  // fwd0/bwd0 -> fwd0/bwd0: one stage
  }
  CHECK(order_edges > 0);
}

TEST_CASE("MlGraph.StepEndStageNamesAStageWithAVertexPerStep") {
  // What copse run's measured step (a planned job's) reads: the stage StepEndStage names has a
  // vertex per step, whatever the layout.
  struct Case {
    std::string kind, reducer, model;
    int tensor_parallel;
  };
  const std::vector<Case> cases = {
      {"pipeline", "tree", "mlp:784-64-32-10", 1},      {"hybrid", "tree", "mlp:784-64-32-10", 1},
      {"data-parallel", "ps", "mlp:784-64-32-10", 1},   {"data-parallel", "tree", "mlp:784-64-32-10", 1},
      {"data-parallel", "ring", "mlp:784-64-32-10", 1}, {"tensor-parallel", "tree", "gpt:1-16-2-8", 2},
      {"pipeline", "tree", "gpt:2-16-2-8", 2}};
  for (const Case& c : cases) {
    GraphOptions o = SmallPipeline();
    o.kind = c.kind;
    o.reducer = c.reducer;
    o.model = c.model;
    o.tensor_parallel = c.tensor_parallel;
    o.workers = 2;
    o.microbatches = 2;
    o.steps = 3;
    if (c.model.rfind("gpt:", 0) == 0) {
      if (!fs::exists("/usr/share/games/fortunes")) continue;  // the generator reads the text's size
      o.data_dir = "/usr/share/games/fortunes";
      o.batch = 8;
    }
    auto job = GenerateTrainingGraph(o);
    REQUIRE_MESSAGE(job.ok(), c.kind, " ", c.reducer, ": ", job.status().message());
    const std::string stage = StepEndStage(c.kind, c.reducer, c.tensor_parallel);
    int64_t replicas = 0;
    for (const auto& st : (*job)["stages"]) {
      if (st["name"] == stage) replicas = st.value("replicas", int64_t{1});
    }
    CHECK_MESSAGE(replicas == 3, c.kind, " ", c.reducer, ": stage ", stage);
  }
}

TEST_CASE("MlGraph.InterleavedScheduleRunsEveryChunkOnceWithoutDeadlockAndShrinksTheBubble") {
  // Megatron-LM's interleaved 1F1B for D daemons of v chunks: replayed with every forward and
  // backward of a chunk taking one unit, each daemon running its ops in the schedule's order
  // as soon as their inputs exist (the forward of the virtual stage before, the backward of the
  // one after), it must finish, and idle (p-1)/(v*m+p-1) of the time: 1F1B's bubble over v.
  for (int D : {2, 3, 4}) {
    for (int v : {2, 3}) {
      for (int M : {D, 2 * D, 4 * D}) {
        CAPTURE(D);
        CAPTURE(v);
        CAPTURE(M);
        const int P = D * v;
        std::vector<std::vector<ChunkOp>> order;
        for (int d = 0; d < D; ++d) {
          order.push_back(InterleavedOrder(d, D, v, M));
          std::set<std::tuple<char, int, int>> seen;
          for (const ChunkOp& op : order.back()) seen.insert({op.kind, op.chunk, op.microbatch});
          CHECK(order.back().size() == static_cast<size_t>(2 * v * M));
          CHECK(seen.size() == static_cast<size_t>(2 * v * M));  // each op once
        }
        // Replay: done[kind][virtual stage][micro-batch] = the time it ended (-1: not yet).
        std::map<std::tuple<char, int, int>, int> ended;
        std::vector<size_t> next(static_cast<size_t>(D), 0);
        std::vector<int> free_at(static_cast<size_t>(D), 0);
        auto ready_at = [&](char kind, int s, int m) -> int {  // -1: an input is missing
          int at = 0;
          auto need = [&](char k, int vs) {
            auto it = ended.find({k, vs, m});
            if (it == ended.end()) return false;
            at = std::max(at, it->second);
            return true;
          };
          if (kind == 'F' && s > 0 && !need('F', s - 1)) return -1;
          if (kind == 'B' && !need('F', s)) return -1;
          if (kind == 'B' && s + 1 < P && !need('B', s + 1)) return -1;
          return at;
        };
        for (bool progress = true; progress;) {
          progress = false;
          for (int d = 0; d < D; ++d) {
            if (next[d] == order[d].size()) continue;
            const ChunkOp& op = order[d][next[d]];
            const int s = op.chunk * D + d;
            const int at = ready_at(op.kind, s, op.microbatch);
            if (at < 0) continue;
            free_at[d] = std::max(free_at[d], at) + 1;
            ended[{op.kind, s, op.microbatch}] = free_at[d];
            ++next[d];
            progress = true;
          }
        }
        for (int d = 0; d < D; ++d) REQUIRE_MESSAGE(next[d] == order[d].size(), "daemon " << d << " deadlocked");
        const int makespan = *std::max_element(free_at.begin(), free_at.end());
        const double bubble = 1.0 - 2.0 * v * M / makespan;  // every daemon is busy 2vM units
        CHECK(bubble == doctest::Approx(TheoreticalBubble(D, M, v)));
      }
    }
  }
  // In a job: 2 daemons of 2 chunks, virtual stage s on daemon s mod 2; the order edges chain
  // one daemon's vertices across its chunks.
  GraphOptions o = SmallPipeline();
  o.model = "mlp:784-64-32-10";
  o.microbatches = 4;
  o.schedule = "interleaved";
  auto job = GenerateTrainingGraph(o);
  REQUIRE(job.ok());
  std::map<std::string, std::string> group;
  for (const auto& st : (*job)["stages"]) group[st["name"]] = st.value("affinity", "");
  CHECK(group["init0"] == "stage0");
  CHECK(group["init2"] == "stage0");
  CHECK(group["init3"] == "stage1");
  int across_chunks = 0;
  for (const auto& e : (*job)["edges"]) {
    if (e["channel"] != "order") continue;
    const std::string from = e["from"], to = e["to"];
    const int a = from[3] - '0', b = to[3] - '0';
    CHECK(a % 2 == b % 2);  // one daemon's
    across_chunks += a != b;
  }
  CHECK(across_chunks > 0);
  o.microbatches = 3;
  CHECK(GenerateTrainingGraph(o).status().message().find("--microbatches") != std::string::npos);
}

/// params.weight_grads of each stage's backward vertices, by stage index; its update must say
/// the same (it computes the batched weight gradients).
std::map<int, std::string> WeightGradsByStage(const Json& job) {
  std::map<int, std::string> out;
  for (const auto& st : job["stages"]) {
    if (st["program"] != "ml.backward") continue;
    out[st["params"]["stage"].get<int>()] = st["params"]["weight_grads"].get<std::string>();
  }
  for (const auto& st : job["stages"]) {
    if (st["program"] != "ml.update") continue;
    const std::string name = st["name"];
    CHECK(st["params"]["weight_grads"] == out[std::stoi(name.substr(3))]);
  }
  return out;
}

TEST_CASE("MlGraph.WeightGradientsAreBatchedWhereAStageAllowsIt") {
  GraphOptions o = SmallPipeline();
  auto job = GenerateTrainingGraph(o);
  REQUIRE(job.ok());
  CHECK(WeightGradsByStage(*job) == std::map<int, std::string>{{0, "batched"}, {1, "batched"}});
  o.weight_grads = "per-microbatch";
  job = GenerateTrainingGraph(o);
  REQUIRE(job.ok());
  CHECK(WeightGradsByStage(*job) == std::map<int, std::string>{{0, "per-microbatch"}, {1, "per-microbatch"}});
  o.weight_grads = "batched";
  o.recompute = true;  // the update would need the activations it did not keep
  job = GenerateTrainingGraph(o);
  REQUIRE(job.ok());
  CHECK(WeightGradsByStage(*job) == std::map<int, std::string>{{0, "per-microbatch"}, {1, "per-microbatch"}});
  o.recompute = false;
  o.model = "cnn";  // stage 0's convolutions accumulate per micro-batch; stage 1 is Linear only
  job = GenerateTrainingGraph(o);
  REQUIRE_MESSAGE(job.ok(), job.status().ToString());
  CHECK(WeightGradsByStage(*job) == std::map<int, std::string>{{0, "per-microbatch"}, {1, "batched"}});
  o.weight_grads = "later";
  CHECK(GenerateTrainingGraph(o).status().message().find("--weight-grads") != std::string::npos);
}

/// resources.cpus of the generated stage named `name`.
double CpusOf(const Json& job, const std::string& name) {
  for (const auto& st : job["stages"]) {
    if (st["name"] == name) return st["resources"]["cpus"].get<double>();
  }
  FAIL("no stage " << name);
  return 0;
}

TEST_CASE("MlGraph.PipelineUpdatesRunOnTheVertexThreadsAndDataParallelOnesOnTheWholeDaemon") {
  GraphOptions o = SmallPipeline();
  o.daemon_cpus = 4;
  auto job = GenerateTrainingGraph(o);
  REQUIRE(job.ok());
  CHECK(CpusOf(*job, "upd0") == 1);
  CHECK(CpusOf(*job, "upd1") == 1);
  CHECK(CpusOf(*job, "init0") == 4);  // a stage still starts on a daemon of its own
  o.threads = 2;
  job = GenerateTrainingGraph(o);
  REQUIRE(job.ok());
  CHECK(CpusOf(*job, "upd1") == 2);
  CHECK(CpusOf(*job, "fwd1") == 2);
  o.kind = "data-parallel";
  o.workers = 2;
  o.threads = 1;
  job = GenerateTrainingGraph(o);
  REQUIRE(job.ok());
  CHECK(CpusOf(*job, "update") == 4);
}

TEST_CASE("MlGraph.AnUnknownWeightGradsValueIsAnErrorNamingTheVertex") {
  vertex::ProgramRegistry registry;
  RegisterMlPrograms(registry);
  for (const char* program : {"ml.backward", "ml.update"}) {
    CAPTURE(program);
    auto prog = registry.Create(program);
    REQUIRE(prog.ok());
    Json params = {{"weight_grads", "batch"}};
    vertex::VertexContext ctx;
    ctx.name = "v[3]";
    ctx.params = &params;
    const Status st = (*prog)->Run(ctx);
    CHECK(st.code() == StatusCode::kInvalidArgument);
    CHECK(st.message() == "v[3]: params.weight_grads is \"batch\"; expected \"batched\" or \"per-microbatch\"");
  }
}

TEST_CASE("MlGraph.Fp16StagesWithoutAStepCheckAreRefused") {
  // A hand-written pipeline job whose stages would each decide alone to skip an overflowed
  // step: their loss scales would drift apart and the gradients be off by their ratio.
  vertex::ProgramRegistry registry;
  RegisterMlPrograms(registry);
  const Json common = {
      {"precision", "fp16"}, {"model", "mlp:784-64-32-10"}, {"limit", 64}, {"batch", 64}, {"begin", 2}, {"end", 4}, {"stages", 2},
      {"stage", 1}};
  for (const char* program : {"ml.backward", "ml.update"}) {
    CAPTURE(program);
    auto prog = registry.Create(program);
    REQUIRE(prog.ok());
    Json params = common;
    vertex::VertexContext ctx;
    ctx.name = "v[3]";
    ctx.params = &params;
    const Status st = (*prog)->Run(ctx);
    CHECK(st.code() == StatusCode::kInvalidArgument);
    CHECK_MESSAGE(st.message().find(std::string(program) == "ml.backward" ? "needs params.step_check"
                                                                          : "needs params.step_checks") != std::string::npos,
                  st.message());
  }
}

TEST_CASE("MlGraph.PartitionParamsOutOfRangeAreErrorsNotCrashes") {
  // Divisors and indices the programs use: zero divided the daemon by zero (SIGFPE), an
  // out-of-range worker read past an array, a batch smaller than its micro-batches left one
  // empty (a segfault).
  vertex::ProgramRegistry registry;
  RegisterMlPrograms(registry);
  const std::vector<std::pair<Json, std::string>> cases = {
      {{{"microbatches", 0}}, "params.microbatches must be 1 to 4096"},
      {{{"workers", 0}}, "params.workers must be 1 to 4096"},
      {{{"workers", 2}, {"worker", 9}}, "params.worker 9 is not one of its 2 workers"},
      {{{"stages", 2}, {"stage", 9}}, "params.stage 9 is not one of its 2 stages"},
      {{{"batch", std::numeric_limits<int64_t>::max()}}, "params.batch must be 1 to 16777216"},
      {{{"batch", 4}, {"microbatches", 8}}, "params.batch 4 leaves some of its 8 workers x micro-batches without an image"},
  };
  for (const char* program : {"ml.load", "ml.grad", "ml.forward", "ml.backward", "ml.update", "ml.ring_reduce"}) {
    for (const auto& [bad, message] : cases) {
      CAPTURE(program);
      CAPTURE(bad.dump());
      const bool ring = std::string(program) == "ml.ring_reduce";  // checks workers itself, and reads no batch
      if (ring && (bad.value("workers", 2) < 2 || message.find("batch") != std::string::npos)) continue;
      auto prog = registry.Create(program);
      REQUIRE(prog.ok());
      Json params = bad;
      if (ring && !params.contains("workers")) params["workers"] = 2;
      vertex::VertexContext ctx;
      ctx.name = "v[3]";
      ctx.params = &params;
      const Status st = (*prog)->Run(ctx);
      CHECK(st.code() == StatusCode::kInvalidArgument);
      CHECK_MESSAGE(st.message() == "v[3]: " + message, st.message());
    }
  }
  GraphOptions g = SmallPipeline();
  g.batch = 4;
  g.microbatches = 8;
  auto job = GenerateTrainingGraph(g);
  REQUIRE_FALSE(job.ok());
  CHECK(job.status().message() == "--batch: expected >= 8 (an image for each of the 8 workers x micro-batches)");
  // A million epochs of one-image steps: 6e10 steps, once counted one by one before writing.
  GraphOptions endless;
  endless.kind = "data-parallel";
  endless.workers = 1;
  endless.epochs = 1'000'000;
  endless.batch = 1;
  auto huge = GenerateTrainingGraph(endless);
  REQUIRE_FALSE(huge.ok());
  CHECK_MESSAGE(huge.status().message().find("--epochs/--steps: 60000000000 steps of up to 12 vertices each exceed") == 0,
                huge.status().message());
}

/// A 2-stage pipeline `job` run clean and with stage 1's daemon killed once step 6 of 8 (whose
/// micro-batch 0 is fwd1[20] at M = 4) is placed, on 3 daemons; the killed run's result is
/// checked bit-identical to the clean one's.
RunResult RunWithStageOneKilled(const Json& job, const fs::path& clean_dir, const fs::path& fault_dir) {
  const RunResult clean = RunJob(job, clean_dir, 3);
  Json faulty = job;
  faulty["faults"] = Json::array({{{"kill_daemon_of", "fwd1[20]"}, {"when", {{"completed", 70}}}}});
  const RunResult r = RunJob(faulty, fault_dir, 3);
  REQUIRE(r.summary["faults"].size() == 1);
  CHECK(r.digest == clean.digest);
  CHECK(r.metrics["test_accuracy"] == clean.metrics["test_accuracy"]);
  return r;
}

TEST_CASE("MlGraph.PipelineWithADaemonKilledMidEpochIsBitIdentical" * doctest::timeout(240)) {
  GraphOptions o = SmallDeep();
  o.kind = "pipeline";
  o.stages = 2;
  o.microbatches = 4;
  o.schedule = "1f1b";
  o.checkpoint_every = 4;
  auto job = GenerateTrainingGraph(o);
  REQUIRE(job.ok());
  TempDir clean_dir, fault_dir;
  // Step 4's update, a checkpoint, has completed when stage 1's daemon is killed in step 6.
  const RunResult r = RunWithStageOneKilled(*job, clean_dir.path, fault_dir.path);
  REQUIRE(r.summary["recoveries"].size() > 0);
  // Only the lost stage's work re-runs: stage 0's retained outputs feed stage 1's recovery. A
  // stage-0 vertex may retry only as a dependent that had not completed — one reading stage 1's
  // dL/dx when the daemon died (input_lost), or one chained after a stage-1 vertex whose daemon
  // it found gone (cancelled: withdrawn before it started) — never to regenerate completed
  // stage-0 work (output_lost).
  INFO("every recovery: " << r.summary["recoveries"].dump());  // printed only on a failure
  for (const auto& rec : r.summary["recoveries"]) {
    std::string v = rec["vertex"];
    const bool stage0 = v.find('0') == 3 || v.rfind("init0", 0) == 0;  // fwd0, bwd0, upd0, init0
    const bool as_dependent = rec["reason"] == "input_lost" || rec["reason"] == "cancelled";
    CHECK_MESSAGE((!stage0 || as_dependent), "stage-0 work was re-run: " << rec.dump());
    // Stage 1 resumes from its checkpoint after step 4 (upd1[3], a durable channel): nothing of
    // steps 1-4 re-runs, nor init1.
    if (v.rfind("init1", 0) == 0) FAIL_CHECK("stage 1 re-ran from init: " << rec.dump());
    const size_t open = v.find('[');
    if (open == std::string::npos) continue;
    const int replica = std::stoi(v.substr(open + 1));
    const std::string stage = v.substr(0, open);
    if (stage == "upd1") CHECK_MESSAGE(replica >= 4, "re-ran before the checkpoint: " << rec.dump());
    if (stage == "fwd1" || stage == "bwd1") CHECK_MESSAGE(replica >= 16, "re-ran before the checkpoint: " << rec.dump());
  }
  // The checkpoint files are the chains' copies; the job's durable copies are gone at its end.
  CHECK(std::filesystem::exists(fault_dir.path / "checkpoints" / "ckpt1-0.bin"));
  CHECK(!std::filesystem::exists(fault_dir.path / "checkpoints" / "durable"));
}

// --mirror-every 1: every step's update chain is copied into a second daemon's memory. Killing stage
// 1's daemon in step 6 of 8 re-runs at most its last two steps (the copy of step 5's update
// may not be whole yet when the kill comes right after it; step 4's then serves), never from
// init, and the result is bit-identical.
TEST_CASE("MlGraph.APipelineStageKilledResumesFromItsMirrorBitIdentically" * doctest::timeout(240)) {
  GraphOptions o = PipelineOf(SmallDeep(), "pipeline", 2, 4, "1f1b", false, "batched");
  o.mirror_every = 1;
  auto job = GenerateTrainingGraph(o);
  REQUIRE(job.ok());
  size_t mirrored = 0;
  for (const Json& e : (*job)["edges"]) mirrored += e["channel"] == "mirrored";
  CHECK(mirrored > 0);
  TempDir clean_dir, fault_dir;
  const RunResult r = RunWithStageOneKilled(*job, clean_dir.path, fault_dir.path);
  CHECK(r.summary["mirrors_used"].get<int>() >= 1);
  INFO("every recovery: " << r.summary["recoveries"].dump());
  for (const auto& rec : r.summary["recoveries"]) {
    const std::string v = rec["vertex"];
    CHECK_MESSAGE(v.rfind("init", 0) != 0, "re-ran from init: " << rec.dump());
    const size_t open = v.find('[');
    REQUIRE(open != std::string::npos);
    const int replica = std::stoi(v.substr(open + 1));
    const std::string stage = v.substr(0, open);
    if (stage.rfind("upd", 0) == 0) CHECK_MESSAGE(replica >= 4, "re-ran an update before step 5: " << rec.dump());
    if (stage.rfind("fwd", 0) == 0 || stage.rfind("bwd", 0) == 0)
      CHECK_MESSAGE(replica >= 16, "re-ran a micro-batch before step 5: " << rec.dump());
  }
  GraphOptions dp = Small();
  dp.mirror_every = 1;
  CHECK(GenerateTrainingGraph(dp).status().message() ==
        "--mirror-every: expected 0 for data-parallel jobs (pipeline and hybrid only)");
}

TEST_CASE("MlGraph.StaleDataParallelComputesOnOlderParametersAndRecoversBitIdentically" * doctest::timeout(240)) {
  GraphOptions o = Small();
  o.kind = "data-parallel";
  o.workers = 2;
  o.reducer = "ps";
  o.staleness = 1;
  auto job = GenerateTrainingGraph(o);
  REQUIRE(job.ok());
  // Step t's gradients read the parameters of step t - 1: init's for steps 0 and 1, then the
  // output of update t - 2.
  std::map<std::string, std::string> params_of;
  for (const auto& e : (*job)["edges"]) {
    if (e["to_port"] == 0 && e["to"].get<std::string>().rfind("grad", 0) == 0) params_of[e["to"]] = e["from"];
  }
  CHECK(params_of["grad0[0]"] == "init");
  CHECK(params_of["grad1[1]"] == "init");
  CHECK(params_of["grad0[2]"] == "ps[0]");
  CHECK(params_of["grad1[7]"] == "ps[5]");
  TempDir clean_dir, fault_dir, sync_dir;
  const RunResult clean = RunJob(*job, clean_dir.path, 2);
  CHECK(clean.metrics["test_accuracy"].get<double>() > 0.2);
  // A daemon killed mid-run: every step's inputs are fixed by the graph, so the re-run steps
  // compute the same bits.
  Json faulty = *job;
  faulty["faults"] = Json::array({{{"kill_daemon_of", "grad1[4]"}, {"when", {{"completed", 12}}}}});
  const RunResult r = RunJob(faulty, fault_dir.path, 3);
  REQUIRE(r.summary["faults"].size() == 1);
  REQUIRE(r.summary["recoveries"].size() > 0);
  CHECK(r.digest == clean.digest);
  // And staleness is real: the synchronous job ends elsewhere.
  o.staleness = 0;
  auto sync = GenerateTrainingGraph(o);
  REQUIRE(sync.ok());
  CHECK(RunJob(*sync, sync_dir.path, 2).digest != clean.digest);
  // Only data-parallel jobs, and not under fp16, whose loss scale the stale gradients would not share.
  GraphOptions p = SmallPipeline();
  p.staleness = 1;
  CHECK(GenerateTrainingGraph(p).status().message().find("--staleness") != std::string::npos);
  o.staleness = 1;
  o.precision = "fp16";
  CHECK(GenerateTrainingGraph(o).status().message().find("--staleness") != std::string::npos);
}

TEST_CASE("MlGraph.InterleavedPipelineWithADaemonKilledIsBitIdentical" * doctest::timeout(240)) {
  // Two daemons of two chunks each, 3 daemons in the cluster: the daemon holding chunks 1 and
  // 3 (virtual stages of daemon 1) dies mid-run; both of its chunks' histories re-run on the
  // spare daemon and the parameters come out the same.
  GraphOptions o = SmallDeep();
  o.kind = "pipeline";
  o.stages = 2;
  o.microbatches = 4;
  o.schedule = "interleaved";
  auto job = GenerateTrainingGraph(o);
  REQUIRE(job.ok());
  TempDir clean_dir, fault_dir;
  const RunResult clean = RunJob(*job, clean_dir.path, 3);
  Json faulty = *job;
  faulty["faults"] = Json::array({{{"kill_daemon_of", "fwd3[20]"}, {"when", {{"completed", 100}}}}});
  const RunResult r = RunJob(faulty, fault_dir.path, 3);
  REQUIRE(r.summary["faults"].size() == 1);
  REQUIRE(r.summary["recoveries"].size() > 0);
  CHECK(r.digest == clean.digest);
}

TEST_CASE("MlGraph.DeviceCudaPutsEveryComputeVertexOnAGpu") {
  for (GraphOptions o : {Small(), SmallPipeline()}) {
    o.device = "cuda";
    CAPTURE(o.kind);
    auto job = GenerateTrainingGraph(o);
    REQUIRE(job.ok());
    const std::set<std::string> compute = {"ml.grad", "ml.reduce", "ml.update", "ml.forward", "ml.backward"};
    int on_gpu = 0;
    for (const Json& st : (*job)["stages"]) {
      CAPTURE(st["name"]);
      const bool gpu = compute.count(st["program"].get<std::string>()) > 0;
      CHECK(st["resources"].value("gpus", 0) == (gpu ? 1 : 0));
      CHECK(st["params"].value("device", "cpu") == (gpu ? "cuda" : "cpu"));  // init and eval stay on the CPU
      // An estimate from the model (GpuMemoryModel in graph_gen.cc): above the CUDA context's
      // 512 MB, far below a GPU's memory for this small MLP.
      if (gpu) CHECK(st["resources"]["gpu_memory_mb"].get<int64_t>() > 512);
      if (gpu) CHECK(st["resources"]["gpu_memory_mb"].get<int64_t>() < 1024);
      if (!gpu) CHECK_FALSE(st["resources"].contains("gpu_memory_mb"));
      on_gpu += gpu;
    }
    CHECK(on_gpu == (o.kind == "pipeline" ? 6 : 4));
    CHECK((*job)["stages"].back()["params"]["config"]["device"] == "cuda");
  }
  GraphOptions cpu = Small();
  auto job = GenerateTrainingGraph(cpu);
  REQUIRE(job.ok());
  for (const Json& st : (*job)["stages"]) CHECK_FALSE(st["resources"].contains("gpus"));

  GraphOptions bad = Small();
  bad.device = "tpu";
  CHECK(GenerateTrainingGraph(bad).status().message() == "--device: expected cpu or cuda");
  GraphOptions tp;
  tp.kind = "tensor-parallel";
  tp.model = "gpt:1-16-2-8";
  tp.tensor_parallel = 2;
  tp.device = "cuda";
  auto tp_job = GenerateTrainingGraph(tp);
  REQUIRE(tp_job.ok());
  for (const Json& st : (*tp_job)["stages"]) {  // the members compute on a GPU each; init and eval on the CPU
    CAPTURE(st["name"]);
    const bool member = st["program"] == "ml.tp_step";
    CHECK(st["resources"].value("gpus", 0) == (member ? 1 : 0));
    CHECK((st["params"].value("device", "cpu") == "cuda") == member);
  }
}

TEST_CASE("MlGraph.AVertexOnCudaWithoutAGpuIsAnErrorNamingIt") {
  vertex::ProgramRegistry registry;
  RegisterMlPrograms(registry);
  struct Case {
    Json params;
    int gpu;
    std::string message;
  };
  const std::vector<Case> cases = {
      {{{"device", "cuda"}}, -1, "v[3]: params.device is cuda but the vertex holds no GPU (give its stage resources.gpus 1)"},
      {{{"device", "tpu"}}, -1, "v[3]: params.device is \"tpu\"; expected cpu or cuda"},
      {{{"device", 3}}, -1, "v[3]: bad ML params: "},
  };
  for (const char* program : {"ml.grad", "ml.forward", "ml.backward", "ml.update", "ml.reduce"}) {
    for (const auto& c : cases) {
      CAPTURE(program);
      CAPTURE(c.params.dump());
      auto prog = registry.Create(program);
      REQUIRE(prog.ok());
      Json params = c.params;
      vertex::VertexContext ctx;
      ctx.name = "v[3]";
      ctx.params = &params;
      ctx.gpu = c.gpu;
      const Status st = (*prog)->Run(ctx);
      CHECK(st.code() == StatusCode::kInvalidArgument);
      CHECK_MESSAGE(st.message().rfind(c.message, 0) == 0, st.message());
    }
  }
  if (CudaDeviceCount() == 0) {  // a GPU granted on a host without one
    auto prog = registry.Create("ml.grad");
    Json params = {{"device", "cuda"}};
    vertex::VertexContext ctx;
    ctx.name = "v[3]";
    ctx.params = &params;
    ctx.gpu = 0;
    const Status st = (*prog)->Run(ctx);
    CHECK_MESSAGE(st.message().rfind("v[3]: params.device cuda (GPU 0): ", 0) == 0, st.message());
  }
}

}  // namespace
}  // namespace copse::ml
