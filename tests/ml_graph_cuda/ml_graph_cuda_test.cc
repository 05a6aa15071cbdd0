// Training graphs on a GPU (copse graph --device cuda): every compute vertex of a data-parallel
// and a pipeline graph of the MLP computes on the one GPU of a one-daemon local cluster (`copse
// run --gpus 1`), and the parameters they reach match the CPU's single process.
//
// Tolerance: cuBLAS sums each product in another order than OpenBLAS/oneDNN (TF32 stays off), a
// few ulps per gradient element, which SGD with momentum carries through the 8 steps. 2e-4 of
// the largest parameter is ten times the CPU graphs' allowance (ml_graph_test.cc) and still far
// below what a real error (a lost micro-batch, a stale parameter version: >= 1e-3 after one
// step) moves. bfloat16 rounds the products' operands identically on both devices, so the bf16
// graph is held to a tenth of what bf16 itself changes against float32.
#include <doctest/doctest.h>

#include <fstream>

#include "tests/ml_graph/graph_run.h"

namespace copse::ml {
namespace {

using namespace graph_test;

constexpr double kGpuTolerance = 2e-4;

RunResult RunOnTheGpu(const GraphOptions& o) {
  auto job = GenerateTrainingGraph(o);
  REQUIRE(job.ok());
  TempDir dir;
  return RunJob(*job, dir.path, /*daemons=*/1, /*cpus=*/4, "", " --gpus 1");
}

TEST_CASE("MlGraphCuda.DataParallelAndPipelineGraphsOnTheGpuMatchTheCpu" * doctest::timeout(400)) {
  GraphOptions base = SmallDeep();
  base.device = "cuda";
  const NamedTensors cpu = SingleProcess(base);
  const double gpu_process = RelativeDifference(SingleProcess(base, "cuda"), cpu);
  MESSAGE("single process, GPU against CPU: relative difference " << gpu_process);
  CHECK(gpu_process < kGpuTolerance);

  GraphOptions dp = base;
  dp.kind = "data-parallel";
  dp.workers = 2;
  const RunResult dp_run = RunOnTheGpu(dp);
  const double dp_rel = RelativeDifference(dp_run.params, cpu);
  MESSAGE("data-parallel 2 on the GPU against the CPU single process: relative difference " << dp_rel);
  CHECK(dp_rel < kGpuTolerance);

  for (const std::string schedule : {"1f1b", "gpipe"}) {
    const RunResult p = RunOnTheGpu(PipelineOf(base, "pipeline", 2, 4, schedule, false, "batched"));
    const double rel = RelativeDifference(p.params, cpu);
    MESSAGE("pipeline 2 " << schedule << " M=4 on the GPU against the CPU single process: relative difference " << rel);
    CHECK(rel < kGpuTolerance);
  }
  // Per-micro-batch weight gradients accumulate in the cached model on the device.
  const RunResult per_micro = RunOnTheGpu(PipelineOf(base, "pipeline", 2, 4, "1f1b", false, "per-microbatch"));
  CHECK(RelativeDifference(per_micro.params, cpu) < kGpuTolerance);
}

TEST_CASE("MlGraphCuda.AStageLargerThanTheGpuIsRefusedBeforeItRuns" * doctest::timeout(120)) {
  // The daemon measures its GPU's memory; a stage asking more is refused at submission.
  GraphOptions o = Small();
  o.device = "cuda";
  auto job = GenerateTrainingGraph(o);
  REQUIRE(job.ok());
  for (Json& st : (*job)["stages"])
    if (st["resources"].contains("gpu_memory_mb")) st["resources"]["gpu_memory_mb"] = 10'000'000;
  TempDir dir;
  const fs::path file = dir.path / "job.json";
  { std::ofstream(file) << job->dump(1); }
  const std::string cmd = "timeout 90 " + Copse() + " run " + file.string() + " --daemons 1 --gpus 1 --cpus 4 --output " +
                          (dir.path / "out").string() + " 2>&1";
  int rc = 0;
  const std::string text = Output(cmd, &rc);
  MESSAGE(text);
  CHECK(rc != 0);
  CHECK(text.find("stage grad0 needs 10000000 MB of memory on each of its 1 GPU(s)") != std::string::npos);
  CHECK(text.find("MB (daemon d0)") != std::string::npos);
}

TEST_CASE("MlGraphCuda.Bf16GraphsOnTheGpuMatchTheCpuBf16" * doctest::timeout(300)) {
  GraphOptions fp32 = SmallDeep();
  GraphOptions bf16 = fp32;
  bf16.precision = "bf16";
  const NamedTensors reference = SingleProcess(bf16);
  const double bf16_vs_fp32 = RelativeDifference(reference, SingleProcess(fp32));
  bf16.device = "cuda";
  const RunResult dp = RunOnTheGpu([&] {
    GraphOptions o = bf16;
    o.kind = "data-parallel";
    return o;
  }());
  const RunResult pipe = RunOnTheGpu(PipelineOf(bf16, "pipeline", 2, 4, "1f1b", false, "batched"));
  const double dp_rel = RelativeDifference(dp.params, reference), pipe_rel = RelativeDifference(pipe.params, reference);
  MESSAGE("bf16 on the GPU against the CPU's bf16 single process: data-parallel "
          << dp_rel << ", pipeline " << pipe_rel << " (bf16 against fp32: " << bf16_vs_fp32 << ")");
  CHECK(dp_rel < 0.1 * bf16_vs_fp32);
  CHECK(pipe_rel < 0.1 * bf16_vs_fp32);
}

TEST_CASE("MlGraphCuda.Fp16DataParallelOnTheGpuMatchesTheCpuFp16" * doctest::timeout(300)) {
  // cuBLAS's float16 products on the tensor cores, with dynamic loss scaling.
  GraphOptions fp16 = SmallDeep();
  fp16.precision = "fp16";
  const NamedTensors reference = SingleProcess(fp16);
  const double gpu_process = RelativeDifference(SingleProcess(fp16, "cuda"), reference);
  fp16.device = "cuda";
  fp16.kind = "data-parallel";
  const RunResult dp = RunOnTheGpu(fp16);
  const double dp_rel = RelativeDifference(dp.params, reference);
  MESSAGE("fp16 against the CPU's fp16 single process: GPU single process " << gpu_process << ", data-parallel 2 on the GPU "
                                                                            << dp_rel);
  CHECK(gpu_process < kGpuTolerance);
  CHECK(dp_rel < kGpuTolerance);
  // A pipeline's stages on the GPU skip overflowed steps together, as the CPU's single process
  // does: a loss scale of 1.5 x 2^24 to begin with overflows the first three steps (the largest
  // scaled dL/dlogits then 1.7x float16's largest; after them 0.7x: no step near the edge).
  GraphOptions pipe = PipelineOf(fp16, "pipeline", 2, 4, "1f1b", false, "batched");
  pipe.init_loss_scale = 25165824;
  auto single = Train(SingleProcessOptions(pipe));
  REQUIRE(single.ok());
  const RunResult p = RunOnTheGpu(pipe);
  const double pipe_rel = RelativeDifference(p.params, single->final_parameters);
  MESSAGE("fp16 pipeline 2 on the GPU against the CPU's fp16 single process, "
          << single->skipped_steps << " steps skipped: relative difference " << pipe_rel);
  CHECK(single->skipped_steps > 0);
  CHECK(pipe_rel < kGpuTolerance);
  CHECK(p.summary["progress"]["loss_scale"].get<double>() == single->loss_scale);
}

TEST_CASE("MlGraphCuda.ATensorParallelMemberOnTheGpuMatchesTheCpu" * doctest::timeout(300)) {
  // A gang of two members sharing one daemon (shm): member 0 computes on the GPU, member 1 on
  // the CPU (a lent machine has one GPU, and a daemon leases a GPU to one vertex at a time).
  // Their all-reduces carry partials across devices through host memory.
  if (!fs::exists("/usr/share/games/fortunes")) {
    MESSAGE("skipped: no /usr/share/games/fortunes (Debian package fortunes)");
    return;
  }
  GraphOptions o = Small();
  o.model = "gpt:2-32-4-16";
  o.limit = 256;
  o.test_limit = 64;
  o.batch = 32;
  const NamedTensors cpu = SingleProcess(o);
  o.kind = "tensor-parallel";
  o.tensor_parallel = 2;
  o.device = "cuda";
  auto job = GenerateTrainingGraph(o);
  REQUIRE(job.ok());
  for (Json& st : (*job)["stages"]) {
    if (st["name"] != "tp1") continue;
    st["resources"].erase("gpus");
    st["resources"].erase("gpu_memory_mb");
    st["params"]["device"] = "cpu";
  }
  TempDir dir;
  const RunResult r = RunJob(*job, dir.path, /*daemons=*/1, /*cpus=*/4, "", " --gpus 1");
  const double rel = RelativeDifference(r.params, cpu);
  MESSAGE("gpt tensor-parallel 2, member 0 on the GPU, against the CPU single process: relative difference " << rel);
  CHECK(rel < kGpuTolerance);
}

}  // namespace
}  // namespace copse::ml
