// Training as graphs vs single-process training vs PyTorch (docs/ml-graphs.md).
//
//   cmake --build build --target copse ml_graph_bench && ./build/bench/ml_graph_bench
//
// Prints in one run: images/s of single-process copse (`copse train`), data-parallel 2
// (tree and ps reducers), pipeline 2 with GPipe and 1F1B at M = 4, 8, 16, and PyTorch CPU on
// the same images; test accuracy of each; the measured pipeline bubble vs the theoretical
// (p-1)/(m+p-1); and the share of wall time the scheduler adds on the critical path. Then
// recovery: pipeline 2 1F1B M=8 on 3 daemons with stage 1's daemon killed at 3/4 of the run,
// without checkpoints, with `--checkpoint-every 10` (a durable chain every 10 steps): the
// run's images/s, vertices re-run, and whether its parameters equal its fault-free twin's; and
// the fault-free twin's largest process's peak RSS (a daemon's: the retained cross-stage
// tensors, which checkpoints let the job manager release, are most of what grows); and with
// `--mirror-every 1` and `5` (a step's chain copied into another daemon's memory). `--recovery-only` runs
// only that part.
//
// Every graph runs with `copse run --daemons 2` (real processes on loopback); 1F1B M=8 runs
// again with per-micro-batch weight gradients (`--weight-grads per-microbatch`, the pipelines
// otherwise batch them), and DP-2 ps and 1F1B M=8 with `--no-local-socket` (cross-daemon fetches over TCP, not the same-host
// local socket), so the fast path's share shows in one run. Vertex timings
// come from the ML programs' own spans ($COPSE_ML_TRACE, wall clock). Bubble of stage s in
// step t: 1 - (busy time of s's forward/backward vertices of t) / (span of step t, first
// forward start to last backward end over all stages); averaged over stages and steps (the
// first step excluded: warm-up); next to it, the same measure on the run replayed with every
// vertex starting once its stage's previous vertex and its cross-stage predecessor ended
// (ml::WithoutGaps: the bubble the stages' unequal costs leave). Critical path: from the last
// update back through the predecessor (data or order edge) that finished last; the
// scheduler's share is the sum of the gaps between a vertex's start and its critical
// predecessor's end, over the path's span.
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "ml/cpu_device.h"
#include "ml/dataset.h"
#include "ml/graph_gen.h"
#include "ml/pipeline_bubble.h"

namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;

std::string Run(const std::string& cmd, int* rc = nullptr) {
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return "";
  std::string out;
  std::array<char, 4096> buf;
  while (size_t n = fread(buf.data(), 1, buf.size(), p)) out.append(buf.data(), n);
  const int r = pclose(p);
  if (rc) *rc = r;
  return out;
}

/// Run in a forked helper, whose RUSAGE_CHILDREN then covers that command's processes alone:
/// also returns the largest resident set (MiB) any of them reached (`copse run` waits for its
/// daemons, so theirs counts).
std::string RunMeasuringPeakRss(const std::string& cmd, int* rc, double* peak_mib) {
  int fds[2];
  if (::pipe(fds) != 0) return Run(cmd, rc);
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::close(fds[0]);
    int r = 0;
    const std::string out = Run(cmd, &r);
    rusage u{};
    ::getrusage(RUSAGE_CHILDREN, &u);
    const int64_t head[3] = {r, u.ru_maxrss, static_cast<int64_t>(out.size())};
    std::string msg(reinterpret_cast<const char*>(head), sizeof head);
    msg += out;
    for (size_t at = 0; at < msg.size();) {
      const ssize_t n = ::write(fds[1], msg.data() + at, msg.size() - at);
      if (n <= 0) break;
      at += static_cast<size_t>(n);
    }
    ::_exit(0);
  }
  ::close(fds[1]);
  std::string msg;
  std::array<char, 4096> buf;
  for (ssize_t n; (n = ::read(fds[0], buf.data(), buf.size())) > 0;) msg.append(buf.data(), static_cast<size_t>(n));
  ::close(fds[0]);
  if (pid > 0) ::waitpid(pid, nullptr, 0);
  int64_t head[3] = {-1, 0, 0};
  if (msg.size() >= sizeof head) std::memcpy(head, msg.data(), sizeof head);
  if (rc) *rc = static_cast<int>(head[0]);
  if (peak_mib) *peak_mib = static_cast<double>(head[1]) / 1024.0;  // ru_maxrss is in KiB
  return msg.size() > sizeof head ? msg.substr(sizeof head) : std::string();
}

