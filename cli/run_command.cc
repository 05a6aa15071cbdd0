// `copse run FILE`: the embedded default. Starts a job manager and N daemons as real processes
// on loopback (the same code paths as a cluster), submits the job, shows live progress,
// writes the declared outputs, tears everything down, and exits with the job's result.
#include <signal.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <optional>
#include <thread>

#include <fmt/format.h>

#include "cli/commands.h"
#include "cli/jm_client.h"
#include "cli/job_watch.h"
#include "cli/process_util.h"
#include "cli/run_directory.h"
#include "cli/program_catalog.h"
#include "cli/status_view.h"
#include "cli/trace_client.h"
#include "common/auth.h"
#include "common/machine_memory.h"
#include "jobmanager/gang_needs.h"
#include "jobmanager/job_loader.h"
#include "ml/graph_gen.h"
#include "ml/pipeline_bubble.h"

namespace copse::cli {
namespace {

std::atomic<bool> g_interrupted{false};

struct RunOpts {
  std::string file;
  int daemons = 2;
  int cpus = 2;
  int gpus = 0;
  std::string output_dir = "copse-output";
  std::string format = "text";
  std::string keep_dir;
  std::string trace_file;
  int heartbeat_timeout_ms = 1000;
  bool chain_dispatch = true;
  bool local_socket = true;
  bool restart_daemons = true;
};

/// "51.2 %" for 0.512.
std::string FormatPercent(double share) {
  char text[32];
  std::snprintf(text, sizeof text, "%.1f %%", 100 * share);
  return text;
}

/// The job's last completed attempt of each vertex, from the job manager's trace (µs).
std::optional<std::map<std::string, ml::Span>> CompletedSpans(net::BlockingClient& client, uint64_t job) {
  std::map<std::string, ml::Span> spans;
  auto trace = ReceiveTrace(client, job, [&](const Json& e) {
    if (e.value("ph", "") != "X" || !e.contains("args") || e["args"].value("outcome", "") != "completed") return;
    const double ts = e.value("ts", 0.0), dur = e.value("dur", 0.0);
    spans[e.value("name", "")] = {ts, ts + dur};  // the last completed attempt
  });
  if (!trace.ok()) return std::nullopt;
  return spans;
}

/// For a pipeline training job (metrics.json's config), the bubble measured from the job
/// manager's per-attempt spans (with each stage's idle share, and the bubble replayed without
/// gaps: what the stages' own imbalance leaves) next to the theory; nullopt for other jobs.
std::optional<Json> PipelineBubble(const std::map<std::string, ml::Span>& spans, const Json& config) {
  if (config.value("kind", "") != "pipeline") return std::nullopt;
  // Interleaved: `stages` daemons of `chunks` model chunks each, stage s on daemon s mod stages.
  const int devices = config.value("stages", 0), microbatches = config.value("microbatches", 0);
  const int chunks = config.value("schedule", "") == "interleaved" ? config.value("virtual_stages", 1) : 1;
  if (devices < 1 || microbatches < 1 || chunks < 1) return std::nullopt;
  const int stages = devices * chunks;
  auto measured = ml::MeasuredBubble(spans, stages, microbatches, devices);
  if (!measured) return std::nullopt;
  Json out = {{"measured", measured->mean},
              {"stage_idle", measured->stage_idle},
              {"theory", ml::TheoreticalBubble(devices, microbatches, chunks)},
              {"stages", devices},
              {"microbatches", microbatches}};
  if (chunks > 1) out["virtual_stages"] = chunks;
  if (auto ideal = ml::MeasuredBubble(ml::WithoutGaps(spans, stages, devices), stages, microbatches, devices)) {
    out["without_gaps"] = ideal->mean;
  }
  return out;
}

/// A training job's steady step time in ms: the median interval between the ends of
/// consecutive steps (ml::StepEndStage's vertices), the first step (warm-up) left out; 0 when
/// the trace has fewer than three.
double MeasuredStepMs(const std::map<std::string, ml::Span>& spans, const Json& config) {
  const std::string update =
      ml::StepEndStage(config.value("kind", ""), config.value("reducer", ""), config.value("tensor_parallel", 1));
  std::vector<double> ends;
  for (int64_t t = 0;; ++t) {
    auto it = spans.find(update + "[" + std::to_string(t) + "]");
    if (it == spans.end()) break;
    ends.push_back(it->second.end);
  }
  std::vector<double> steps;
  for (size_t t = 2; t < ends.size(); ++t) steps.push_back((ends[t] - ends[t - 1]) / 1e3);
  if (steps.empty()) return 0;
  std::nth_element(steps.begin(), steps.begin() + static_cast<ptrdiff_t>(steps.size() / 2), steps.end());
  return steps[steps.size() / 2];
}

/// For a job `copse plan` wrote (metrics.json's config.plan): its predicted step time and
/// throughput next to what the run measured (and the bubble, for a pipeline); nullopt otherwise.
std::optional<Json> PlanAgainstRun(const Json& config, const Json& metrics, const Json& summary, double step_ms) {
  // A hand-edited job may carry anything there: only numbers (and a layout string) count.
  const Json plan = config.value("plan", Json());
  auto positive = [&](const char* key) { return plan.contains(key) && plan[key].is_number() && plan[key].get<double>() > 0; };
  // "images_per_s": what copse plan wrote before it planned gpt models.
  const char* rate = positive("samples_per_s") ? "samples_per_s" : "images_per_s";
  if (!plan.is_object() || !positive(rate) || !positive("step_ms")) return std::nullopt;
  Json out = {{"layout", plan.contains("layout") && plan["layout"].is_string() ? plan["layout"] : Json("")},
              {"predicted_samples_per_s", plan[rate]},
              {"predicted_step_ms", plan["step_ms"]}};
  // The run's own images/s counts its start (the first step, loading the data); the step
  // time is the steady one, as the plan predicts it.
  const double measured = metrics.value("images_per_s", 0.0);
  if (measured > 0) out["measured_images_per_s"] = measured;
  if (step_ms > 0) out["measured_step_ms"] = step_ms;
  if (plan.contains("bubble") && plan["bubble"].is_number()) out["predicted_bubble"] = plan["bubble"];
  if (summary.contains("pipeline_bubble")) out["measured_bubble"] = summary["pipeline_bubble"]["measured"];
  return out;
}

/// The local cluster's processes and files; torn down on destruction.
class LocalCluster {
 public:
  // The processes stop first; their directory (a member) goes after them.
  ~LocalCluster() { StopChildren(pids_, 2000); }

