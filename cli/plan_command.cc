#include "cli/plan_command.h"

#include <signal.h>
#include <sys/wait.h>

#include <algorithm>
#include <atomic>
#include <cstring>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <thread>

#include <fmt/format.h>

#include "cli/commands.h"
#include "cli/graph_command.h"
#include "cli/process_util.h"
#include "cli/run_directory.h"
#include "common/machine_memory.h"
#include "ml/models.h"
#include "ml/pipeline_bubble.h"
#include "ml/planner.h"
#include "ml/profile_graph.h"
#include "ml/transformer.h"

namespace copse::cli {
namespace {

struct PlanFlags {
  GraphFlags graph;
  int daemons = 2;
  int64_t memory_mb = 0;
  std::string costs;        // a cost table measured before, instead of profiling
  std::string save_costs;   // where to keep the measured table
  std::string profile_job;  // only write the profiling job here
  std::string keep_dir;     // the profiling run's files
  int repeats = 5;
  bool calibrate = true;  // a short real training run measures what a vertex adds
  std::string format = "text";
};

/// Micro-batch sizes the layouts of `batch` over `daemons` need: batch / 2^k (micro-batches of
/// a pipeline, shards of data-parallel workers), while they divide it.
std::vector<int64_t> SizesFor(int64_t batch, int max_microbatches) {
  std::set<int64_t> sizes;
  for (int64_t k = 1; k <= max_microbatches && batch % k == 0; k *= 2) sizes.insert(batch / k);
  return {sizes.begin(), sizes.end()};
}

ml::ProfileGraphOptions ProfileOptionsOf(const PlanFlags& f, const ml::PlanRequest& request) {
  ml::ProfileGraphOptions p;
  p.model = f.graph.o.model;
  p.microbatch_sizes = SizesFor(request.batch, request.max_microbatches);
  p.optimizer = f.graph.o.optimizer;
  p.daemons = f.daemons;
  p.daemon_cpus = f.graph.o.daemon_cpus;
  p.threads = f.graph.o.threads;
  p.repeats = f.repeats;
  // A gpt model: tensor-parallel groups that fit one daemon's slots and split its heads.
  if (auto spec = ml::ParseGptSpec(f.graph.o.model); ml::IsLanguageModel(f.graph.o.model) && spec.ok()) {
    for (int ranks = 2; ranks <= std::min(request.slots_per_daemon, 16); ranks *= 2) {
      if (spec->heads % ranks == 0 && spec->dim % ranks == 0) p.tensor_parallel.push_back(ranks);
    }
  }
  return p;
}

// The `copse run` child running now (0: none), and whether SIGINT or SIGTERM came: the signal
// thread (StopOnSignals) stops the child, whose own handler stops its cluster in order, and the
// command then returns, removing its temporary directory.
std::atomic<pid_t> g_child{0};
std::atomic<bool> g_interrupted{false};

void StopTheChildOnSignals() {
  StopOnSignals([] {
    g_interrupted = true;
    if (const pid_t pid = g_child.load(); pid > 0) ::kill(pid, SIGTERM);
  });
}

/// Runs `job` (named `name` in `dir`) with `copse run` on a local cluster of f.daemons daemons;
/// its outputs go to dir/name-out. `env` is added to the cluster's environment.
Status RunLocally(const PlanFlags& f, const Json& job, const std::filesystem::path& dir, const std::string& name,
                  const std::map<std::string, std::string>& env) {
  const std::string job_file = (dir / (name + ".json")).string();
  if (WriteJobFile(job, job_file, "copse plan") != 0) return Status::IOError("cannot write " + job_file);
  const std::string log = (dir / (name + ".log")).string();
  std::vector<std::string> args = {"run",       job_file,
                                   "--daemons", std::to_string(f.daemons),
                                   "--cpus",    std::to_string(f.graph.o.daemon_cpus),
                                   "--output",  (dir / (name + "-out")).string(),
                                   "-o",        "json"};
  if (!f.keep_dir.empty()) args.insert(args.end(), {"--keep", (dir / (name + "-cluster")).string()});
  COPSE_ASSIGN_OR_RETURN(const pid_t pid, SpawnSelf(args, env, log));
  g_child = pid;
  int status = 0;
  pid_t waited = 0;
  while ((waited = ::waitpid(pid, &status, 0)) < 0 && errno == EINTR) {
  }
  g_child = 0;
  if (g_interrupted) return Status::Cancelled("interrupted; the local cluster was stopped");
  if (waited != pid) return Status::Internal(std::string("cannot wait for copse run: ") + std::strerror(errno));
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return Status::OK();
  std::string tail = ReadFile(log).ValueOr("(its log could not be read)");
  if (tail.size() > 4000) tail = tail.substr(tail.size() - 4000);
  return Status::Internal("the " + name + " job failed (copse run " + job_file + "):\n" + tail);
}

/// Runs the profiling job and returns its costs.json.
Result<ml::CostTable> ProfileLocally(const PlanFlags& f, const Json& job, const std::filesystem::path& dir) {
  std::cerr << "copse plan: profiling " << f.graph.o.model << " on " << f.daemons << " local daemon(s)…\n";
  COPSE_RETURN_NOT_OK(RunLocally(f, job, dir, "profile", {}));
  COPSE_ASSIGN_OR_RETURN(Json costs, ReadJsonFile((dir / "profile-out" / "costs.json").string()));
  return ml::CostTableFromJson(costs);
}

/// "fwd1[12]" -> ("fwd1", 12); nullopt for another shape.
std::optional<std::pair<std::string, int64_t>> VertexName(const std::string& name) {
  const size_t open = name.find('[');
  if (open == std::string::npos || name.back() != ']') return std::nullopt;
  try {
    return std::make_pair(name.substr(0, open), std::stoll(name.substr(open + 1)));
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

/// Calibrates `table` (ml::Calibrate) on short real training runs on the local cluster: one
/// data-parallel worker; 2-stage 1F1B pipelines of 2 and of up to 16 micro-batches where there
/// are 2 daemons and 2 layers; a tensor-parallel group where the table has shards; 4 steps
/// each, the first left out; each vertex timed by the programs themselves (COPSE_ML_TRACE).
Status CalibrateLocally(const PlanFlags& f, ml::CostTable& table, const std::filesystem::path& dir) {
  std::cerr << "copse plan: calibrating on short training runs…\n";
  const int layers = static_cast<int>(table.layers.size());
  const double optimizer = table.optimizer_per_parameter * static_cast<double>(table.Parameters(0, layers));
  std::vector<ml::VertexSample> samples;
  const std::vector<int64_t> sizes = table.MicrobatchSizes();
  auto measured_at = [&](int64_t size) { return std::find(sizes.begin(), sizes.end(), size) != sizes.end(); };
  const int64_t batch = f.graph.o.batch;
  if (!measured_at(batch))
    return Status::InvalidArgument(fmt::format("calibration: the cost table has no times at the batch of {}", batch));
  // Pipelines at two micro-batch counts (2 and up to 16), so that the fit tells the table's
  // error per micro-batch of work from what each vertex adds.
  std::vector<std::pair<std::string, int>> runs = {{"data-parallel", 1}};
  if (f.daemons >= 2 && layers >= 2) {
    int most = 1;
    for (int m = 2; m <= 16 && batch % m == 0 && measured_at(batch / m); m *= 2) most = m;
    if (most >= 2) runs.push_back({"pipeline", 2});
    if (most > 2) runs.push_back({"pipeline", most});
  }
  if (!table.shards.empty()) runs.push_back({"tensor-parallel", 1});
  for (const auto& [kind, microbatches] : runs) {
    ml::GraphOptions o = f.graph.o;
    o.kind = kind;
    o.steps = 4;
    o.limit = o.batch * 4;
    o.test_limit = 64;
    o.checkpoint_every = 0;
    o.name = "calibrate-" + kind + (kind == "pipeline" ? "-m" + std::to_string(microbatches) : "");
    const int64_t mb = o.batch / microbatches;
    if (kind == "tensor-parallel") {
      o.tensor_parallel = table.shards.begin()->first;
      o.tp_channel = "shm";
    } else if (kind == "pipeline") {
      o.stages = 2;
      o.microbatches = microbatches;
      o.schedule = "1f1b";
      o.split = ml::BestSplit(table, 2, microbatches, mb);
    } else {
      o.workers = 1;
      o.reducer = "ps";
    }
    COPSE_ASSIGN_OR_RETURN(Json job, ml::GenerateTrainingGraph(o));
    const std::string trace = (dir / (o.name + "-trace.txt")).string();
    std::error_code ignored;
    std::filesystem::remove(trace, ignored);
    COPSE_RETURN_NOT_OK(RunLocally(f, job, dir, o.name, {{"COPSE_ML_TRACE", trace}}));
    std::ifstream in(trace);
    std::string name;
    int64_t start = 0, end = 0, pid = 0;
    while (in >> name >> start >> end >> pid) {
      const auto v = VertexName(name);
      if (!v) continue;
      const auto& [stage, index] = *v;
      const double measured = static_cast<double>(end - start) / 1e6;
      using K = ml::VertexSample::Kind;
      if (kind == "tensor-parallel") {
        if (stage != "tp0" || index < 1) continue;
        COPSE_ASSIGN_OR_RETURN(const double predicted, ml::TensorParallelMemberStep(table, o.tensor_parallel, o.batch));
        samples.push_back({K::kTensorParallel, predicted, measured, o.batch});
      } else if (kind == "pipeline") {
        const auto p = ml::ParsePipelineVertex(name);
        if (!p || p->stage < 0 || p->stage >= o.stages) continue;
        const size_t s = static_cast<size_t>(p->stage);
        const auto t = ml::StageVertexTimes(table, o.split[s], o.split[s + 1], mb, microbatches);
        if (p->kind == 'u' && index >= 1) samples.push_back({K::kStageUpdate, t.update, measured, mb});
        if (p->kind == 'f' && index >= microbatches) samples.push_back({K::kStage, t.forward, measured, mb});
        if (p->kind == 'b' && index >= microbatches) samples.push_back({K::kStage, t.backward, measured, mb});
      } else if (index >= 1) {
        const auto t = ml::StageVertexTimes(table, 0, layers, o.batch, 1);
        if (stage == "grad0") samples.push_back({K::kGradient, t.gradient, measured, o.batch});
        if (stage == "ps") samples.push_back({K::kServerUpdate, optimizer, measured, o.batch});
      }
    }
  }
  return ml::Calibrate(table, samples);
}

std::string Memory(const std::vector<int64_t>& bytes) {
  std::string out;
  for (size_t i = 0; i < bytes.size(); ++i)
    out += fmt::format("{}{:.1f}", i ? " / " : "", static_cast<double>(bytes[i]) / (1 << 20));
  return out;
}

Json PlanJson(const ml::Plan& plan, const ml::PlanRequest& request) {
  Json candidates = Json::array();
  for (const auto& c : plan.candidates) {
    Json j = {{"layout", c.layout.Describe()},
              {"kind", c.layout.kind},
              {"degree", c.layout.degree},
              {"step_ms", c.prediction.step_s * 1e3},
              {"samples_per_s", static_cast<double>(request.batch) / c.prediction.step_s},
              {"memory_bytes", c.prediction.memory_bytes},
              {"fits", c.prediction.fits}};
    if (c.layout.kind == "pipeline") {
      j["microbatches"] = c.layout.microbatches;
      j["schedule"] = c.layout.schedule;
      if (c.layout.schedule == "interleaved") j["virtual_stages"] = c.layout.virtual_stages;
      j["split"] = c.layout.split;
      j["bubble"] = c.prediction.bubble;
    }
    if (!c.prediction.fits) j["why_not"] = c.prediction.why_not;
    candidates.push_back(std::move(j));
  }
  return candidates;
}

int RunPlan(PlanFlags& f) {
  const char* me = "copse plan";
  ml::PlanRequest request;
  request.batch = f.graph.o.batch;
  request.daemons = f.daemons;
  request.slots_per_daemon = std::max(1, f.graph.o.daemon_cpus / f.graph.o.threads);

  const int64_t memory_mb = f.memory_mb > 0 ? f.memory_mb : MachineMemoryMb() / std::max(1, f.daemons);
  request.memory_per_daemon = memory_mb > 0 ? memory_mb << 20 : 0;
  if (f.graph.o.precision != "fp32" || f.graph.o.device != "cpu") {
    std::fprintf(stderr, "%s: plans fp32 training on CPUs (--precision fp32, --device cpu)\n", me);
    return 2;
  }
  auto layers = ml::BuildModelLayers(f.graph.o.model);
  if (!layers.ok()) {
    std::fprintf(stderr, "%s: --model %s: %s\n", me, f.graph.o.model.c_str(), layers.status().message().c_str());
    return 2;
  }
  auto profile_job = ml::GenerateProfileGraph(ProfileOptionsOf(f, request));
  if (!profile_job.ok()) {
    std::fprintf(stderr, "%s: %s\n", me, profile_job.status().message().c_str());
    return 2;
  }
  if (!f.profile_job.empty()) return WriteJobFile(*profile_job, f.profile_job, me);
  if (f.graph.out.empty()) {
    std::fprintf(stderr, "%s: --out FILE: where to write the planned job\n", me);
    return 2;
  }
  Result<ml::CostTable> table = Status::Internal("unset");
  if (!f.costs.empty()) {
    auto json = ReadJsonFile(f.costs);
    table = json.ok() ? ml::CostTableFromJson(*json) : json.status();
    if (!table.ok()) {
      std::fprintf(stderr, "%s: --costs %s: %s\n", me, f.costs.c_str(), table.status().message().c_str());
      return 1;
    }
    // The table must describe the job the plan writes.
    std::string mismatch;
    if (table->model != f.graph.o.model) {
      mismatch = "model " + table->model + ", not --model " + f.graph.o.model;
    } else if (table->layers.size() != layers->size()) {
      mismatch = fmt::format("{} layers, where model {} has {}", table->layers.size(), f.graph.o.model, layers->size());
    } else if (table->optimizer != f.graph.o.optimizer) {
      mismatch = "optimizer " + table->optimizer + ", not --optimizer " + f.graph.o.optimizer;
    } else if (std::any_of(table->shards.begin(), table->shards.end(),
                           [&](const auto& s) { return !ml::BuildModelShardLayers(f.graph.o.model, 0, s.first).ok(); })) {
      mismatch = "tensor-parallel shards model " + f.graph.o.model + " cannot be split into";
    } else if (table->threads != f.graph.o.threads) {
      mismatch = fmt::format("with {} thread(s), not --threads {}", table->threads, f.graph.o.threads);
    }
    if (!mismatch.empty()) {
      std::fprintf(stderr, "%s: --costs %s was measured for %s\n", me, f.costs.c_str(), mismatch.c_str());
      return 1;
    }
  } else {
    StopTheChildOnSignals();
    auto dir = RunDirectory::Make(f.keep_dir, "copse-plan");
    if (!dir.ok()) {
      std::fprintf(stderr, "%s: %s\n", me, dir.status().message().c_str());
      return 1;
    }
    table = ProfileLocally(f, *profile_job, (*dir)->path());
    if (!table.ok()) {
      std::fprintf(stderr, "%s: %s\n", me, table.status().message().c_str());
      return 1;
    }
    table->local_cores = static_cast<int>(std::thread::hardware_concurrency());  // 0 when unknown
    if (f.calibrate) {
      if (Status st = CalibrateLocally(f, *table, (*dir)->path()); !st.ok()) {
        std::fprintf(stderr, "%s: %s\n(--no-calibrate plans without the calibration runs)\n", me, st.message().c_str());
        return 1;
      }
    }
    if (!f.save_costs.empty()) {
      std::ofstream out(f.save_costs);
      out << ToJson(*table).dump(2) << "\n";
      if (!out) {
        std::fprintf(stderr, "%s: cannot write %s\n", me, f.save_costs.c_str());
        return 1;
      }
    }
  }
  // Profiled on a local cluster (now, or when the table was saved): its daemons share that
  // machine's cores. A table from a cluster's daemons has none recorded.
  if (table->local_cores > 0) request.cores = std::max(1, table->local_cores / f.graph.o.threads);
  auto plan = ml::MakePlan(*table, request);
  if (!plan.ok()) {
    std::fprintf(stderr, "%s: %s\n", me, plan.status().message().c_str());
    return 1;
  }
  // The job first (when a layout fits), then what was weighed, which names it.
  if (plan->best >= 0) {
    const ml::Candidate& best = plan->candidates[static_cast<size_t>(plan->best)];
    ml::GraphOptions o = f.graph.o;
    o.kind = best.layout.kind;
    if (o.kind == "tensor-parallel") {
      o.tensor_parallel = best.layout.degree;
      o.tp_channel = "shm";  // one daemon's members, as the planner weighs them
    } else if (o.kind == "pipeline") {
      o.stages = best.layout.degree;
      o.microbatches = best.layout.microbatches;
      o.schedule = best.layout.schedule;
      o.virtual_stages = best.layout.virtual_stages;
      o.split = best.layout.split;
    } else {
      o.workers = best.layout.degree;
      o.reducer = "ps";  // what the planner's data-parallel step assumes
    }
    o.plan = {{"layout", best.layout.Describe()},
              {"step_ms", best.prediction.step_s * 1e3},
              {"samples_per_s", static_cast<double>(request.batch) / best.prediction.step_s}};
    if (o.kind == "pipeline") o.plan["bubble"] = best.prediction.bubble;
    auto job = ml::GenerateTrainingGraph(o);
    if (!job.ok()) {
      std::fprintf(stderr, "%s: %s: %s\n", me, best.layout.Describe().c_str(), job.status().message().c_str());
      return job.status().code() == StatusCode::kInvalidArgument ? 2 : 1;
    }
    if (const int rc = WriteJobFile(*job, f.graph.out, me); rc != 0) return rc;
  }
  if (f.format == "json") {
    Json out = {{"candidates", PlanJson(*plan, request)}, {"costs", ToJson(*table)}};
    if (plan->best >= 0)
      out["chosen"] = plan->candidates[static_cast<size_t>(plan->best)].layout.Describe(), out["job"] = f.graph.out;
    if (!table->calibrated) out["calibrated"] = false;
    std::cout << out.dump(2) << "\n";
  } else {
    const ml::LinkCost& l = table->link;
    std::cout << fmt::format(
        "{}, batch {}, {} daemon(s) of {} MiB; vertex gap {:.0f} us, hop across daemons {:.0f} us, {:.0f} MB/s{}\n", table->model,
        request.batch, request.daemons, memory_mb, l.gap * 1e6, l.hop * 1e6, l.bytes_per_s / 1e6,
        l.measured ? "" : " (not measured: defaults)");
    if (!table->calibrated) {
      std::cout << "not calibrated: predictions leave out what a vertex does beside its layers' passes\n";
    } else {
      std::cout << fmt::format(
          "calibrated: layer passes x {:.2f}, plus {:.0f} us a pipeline forward or backward, {:.0f} us its update, "
          "{:.0f} us a data-parallel gradient, {:.0f} us its parameter server, {:.0f} us a tensor-parallel member's step\n",
          table->vertex_scale, table->vertex_overhead * 1e6, table->update_overhead * 1e6, table->gradient_overhead * 1e6,
          table->server_overhead * 1e6, table->tensor_parallel_overhead * 1e6);
    }
    size_t width = 6;
    for (const auto& c : plan->candidates) width = std::max(width, c.layout.Describe().size());
    std::cout << fmt::format("  {:<{}} {:>9} {:>10} {:>7}  {}\n", "layout", width, "step ms", "samples/s", "bubble",
                             "MiB per daemon");
    for (size_t i = 0; i < plan->candidates.size(); ++i) {
      const auto& c = plan->candidates[i];
      const std::string bubble = c.layout.kind == "pipeline" ? fmt::format("{:.1f} %", 100 * c.prediction.bubble) : "";
      std::cout << fmt::format(
          "{} {:<{}} {:>9.2f} {:>10.0f} {:>7}  {}{}\n", static_cast<int>(i) == plan->best ? "*" : " ", c.layout.Describe(), width,
          c.prediction.step_s * 1e3, static_cast<double>(request.batch) / c.prediction.step_s, bubble,
          Memory(c.prediction.memory_bytes), c.prediction.fits ? "" : "  (does not fit: " + c.prediction.why_not + ")");
    }
  }
  if (plan->best < 0) {
    std::fprintf(stderr, "%s: no layout fits: %s\n", me, plan->candidates.front().prediction.why_not.c_str());
    return 1;
  }
  if (f.format != "json") {
    std::cout << "wrote " << f.graph.out << ": " << plan->candidates[static_cast<size_t>(plan->best)].layout.Describe() << "\n";
  }
  return 0;
}

}  // namespace

void AddPlanCommand(CLI::App& app) {
  auto f = std::make_shared<PlanFlags>();
  CLI::App* cmd = app.add_subcommand(
      "plan", "Profile a model on the daemons, weigh data-parallel and pipeline layouts, write the fastest as a job file");
  AddTrainingFlags(cmd, f->graph);
  cmd->add_option("--daemons", f->daemons, "Daemons the job will run on (and the local cluster that profiles it)")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  cmd->add_option("--memory-mb", f->memory_mb, "Memory one daemon offers (default: this machine's, shared by the daemons)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 40));
  cmd->add_option("--costs", f->costs, "Plan from this cost table (a profiling job's costs.json) instead of profiling here");
  cmd->add_option("--save-costs", f->save_costs, "Keep the measured cost table in this file");
  cmd->add_option("--profile-job", f->profile_job,
                  "Only write the profiling job to this file (run it on a cluster, then plan with --costs)");
  cmd->add_option("--keep", f->keep_dir, "Keep the profiling run's job, log and outputs in this directory");
  cmd->add_option("--repeats", f->repeats, "Timed runs of each layer pass (their median counts)")
      ->check(CLI::Range(1, 1000))
      ->capture_default_str();
  cmd->add_flag("!--no-calibrate", f->calibrate,
                "Skip the short training run that measures what a training vertex costs beyond its layers");
  cmd->add_option("-o,--format", f->format, "text or json (every candidate, the chosen one and the cost table)")
      ->check(CLI::IsMember({"text", "json"}));
  cmd->callback([f] { ExitCode() = RunPlan(*f); });
}

}  // namespace copse::cli