std::string Copse() { return std::string(COPSE_BINARY_DIR) + "/cli/copse"; }

std::string Python() { return fs::exists("/usr/bin/python3") ? "/usr/bin/python3" : "python3"; }

/// PyTorch's images/s on the same images (median of `runs`), or -1 when it cannot run here.
double TorchImagesPerSecond(const std::string& model, int64_t images, int runs) {
  const std::string out =
      Run("OMP_WAIT_POLICY=passive " + Python() + " " + COPSE_SOURCE_DIR + "/scripts/torch_bench.py --model " + model +
          " --threads 2 --images " + std::to_string(images) + " --runs " + std::to_string(runs) + " 2>/dev/null");
  const Json t = Json::parse(out, nullptr, false);
  return !t.is_discarded() && t.contains("median") ? t["median"].get<double>() : -1;
}

/// A PyTorch pipeline of the same model, split as `copse graph pipeline --stages 2` splits it
/// (scripts/torch_pipeline_bench.py: a process and a thread per stage, gloo on loopback): its
/// images/s and its bubble, measured as copse's; images/s -1 when it cannot run here.
struct TorchPipeline {
  double images_per_s = -1, bubble = -1;
};
TorchPipeline TorchPipelineRun(const std::string& schedule, int microbatches, int64_t images) {
  const std::string out =
      Run(Python() + " " + COPSE_SOURCE_DIR + "/scripts/torch_pipeline_bench.py --schedule " + schedule + " --microbatches " +
          std::to_string(microbatches) + " --images " + std::to_string(images) + " --runs 1 2>/dev/null");
  const Json t = Json::parse(out, nullptr, false);
  if (t.is_discarded() || !t.contains("median") || !t.contains("bubble_median")) return {};
  return {t["median"].get<double>(), t["bubble_median"].get<double>()};
}

double Median(std::vector<double> v) {
  if (v.empty()) return -1;
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
}

struct MicrosSpan {
  int64_t start, end;
};

struct GraphResult {
  bool ok = false;
  double images_per_s = 0, accuracy = 0;
  double bubble = -1, bubble_without_gaps = -1, scheduler_share = -1;
  size_t recoveries = 0;    // vertices re-run (the summary's recovery records)
  double peak_rss_mib = 0;  // the largest process of the run (a daemon), when measured
  std::string digest;       // of the final parameters
};