  Status Start(const RunOpts& o) {
    COPSE_ASSIGN_OR_RETURN(run_dir_, RunDirectory::Make(o.keep_dir, "copse-run"));
    const std::filesystem::path& dir = run_dir_->path();
    auto state = dir / "jm";
    std::vector<std::string> jm_args = {"jm",
                                        "--listen",
                                        "127.0.0.1:0",
                                        "--state-dir",
                                        state.string(),
                                        "--heartbeat-timeout-ms",
                                        std::to_string(o.heartbeat_timeout_ms)};
    if (!o.chain_dispatch) jm_args.push_back("--no-chain-dispatch");
    // Supervised daemons come back on their work dirs within moments, their file outputs with
    // them: the job manager's return grace holds those meanwhile. Unsupervised, a lost one's
    // outputs are not worth waiting for.
    restart_daemons_ = o.restart_daemons;
    if (!restart_daemons_) jm_args.insert(jm_args.end(), {"--daemon-return-grace-ms", "0"});
    COPSE_ASSIGN_OR_RETURN(pid_t jm, SpawnSelf(jm_args, {}, (dir / "jm.log").string()));
    pids_.push_back(jm);
    jm_ = jm;
    // Each daemon starts its servers and registers; on a small machine a hundred of them take a while.
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20) + std::chrono::milliseconds(500) * o.daemons;
    while (!std::filesystem::exists(state / "jm.addr")) {
      if (ChildExited(jm) || std::chrono::steady_clock::now() > deadline) {
        return Status::Unavailable("the job manager did not start; see " + (dir / "jm.log").string());
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    address_.state_dir = state.string();
    address_.secret_file = (state / auth::kSecretFileName).string();  // whatever $COPSE_TOKEN_FILE names
    COPSE_ASSIGN_OR_RETURN(auto text, ReadFile((state / "jm.addr").string()));
    address_.jm = text.substr(0, text.find('\n'));
    for (int i = 0; i < o.daemons; ++i) {
      std::string name = "d" + std::to_string(i);
      std::map<std::string, std::string> env = {{"COPSE_TOKEN_FILE", (state / auth::kSecretFileName).string()}};
      if (o.gpus > 0) {  // daemon i's own devices: i*G .. i*G+G-1 (NCCL wants one rank per GPU)
        std::string devices;
        for (int k = 0; k < o.gpus; ++k) devices += (k ? "," : "") + std::to_string(i * o.gpus + k);
        env["CUDA_VISIBLE_DEVICES"] = devices;
      }
      std::vector<std::string> args = {"daemon",
                                       "--jm",
                                       address_.jm,
                                       "--name",
                                       name,
                                       "--cpus",
                                       std::to_string(o.cpus),
                                       "--gpus",
                                       std::to_string(o.gpus),
                                       "--work-dir",
                                       (dir / name).string(),
                                       "--label",
                                       "host=local"};
      if (!o.local_socket) args.push_back("--no-local-socket");
      DaemonProcess daemon{name, std::move(args), std::move(env), (dir / (name + ".log")).string()};
      COPSE_ASSIGN_OR_RETURN(pid_t d, SpawnSelf(daemon.args, daemon.env, daemon.log));
      pids_.push_back(d);
      daemons_[d] = std::move(daemon);
    }
    COPSE_ASSIGN_OR_RETURN(client_, ConnectToJm(address_));
    while (true) {
      COPSE_ASSIGN_OR_RETURN(Json reply, client_->Call({{"op", "daemons"}}));
      if (static_cast<int>(reply["daemons"].size()) >= o.daemons) break;
      if (std::chrono::steady_clock::now() > deadline) {
        return Status::Unavailable("only " + std::to_string(reply["daemons"].size()) + " of " + std::to_string(o.daemons) +
                                   " daemons registered; see the logs in " + dir.string());
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return Status::OK();
  }

  /// Leaves the cluster's directory (its processes' logs) in place when this cluster is gone.
  void KeepLogs() {
    if (run_dir_) run_dir_->Keep();
  }

  net::BlockingClient& client() { return *client_; }
  const JmAddressOptions& address() const { return address_; }

  /// OK while a job can still make progress here. A daemon that exited (killed by `copse
  /// chaos`, a job's fault, the kernel) is started again on its work dir under its name, as
  /// Dask's nanny or systemd's Restart=always would (unless --no-restart-daemons): it
  /// registers with the outputs its store kept. A daemon that keeps exiting at once is started
  /// again after a growing pause, up to 5 s. Without restarts, once the job manager or every
  /// daemon has exited the job would wait for ever.
  Status CanProgress() {
    const auto now = std::chrono::steady_clock::now();
    for (auto it = daemons_.begin(); it != daemons_.end();) {
      if (!ChildExited(it->first)) {
        ++it;
        continue;
      }
      std::erase(pids_, it->first);  // reaped: its id may be reused, so never signal it again
      DaemonProcess daemon = std::move(it->second);
      it = daemons_.erase(it);
      if (!restart_daemons_) {
        exited_.push_back(daemon.name);
        continue;
      }
      // Quick exits in a row (refused while its predecessor still looked alive, or crashing
      // at start) back off; one that ran a while restarts at once; one that never stays up
      // (its work dir held by another process, say) is given up on, so the run can end.
      daemon.quick_exits = now - daemon.started < std::chrono::seconds(5) ? daemon.quick_exits + 1 : 0;
      if (daemon.quick_exits > kMaxQuickExits) {
        std::cerr << "copse run: daemon " << daemon.name << " exited " << daemon.quick_exits
                  << " times in a row within 5 s of its start; not restarting it (see its log)\n";
        exited_.push_back(daemon.name);
        continue;
      }
      daemon.restart_at =
          now + std::min(std::chrono::milliseconds(5000),
                         std::chrono::milliseconds(50) * (1 << std::min(daemon.quick_exits, 7)) - std::chrono::milliseconds(50));
      std::cerr << "copse run: daemon " << daemon.name << " exited; restarting it on its work dir\n";
      restarting_.push_back(std::move(daemon));
    }
    for (auto it = restarting_.begin(); it != restarting_.end();) {
      if (now < it->restart_at) {
        ++it;
        continue;
      }
      it->started = now;
      ++restarts_;
      COPSE_ASSIGN_OR_RETURN(pid_t d, SpawnSelf(it->args, it->env, it->log));
      pids_.push_back(d);
      daemons_[d] = std::move(*it);
      it = restarting_.erase(it);
    }
    const std::string logs = run_dir_->temporary() ? "" : "; see the logs in " + run_dir_->path().string();
    if (jm_ > 0 && ChildExited(jm_)) {
      std::erase(pids_, jm_);
      jm_ = 0;
    }
    if (jm_ == 0) return Status::Unavailable("the job manager exited" + logs);
    if (daemons_.empty() && restarting_.empty()) {
      std::string names;
      for (const auto& n : exited_) names += (names.empty() ? "" : ", ") + n;
      return Status::Unavailable(
          "every daemon exited (" + names + ")" +
          (restart_daemons_ ? ", and none stays up when restarted" : ", and --no-restart-daemons was given") +
          ": the job cannot go on" + logs);
    }
    return Status::OK();
  }

  /// How many times a daemon was started again.
  int restarts() const { return restarts_; }

 private:
  std::unique_ptr<RunDirectory> run_dir_;
  std::vector<pid_t> pids_;  // every child still to stop
  pid_t jm_ = 0;             // 0 once it has exited
  /// A local daemon: how it is started, again after it exits.
  struct DaemonProcess {
    std::string name;
    std::vector<std::string> args;
    std::map<std::string, std::string> env;
    std::string log;
    std::chrono::steady_clock::time_point started = std::chrono::steady_clock::now();
    int quick_exits = 0;  // in a row, each within 5 s of its start
    std::chrono::steady_clock::time_point restart_at{};
  };
  bool restart_daemons_ = true;
  static constexpr int kMaxQuickExits = 10;
  std::map<pid_t, DaemonProcess> daemons_;  // running ones, by pid
  std::vector<DaemonProcess> restarting_;   // exited, to start again at restart_at
  std::vector<std::string> exited_;         // daemons that exited and stay so, in the order seen
  int restarts_ = 0;
  JmAddressOptions address_;
  std::unique_ptr<net::BlockingClient> client_;
};

/// The memory each local daemon offers (this machine's, as `copse daemon` defaults to), as
/// placement counts it: unaccounted when the machine's is unknown.
int64_t LocalDaemonMemoryMb() {
  const int64_t memory = MachineMemoryMb();
  return memory > 0 ? memory : jm::kUnaccountedMemoryMb;
}

/// Why a gang of `g` would wait for ever on the local cluster (nothing joins it): one of its
/// affinity groups needs more than a daemon offers, or the whole gang more than all of them.
/// "" when every gang may be placed.
std::string GangTheseDaemonsCannotHold(const jm::JobGraph& g, const RunOpts& o) {
  jm::GangNeeds needs(g);
  std::vector<jm::DaemonCapacity> daemons;
  const int64_t memory = LocalDaemonMemoryMb();
  for (int i = 0; i < o.daemons; ++i) daemons.push_back({DaemonId(static_cast<uint32_t>(i)), double(o.cpus), o.gpus, memory});
  for (const auto& gang : g.gangs()) {
    if (std::string why = needs.WhyUnplaceable(gang.id, daemons); !why.empty()) return why;
    const jm::Resources whole = needs.Whole(gang.id);
    const int64_t all_memory = std::min(memory * o.daemons, jm::kUnaccountedMemoryMb);
    if (!jm::Within(whole, o.daemons * o.cpus, o.daemons * o.gpus, all_memory)) {
      return fmt::format("a gang of {} (with {}) needs {} at once; the {} local daemons offer {}", gang.members.size(),
                         g.vertex(gang.members[0]).name, jm::DescribeResources(whole), o.daemons,
                         jm::DescribeResources({double(o.daemons) * o.cpus, o.daemons * o.gpus, all_memory}, whole));
    }
  }
  return "";
}

int RunJob(const RunOpts& o) {
  bool json = o.format == "json";
  jm::JobLoad load = jm::LoadJobFile(o.file, Catalog());
  if (!load.ok()) {
    if (json) {
      std::cout << Json({{"state", "invalid"}, {"errors", load.diags.ToJson()}}).dump(2) << "\n";
    } else {
      std::cerr << load.status().message() << "\n";
    }
    return 1;
  }
  // A vertex bigger than every local daemon would wait for ever: say so now.
  const int64_t memory = LocalDaemonMemoryMb();
  for (const auto& stage : load.graph->spec().stages) {
    if (jm::Within(stage.resources, o.cpus, o.gpus, memory)) continue;
    std::cerr << "copse run: stage " << stage.name << " needs " << jm::DescribeResources(stage.resources)
              << " per vertex; each local daemon offers " << o.cpus << " (--cpus) and " << o.gpus << " (--gpus)"
              << (stage.resources.memory_mb > 0 ? " and " + std::to_string(memory) + " MB of memory (this machine's)" : "")
              << "\n";
    return 1;
  }
  if (std::string why = GangTheseDaemonsCannotHold(*load.graph, o); !why.empty()) {
    std::cerr << "copse run: " << why << " (--daemons, --cpus, --gpus; each local daemon offers this machine's memory)\n";
    return 1;
  }
  // Where the results go must take them: found out now, not after a long run.
  if (!load.graph->spec().outputs.empty()) {
    if (Status st = CheckWritableDir(o.output_dir, "--output"); !st.ok()) {
      std::cerr << "copse run: " << st.message() << "\n";
      return 1;
    }
  }
  if (!o.trace_file.empty()) {
    std::error_code ec;
    const auto parent = std::filesystem::absolute(o.trace_file, ec).parent_path();
    if (ec || !std::filesystem::is_directory(parent) || ::access(parent.c_str(), W_OK) != 0) {
      std::cerr << "copse run: --trace " << o.trace_file << ": " << parent.string()
                << " is not a directory this user can write in\n";
      return 1;
    }
  }
  signal(SIGINT, [](int) { g_interrupted = true; });
  signal(SIGTERM, [](int) { g_interrupted = true; });
  LocalCluster cluster;
  Status st = cluster.Start(o);
  if (!st.ok()) {
    cluster.KeepLogs();  // the message points at them
    std::cerr << "copse run: " << st.message() << "\n";
    return 1;
  }
  auto job = SubmitJob(cluster.client(), *load.graph, o.file);
  if (!job.ok()) {
    std::cerr << "copse run: " << job.status().message() << "\n";
    return 1;
  }
  WatchOptions watch;
  watch.live = !json && isatty(2);
  watch.interrupted = &g_interrupted;
  watch.can_progress = [&] { return cluster.CanProgress(); };
  auto status = WatchJob(cluster.client(), *job, watch);
  if (!status.ok()) {
    std::cerr << "copse run: " << status.status().message() << "\n";
    return 1;
  }
  if (g_interrupted && status->at("state") == "running") {
    (void)cluster.client().Call({{"op", "cancel"}, {"job", *job}});
    std::cerr << "copse run: interrupted; job cancelled\n";
    return 1;
  }
  Json summary = *status;
  if (cluster.restarts() > 0) summary["daemon_restarts"] = cluster.restarts();
  bool trace_written = true;  // a trace asked for and not written fails the command, after the outputs are copied
  if (!o.trace_file.empty()) {
    if (!WriteTraceFile(cluster.client(), *job, o.trace_file).ok()) {
      std::cerr << "copse run: cannot write the trace to " << o.trace_file << "\n";
      trace_written = false;
    }
  }
  if (summary["state"] == "completed") {
    auto outputs = FetchOutputs(cluster.client(), *job, o.output_dir, cluster.address());
    if (!outputs.ok()) {
      std::cerr << "copse run: job completed but its outputs could not be copied: " << outputs.status().message() << "\n";
      return 1;
    }
    summary["outputs"] = *outputs;
    // Training jobs (copse graph …) write metrics.json: its figures belong in the summary.
    for (const auto& out : *outputs) {
      std::string path = out["path"];
      if (std::filesystem::path(path).filename() != "metrics.json") continue;
      if (auto metrics = ReadJsonFile(path); metrics.ok() && metrics->is_object()) {
        for (const char* key : {"test_accuracy", "images_per_s", "final_loss", "train_images", "parameter_digest",
                                "validation_loss", "perplexity", "tokens_per_s", "train_tokens", "sample"}) {
          if (metrics->contains(key)) summary[key] = (*metrics)[key];
        }
        const Json config = metrics->value("config", Json::object());
        const bool planned = config.contains("plan");
        if (config.value("kind", "") != "pipeline" && !planned) continue;
        const auto spans = CompletedSpans(cluster.client(), *job);
        if (!spans) continue;
        if (auto bubble = PipelineBubble(*spans, config)) summary["pipeline_bubble"] = *bubble;
        if (auto plan = PlanAgainstRun(config, *metrics, summary, MeasuredStepMs(*spans, config))) summary["plan"] = *plan;
      }
    }
  }
  if (json) {
    std::cout << summary.dump(2) << "\n";
  } else {
    // The summary is the command's result: on stdout (progress and errors stay on stderr),
    // but not twice on one terminal, where the live display's last frame already showed it.
    const bool shown_live = watch.live && isatty(1);
    if (!shown_live) std::cout << RenderJobStatus(summary, false);
    if (summary.contains("test_accuracy")) {
      std::cout << "  test accuracy " << summary["test_accuracy"].get<double>() * 100 << " %, "
                << static_cast<int64_t>(summary.value("images_per_s", 0.0)) << " images/s\n";
    }
    if (summary.contains("validation_loss")) {
      std::cout << "  validation loss " << summary["validation_loss"].get<double>() << " (perplexity "
                << summary.value("perplexity", 0.0) << "), " << static_cast<int64_t>(summary.value("tokens_per_s", 0.0))
                << " tokens/s\n";
      if (summary.contains("sample")) std::cout << "  sample: " << summary["sample"].dump() << "\n";
    }
    if (summary.contains("pipeline_bubble")) {
      const Json& b = summary["pipeline_bubble"];
      std::string line = "  pipeline bubble " + FormatPercent(b["measured"].get<double>()) + " measured (stages idle ";
      for (size_t s = 0; s < b["stage_idle"].size(); ++s) {
        line += (s ? " / " : "") + FormatPercent(b["stage_idle"][s].get<double>());
      }
      line += ")";
      if (b.contains("without_gaps")) {
        line += ", " + FormatPercent(b["without_gaps"].get<double>()) + " with no gaps between dependent vertices";
      }
      const int chunks = b.value("virtual_stages", 1);
      line += ", " + FormatPercent(b["theory"].get<double>()) + " in theory for equal stages (" +
              (chunks > 1 ? "(p-1)/(v*m+p-1), v=" + std::to_string(chunks) + ", " : "(p-1)/(m+p-1), ") +
              "p=" + std::to_string(b["stages"].get<int>()) + ", m=" + std::to_string(b["microbatches"].get<int>()) + ")\n";
      std::cout << line;
    }
    if (summary.contains("plan")) {
      const Json& p = summary["plan"];
      std::string line = "  plan " + p.value("layout", std::string()) + ": predicted " +
                         std::to_string(static_cast<int64_t>(p["predicted_samples_per_s"].get<double>())) + " samples/s";
      char text[160];
      std::snprintf(text, sizeof text, ", a step %.2f ms", p.value("predicted_step_ms", 0.0));
      line += text;
      if (p.contains("predicted_bubble")) line += ", bubble " + FormatPercent(p["predicted_bubble"].get<double>());
      if (p.contains("measured_step_ms")) {
        const double measured = p["measured_step_ms"].get<double>();
        std::snprintf(text, sizeof text, "; measured a step %.2f ms (%.2fx the prediction)", measured,
                      measured / p.value("predicted_step_ms", 1.0));
        line += text;
      }
      if (p.contains("measured_bubble")) line += ", bubble " + FormatPercent(p["measured_bubble"].get<double>());
      std::cout << line << "\n";
    }
    if (summary.contains("daemon_restarts")) {
      std::cout << "  daemons restarted " << summary["daemon_restarts"].get<int>() << " times on their work dirs\n";
    }
    std::cout << RenderCopiedOutputs(summary.value("outputs", Json::array()));
  }
  return summary["state"] == "completed" && trace_written ? 0 : 1;
}

}  // namespace

void AddRunCommand(CLI::App& app) {
  auto* cmd = app.add_subcommand("run", "Run a job on an embedded local cluster (a job manager and N daemons)");
  auto o = std::make_shared<RunOpts>();
  cmd->add_option("FILE", o->file, "job file")->required();
  cmd->add_option("--daemons", o->daemons, "local daemons to start (named d0 … d<N-1>)")->check(CLI::Range(1, 256));
  cmd->add_option("--cpus", o->cpus, "vertex slots per daemon")->check(CLI::Range(1, 4096));
  cmd->add_option("--gpus", o->gpus, "GPUs per daemon (daemon i gets CUDA devices i*G .. i*G+G-1)")->check(CLI::Range(0, 64));
  cmd->add_option("--output", o->output_dir, "directory for the declared outputs");
  cmd->add_option("-o,--format", o->format, "text or json (the final job summary as one JSON value)")
      ->check(CLI::IsMember({"text", "json"}));
  cmd->add_option("--trace", o->trace_file, "write the job's execution trace (Chrome/Perfetto JSON) here");
  cmd->add_option("--keep", o->keep_dir, "keep the cluster's state, logs and outputs in this directory");
  cmd->add_option("--heartbeat-timeout-ms", o->heartbeat_timeout_ms, "a daemon silent this long is lost")
      ->check(CLI::Range(50, 600000));
  cmd->add_flag("!--no-chain-dispatch", o->chain_dispatch,
                "send every vertex only once its inputs are complete (see copse jm --no-chain-dispatch)");
  cmd->add_flag("!--no-local-socket", o->local_socket,
                "daemons fetch each other's outputs over TCP (see copse daemon --no-local-socket)");
  cmd->add_flag("!--no-restart-daemons", o->restart_daemons,
                "leave a daemon that exited (killed, crashed) dead instead of starting it again on its work dir");
  cmd->callback([o] { ExitCode() = RunJob(*o); });
}

}  // namespace copse::cli