GraphResult RunGraph(const copse::ml::GraphOptions& o, const fs::path& dir, int daemons, const std::string& run_flags = "",
                     const Json& faults = Json(), bool measure_rss = false) {
  GraphResult res;
  auto job = copse::ml::GenerateTrainingGraph(o);
  if (!job.ok()) {
    std::fprintf(stderr, "generate: %s\n", job.status().ToString().c_str());
    return res;
  }
  if (!faults.is_null()) (*job)["faults"] = faults;
  fs::create_directories(dir);
  const fs::path file = dir / "job.json", trace = dir / "trace.txt", out = dir / "out";
  std::ofstream(file) << job->dump();
  fs::remove(trace);
  int rc = 0;
  const std::string cmd = "COPSE_ML_TRACE=" + trace.string() + " " + Copse() + " run " + file.string() + " --daemons " +
                          std::to_string(daemons) + " --output " + out.string() + " -o json " + run_flags + " 2>/dev/null";
  const Json summary =
      Json::parse(measure_rss ? RunMeasuringPeakRss(cmd, &rc, &res.peak_rss_mib) : Run(cmd, &rc), nullptr, false);
  if (rc != 0) return res;
  std::ifstream mf(out / "metrics.json");
  const Json metrics = Json::parse(mf, nullptr, false);
  if (metrics.is_discarded()) return res;
  res.ok = true;
  res.images_per_s = metrics.value("images_per_s", 0.0);
  res.accuracy = metrics.value("test_accuracy", 0.0);
  res.digest = metrics.value("parameter_digest", "");
  if (!summary.is_discarded() && summary.contains("recoveries")) res.recoveries = summary["recoveries"].size();
  // Spans by vertex.
  std::map<std::string, MicrosSpan> spans;
  std::ifstream tf(trace);
  std::string name;
  int64_t s, e, pid;
  while (tf >> name >> s >> e >> pid) spans[name] = {s, e};  // the last attempt wins
  // Bubble (pipelines): the same measure `copse run` prints, on the programs' own spans.
  if (o.kind == "pipeline") {
    std::map<std::string, copse::ml::Span> times;
    for (const auto& [v, sp] : spans) times[v] = {static_cast<double>(sp.start), static_cast<double>(sp.end)};
    // Interleaved: o.stages daemons of virtual_stages chunks, stage s on daemon s mod o.stages.
    const int stages = o.stages * (o.schedule == "interleaved" ? o.virtual_stages : 1);
    if (auto b = copse::ml::MeasuredBubble(times, stages, o.microbatches, o.stages)) res.bubble = b->mean;
    if (auto b = copse::ml::MeasuredBubble(copse::ml::WithoutGaps(times, stages, o.stages), stages, o.microbatches, o.stages)) {
      res.bubble_without_gaps = b->mean;
    }
  }
  // Critical path through data and order edges, back from the vertex that ended last
  // (eval excluded: it runs after the clock stops).
  std::map<std::string, std::vector<std::string>> preds;
  for (const auto& edge : (*job)["edges"]) preds[edge["to"].get<std::string>()].push_back(edge["from"]);
  std::string cur;
  int64_t last_end = 0;
  for (const auto& [v, sp] : spans)
    if (v.rfind("eval", 0) != 0 && sp.end > last_end) last_end = sp.end, cur = v;
  double gaps = 0;
  int64_t path_end = last_end, path_start = last_end;
  while (!cur.empty()) {
    std::string best;
    int64_t best_end = -1;
    for (const auto& p : preds[cur]) {
      std::string key = p.find('[') == std::string::npos ? p + "[0]" : p;
      auto it = spans.find(key);
      if (it != spans.end() && it->second.end > best_end) best_end = it->second.end, best = key;
    }
    const MicrosSpan sp = spans[cur];
    path_start = sp.start;
    if (best.empty() || best.rfind("init", 0) == 0) break;  // the clock starts after init
    gaps += static_cast<double>(std::max<int64_t>(0, sp.start - best_end));
    cur = best;
  }
  if (path_end > path_start) res.scheduler_share = gaps / static_cast<double>(path_end - path_start);
  return res;
}

}  // namespace

/// Recovery: pipeline 2 1F1B M=8 on 3 daemons, stage 1's daemon killed once step 3/4 of the
/// run is placed, without checkpoints, with a durable checkpoint every 10 steps, and with every
/// step's (every 5th step's) chain mirrored in another daemon's memory (--mirror-every).
void Recovery(const copse::ml::GraphOptions& base, int64_t steps, const fs::path& dir) {
  const int64_t kill_step = steps * 3 / 4;
  std::printf("\nrecovery: pipeline 2 1f1b M=8, copse run --daemons 3, stage 1's daemon killed at step %lld of %lld\n",
              static_cast<long long>(kill_step + 1), static_cast<long long>(steps));
  std::printf("%-42s %12s %10s %10s %s\n", "configuration", "images/s", "vs clean", "re-run",
              "parameters (fault-free: largest process's peak RSS)");
  for (const auto& [every, mirror] : std::vector<std::pair<int, int>>{{0, 0}, {10, 0}, {0, 1}, {0, 5}}) {
    copse::ml::GraphOptions o = base;
    o.kind = "pipeline";
    o.stages = 2;
    o.microbatches = 8;
    o.schedule = "1f1b";
    o.checkpoint_every = every;
    o.mirror_every = mirror;
    const std::string tag = mirror  ? "mirror every " + std::to_string(mirror)
                            : every ? "checkpoint every " + std::to_string(every)
                                    : "no checkpoints";
    const fs::path d = dir / ("recovery-" + std::to_string(every) + "-" + std::to_string(mirror));
    const GraphResult clean = RunGraph(o, d / "clean", 3, "", Json(), /*measure_rss=*/true);
    const Json faults = Json::array({{{"kill_daemon_of", "fwd1[" + std::to_string(kill_step * o.microbatches) + "]"}}});
    const GraphResult hit = RunGraph(o, d / "faulted", 3, "", faults);
    if (!clean.ok || !hit.ok) {
      std::printf("%-42s FAILED\n", tag.c_str());
      continue;
    }
    std::printf("%-42s %12.0f %10s %10s peak RSS %.0f MiB\n", (tag + ", fault-free").c_str(), clean.images_per_s, "-", "-",
                clean.peak_rss_mib);
    std::printf("%-42s %12.0f %9.2fx %10zu %s\n", (tag + ", daemon killed").c_str(), hit.images_per_s,
                hit.images_per_s / clean.images_per_s, hit.recoveries, hit.digest == clean.digest ? "bit-identical" : "DIFFER");
    std::fflush(stdout);
  }
}

int main(int argc, char** argv) {
  int64_t steps = 60;
  int daemons = 2;
  std::string model = "mlp";
  bool torch = true;
  int rounds = 5;
  bool recovery_only = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--steps" && i + 1 < argc)
      steps = std::atoll(argv[++i]);
    else if (a == "--model" && i + 1 < argc)
      model = argv[++i];
    else if (a == "--no-torch")
      torch = false;
    else if (a == "--recovery-only")
      recovery_only = true;
    else if (a == "--rounds" && i + 1 < argc && std::sscanf(argv[i + 1], "%d", &rounds) == 1 && rounds >= 0)
      ++i;
    else {
      std::fprintf(stderr, "usage: ml_graph_bench [--steps N] [--model mlp|cnn] [--no-torch] [--rounds N] [--recovery-only]\n");
      return 2;
    }
  }
  const int batch = 128;
  const int64_t images = steps * batch;
  char tmpl[] = "/tmp/copse-mlgraph-bench-XXXXXX";
  if (!mkdtemp(tmpl)) return 1;
  const fs::path dir = tmpl;
  std::printf(
      "ml_graph_bench: model %s, batch %d, %lld steps (%lld images), SGD lr 0.05 momentum 0.9, "
      "copse run --daemons %d (2 cpus each), 1 thread per vertex\n",
      model.c_str(), batch, static_cast<long long>(steps), static_cast<long long>(images), daemons);
  // The products' backend (oneDNN, as PyTorch, or OpenBLAS: cpu_device.h) decides much of
  // copse's rows; OPENBLAS_CORETYPE pins the kernels of OpenBLAS's share.
  const char* coretype = std::getenv("OPENBLAS_CORETYPE");
  std::printf("products: %s (the copse processes this bench starts inherit COPSE_ML_GEMM); OpenBLAS kernels: %s\n",
              copse::ml::internal::GemmBackend(),
              coretype ? (std::string(coretype) + " (OPENBLAS_CORETYPE)").c_str() : "chosen by OpenBLAS for this CPU");

  copse::ml::GraphOptions base;
  base.model = model;
  base.batch = batch;
  base.limit = images;
  base.epochs = 1;
  base.steps = steps;
  if (recovery_only) {
    Recovery(base, steps, dir);
    std::error_code ec;
    fs::remove_all(dir, ec);
    return 0;
  }

  // Single process.
  Json single = Json::parse(Run(Copse() + " train --model " + model + " --epochs 1 --batch 128 --threads 2 --limit " +
                                std::to_string(images) + " -o json 2>/dev/null"),
                            nullptr, false);
  const double torch_ips = torch ? TorchImagesPerSecond(model, images, 3) : -1;
  if (!single.is_discarded()) std::printf("malloc of the copse binary: %s\n", single.value("allocator", "unknown").c_str());
  std::printf("\n%-42s %12s %10s %9s %15s %12s\n", "configuration", "images/s", "vs torch", "accuracy", "bubble", "sched share");
  auto row = [&](const std::string& name, double ips, double acc, double bubble, double without_gaps, double theory,
                 double share) {
    std::printf("%-42s %12.0f ", name.c_str(), ips);
    if (torch_ips > 0)
      std::printf("%9.2fx ", ips / torch_ips);
    else
      std::printf("%10s ", "-");
    if (acc >= 0)
      std::printf("%8.2f%% ", 100 * acc);
    else
      std::printf("%9s ", "-");
    if (bubble >= 0 && without_gaps < 0)
      std::printf("%4.1f/   -/%4.1f%% ", 100 * bubble, 100 * theory);
    else if (bubble >= 0)
      std::printf("%4.1f/%4.1f/%4.1f%% ", 100 * bubble, 100 * without_gaps, 100 * theory);
    else
      std::printf("%15s ", "-");
    if (share >= 0) std::printf("%11.1f%%", 100 * share);
    std::printf("\n");
    std::fflush(stdout);
  };
  if (torch_ips > 0) row("PyTorch CPU (2 threads)", torch_ips, -1, -1, -1, 0, -1);
  if (torch_ips > 0 && model == "mlp") {  // the script splits only the MLP
    for (const char* schedule : {"gpipe", "1f1b"}) {
      const TorchPipeline p = TorchPipelineRun(schedule, 8, images);
      if (p.images_per_s > 0)
        row(std::string("PyTorch pipeline 2 ") + schedule + " M=8 (gloo)", p.images_per_s, -1, p.bubble, -1, 1.0 / 9, -1);
    }
  }
  if (!single.is_discarded() && single.contains("images_per_s"))
    row("copse single process (2 threads)", single["images_per_s"].get<double>(), single.value("test_accuracy", 0.0), -1, -1, 0,
        -1);

  for (const char* reducer : {"tree", "ps"}) {
    copse::ml::GraphOptions o = base;
    o.kind = "data-parallel";
    o.workers = 2;
    o.reducer = reducer;
    const GraphResult r = RunGraph(o, dir / ("dp2-" + std::string(reducer)), daemons);
    if (r.ok)
      row(std::string("data-parallel 2 (") + reducer + ")", r.images_per_s, r.accuracy, -1, -1, 0, r.scheduler_share);
    else
      row(std::string("data-parallel 2 (") + reducer + ") FAILED", 0, -1, -1, -1, 0, -1);
  }
  for (const char* schedule : {"gpipe", "1f1b"}) {
    for (int m : {4, 8, 16}) {
      copse::ml::GraphOptions o = base;
      o.kind = "pipeline";
      o.stages = 2;
      o.microbatches = m;
      o.schedule = schedule;
      const std::string name = std::string("pipeline 2 ") + schedule + " M=" + std::to_string(m);
      const GraphResult r = RunGraph(o, dir / ("p2-" + std::string(schedule) + std::to_string(m)), daemons);
      const double theory = 1.0 / (m + 1);
      if (r.ok)
        row(name, r.images_per_s, r.accuracy, r.bubble, r.bubble_without_gaps, theory, r.scheduler_share);
      else
        row(name + " FAILED", 0, -1, -1, -1, 0, -1);
    }
  }
  for (int m : {8, 16}) {  // Interleaved 1F1B: 2 model chunks a daemon, the bubble's theory halved.
    copse::ml::GraphOptions o = base;
    o.kind = "pipeline";
    o.stages = 2;
    o.microbatches = m;
    o.schedule = "interleaved";
    o.virtual_stages = 2;
    const std::string name = "pipeline 2 interleaved v=2 M=" + std::to_string(m);
    const GraphResult r = RunGraph(o, dir / ("p2-interleaved" + std::to_string(m)), daemons);
    const double theory = copse::ml::TheoreticalBubble(2, m, 2);
    if (r.ok)
      row(name, r.images_per_s, r.accuracy, r.bubble, r.bubble_without_gaps, theory, r.scheduler_share);
    else
      row(name + " FAILED", 0, -1, -1, -1, 0, -1);
  }
  {  // Batched weight gradients' part: every backward accumulates its micro-batch's instead.
    copse::ml::GraphOptions o = base;
    o.kind = "pipeline";
    o.stages = 2;
    o.microbatches = 8;
    o.schedule = "1f1b";
    o.weight_grads = "per-microbatch";
    const GraphResult r = RunGraph(o, dir / "p2-1f1b8-permb", daemons);
    if (r.ok)
      row("pipeline 2 1f1b M=8, per-micro-batch weight grads", r.images_per_s, r.accuracy, r.bubble, r.bubble_without_gaps,
          1.0 / 9, r.scheduler_share);
  }
  {  // The job manager's part: the same graph with every vertex sent only once its inputs are complete.
    copse::ml::GraphOptions o = base;
    o.kind = "pipeline";
    o.stages = 2;
    o.microbatches = 8;
    o.schedule = "1f1b";
    const GraphResult r = RunGraph(o, dir / "p2-1f1b8-nochain", daemons, "--no-chain-dispatch");
    if (r.ok)
      row("pipeline 2 1f1b M=8, no chained dispatch", r.images_per_s, r.accuracy, r.bubble, r.bubble_without_gaps, 1.0 / 9,
          r.scheduler_share);
  }
  {  // The same-host fast path's part: daemons fetch each other's outputs over TCP instead.
    copse::ml::GraphOptions dp = base;
    dp.kind = "data-parallel";
    dp.workers = 2;
    dp.reducer = "ps";
    GraphResult r = RunGraph(dp, dir / "dp2-ps-tcp", daemons, "--no-local-socket");
    if (r.ok) row("data-parallel 2 (ps), fetches over TCP", r.images_per_s, r.accuracy, -1, -1, 0, r.scheduler_share);
    copse::ml::GraphOptions p = base;
    p.kind = "pipeline";
    p.stages = 2;
    p.microbatches = 8;
    p.schedule = "1f1b";
    r = RunGraph(p, dir / "p2-1f1b8-tcp", daemons, "--no-local-socket");
    if (r.ok)
      row("pipeline 2 1f1b M=8, fetches over TCP", r.images_per_s, r.accuracy, r.bubble, r.bubble_without_gaps, 1.0 / 9,
          r.scheduler_share);
  }
  std::printf(
      "\nbubble: measured / replayed with no gaps between dependent vertices (the stages' own imbalance) /\n"
      "theoretical (p-1)/(m+p-1) for equal stages; sched share: scheduler gaps on the critical path / its span\n");

  // The targets, against this VM's noise: rounds of PyTorch, DP-2 ps and 1F1B M=8 back
  // to back (PyTorch first, then last, in turn, and the two copse runs swapping places), each
  // copse row as a ratio to its round's PyTorch.
  if (torch && rounds > 0) {
    std::printf(
        "\ntargets: %d rounds of PyTorch, data-parallel 2 (ps) and pipeline 2 1f1b M=8 back to back, in "
        "rotating order; ratios to the round's PyTorch\n%-6s %9s %9s %7s %9s %7s\n",
        rounds, "round", "PyTorch", "DP-2 ps", "ratio", "1F1B M=8", "ratio");
    copse::ml::GraphOptions dp = base;
    dp.kind = "data-parallel";
    dp.workers = 2;
    dp.reducer = "ps";
    copse::ml::GraphOptions pp = base;
    pp.kind = "pipeline";
    pp.stages = 2;
    pp.microbatches = 8;
    pp.schedule = "1f1b";
    std::vector<double> dp_ratios, pp_ratios;
    for (int round = 1; round <= rounds; ++round) {
      double t = round % 2 ? TorchImagesPerSecond(model, images, 1) : -1;
      GraphResult d, p;
      if (round % 4 < 2) {
        d = RunGraph(dp, dir / "targets-dp2", daemons);
        p = RunGraph(pp, dir / "targets-p2", daemons);
      } else {
        p = RunGraph(pp, dir / "targets-p2", daemons);
        d = RunGraph(dp, dir / "targets-dp2", daemons);
      }
      if (round % 2 == 0) t = TorchImagesPerSecond(model, images, 1);
      if (t <= 0 || !d.ok || !p.ok) {
        std::printf("%-6d failed (PyTorch %s, DP-2 %s, 1F1B %s)\n", round, t > 0 ? "ok" : "failed", d.ok ? "ok" : "failed",
                    p.ok ? "ok" : "failed");
        continue;
      }
      dp_ratios.push_back(d.images_per_s / t);
      pp_ratios.push_back(p.images_per_s / t);
      std::printf("%-6d %9.0f %9.0f %6.2fx %9.0f %6.2fx\n", round, t, d.images_per_s, dp_ratios.back(), p.images_per_s,
                  pp_ratios.back());
      std::fflush(stdout);
    }
    if (!pp_ratios.empty()) {
      std::printf(
          "median ratio: data-parallel 2 (ps) %.2fx (min %.2fx), pipeline 2 1f1b M=8 %.2fx (min %.2fx); "
          "target >= 0.80x\n",
          Median(dp_ratios), *std::min_element(dp_ratios.begin(), dp_ratios.end()), Median(pp_ratios),
          *std::min_element(pp_ratios.begin(), pp_ratios.end()));
    }
  }

  Recovery(base, steps, dir);
  std::error_code ec;
  fs::remove_all(dir, ec);
  return 0;
}
