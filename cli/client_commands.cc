// Client verbs of a running job manager: submit, status, cancel, daemons, chaos, trace, logs, jobs.
#include <unistd.h>

#include <fstream>
#include <sstream>
#include <iostream>
#include <optional>
#include <thread>

#include "cli/commands.h"
#include "cli/jm_client.h"
#include "cli/job_watch.h"
#include "cli/status_view.h"
#include "cli/trace_client.h"
#include "common/http_server.h"

namespace copse::cli {
namespace {

/// Job ids the job manager hands out (and its journal accepts): 1 to 2^53.
const CLI::Range kJobIdRange(uint64_t{1}, uint64_t{1} << 53, "job id");

/// Connects or prints why not and sets exit code 1.
std::unique_ptr<net::BlockingClient> ConnectOrReport(const JmAddressOptions& opts) {
  auto client = ConnectToJm(opts);
  if (!client.ok()) {
    std::cerr << "copse: " << client.status().message() << "\n";
    ExitCode() = 1;
    return nullptr;
  }
  return std::move(*client);
}

/// A live progress display for people: text output to a terminal.
WatchOptions Display(const std::string& format) {
  WatchOptions watch;
  watch.live = format == "text" && isatty(2);
  return watch;
}

int Report(const Status& st) {
  std::cerr << "copse: " << st.message() << "\n";
  return 1;
}

/// One request to the job manager; on any failure prints why, sets exit code 1, and returns
/// nothing.
std::optional<Json> CallOrReport(const JmAddressOptions& opts, const Json& request) {
  auto client = ConnectOrReport(opts);
  if (!client) return std::nullopt;
  auto reply = client->Call(request);
  if (!reply.ok()) {
    ExitCode() = Report(reply.status());
    return std::nullopt;
  }
  return std::move(*reply);
}

struct LogsOptions {
  JmAddressOptions jm;
  uint64_t job = 0;
  std::string vertex, format = "text";
  uint32_t attempt = 0;
  bool follow = false, events = false;
};

/// How often -f asks for more: a vertex's log is read from an offset; the job's event log is
/// built whole at each ask (up to 20,000 lines), so it is asked for less often.
constexpr auto kFollowEvery = std::chrono::milliseconds(250);
constexpr auto kFollowEventsEvery = std::chrono::seconds(1);

/// A request of `copse logs`: with -f, one that outlives a job manager restart, as `status -w`.
Result<Json> CallLogs(std::unique_ptr<net::BlockingClient>& client, const LogsOptions& o, const Json& request) {
  if (!o.follow) return client->Call(request);
  return CallReconnecting(client, request, std::chrono::seconds(30), [&o] { return ConnectToJm(o.jm); });
}

/// The job's event log (or a vertex's lines of it); with -f, new lines as they come until the
/// job ends.
Status FollowEventLog(std::unique_ptr<net::BlockingClient>& client, const LogsOptions& o) {
  auto call = [&](const Json& request) { return CallLogs(client, o, request); };
  size_t shown = 0;
  while (true) {
    COPSE_ASSIGN_OR_RETURN(Json reply, call({{"op", "logs"}, {"job", o.job}, {"vertex", o.vertex}}));
    const Json& lines = reply["lines"];
    for (size_t i = shown; i < lines.size(); ++i) {
      if (o.format == "json") {
        std::cout << Json({{"job", o.job}, {"line", lines[i]}}).dump() << "\n";
      } else {
        std::cout << lines[i].get<std::string>() << "\n";
      }
    }
    std::cout.flush();
    shown = std::max(shown, lines.size());
    if (!o.follow) return Status::OK();
    COPSE_ASSIGN_OR_RETURN(Json status, call({{"op", "status"}, {"job", o.job}}));
    if (status["job"].value("state", "") != "running") {
      if (shown >= lines.size()) {
        // One more read: the lines its end added.
        COPSE_ASSIGN_OR_RETURN(Json last, call({{"op", "logs"}, {"job", o.job}, {"vertex", o.vertex}}));
        for (size_t i = shown; i < last["lines"].size(); ++i) {
          std::cout << (o.format == "json" ? Json({{"job", o.job}, {"line", last["lines"][i]}}).dump()
                                           : last["lines"][i].get<std::string>())
                    << "\n";
        }
      }
      return Status::OK();
    }
    std::this_thread::sleep_for(kFollowEventsEvery);
  }
}

/// What one attempt of a vertex printed (its newest unless --attempt); with -f, what it prints
/// next until it ends. A header naming the attempt goes to standard error.
Status FollowVertexLog(std::unique_ptr<net::BlockingClient>& client, const LogsOptions& o) {
  uint64_t from = 0;
  uint32_t attempt = o.attempt;
  uint32_t headed = UINT32_MAX;  // the attempt the last header named
  bool printed = false;
  while (true) {
    COPSE_ASSIGN_OR_RETURN(
        Json reply,
        CallLogs(client, o, {{"op", "vertex_log"}, {"job", o.job}, {"vertex", o.vertex}, {"attempt", attempt}, {"from", from}}));
    attempt = reply.value("attempt", 0u);
    // Sent ahead to its daemon, it has not started yet: followed as if it ran.
    const bool running = reply.value("running", false) || reply.value("waiting", false);
    if (headed != attempt && o.format == "text") {
      headed = attempt;
      std::string where = reply.contains("daemon") ? " on " + reply["daemon"].get<std::string>() : "";
      std::string how = reply.value("waiting", false) ? "waiting for its predecessors"
                        : running                     ? "running"
                                                      : reply.value("outcome", attempt == 0 ? "not run yet" : "ended");
      std::cerr << "== " << o.vertex << " attempt " << attempt << where << ": " << how << " ==\n";
    }
    for (const Json& r : reply["records"]) {
      printed = true;
      if (o.format == "json") {
        std::cout << Json({{"job", o.job},
                           {"vertex", o.vertex},
                           {"attempt", attempt},
                           {"stream", r.value("stream", "")},
                           {"text", r.value("text", "")}})
                         .dump()
                  << "\n";
      } else {
        std::cout << r.value("text", "");
      }
    }
    std::cout.flush();
    const uint64_t next = reply.value("next", from);
    const bool more = next != from;
    from = next;
    if (more) continue;  // a reply is bounded: read on before waiting
    if (o.follow && !running && o.attempt == 0 && reply.value("newest", 0u) > attempt) {
      // Following the vertex, not one attempt: it ended and the vertex runs again (a retry, a
      // lost daemon, a job manager restart); say so, and follow the new attempt.
      if (!printed && o.format == "text") std::cerr << o.vertex << " attempt " << attempt << " printed nothing\n";
      if (o.format == "text") {
        std::cerr << "== " << o.vertex << " attempt " << attempt << " ended (" << reply.value("outcome", "lost") << ") ==\n";
      }
      attempt = reply.value("newest", 0u);
      from = 0;
      printed = false;
      continue;
    }
    if (!o.follow || !running) break;
    std::this_thread::sleep_for(kFollowEvery);
  }
  if (!printed && o.format == "text") std::cerr << o.vertex << " attempt " << attempt << " printed nothing\n";
  return Status::OK();
}

/// "90s", "30m", "12h", "7d" (a bare number: seconds).
Result<std::chrono::seconds> ParseAge(const std::string& text) {
  size_t used = 0;
  long long n = -1;
  try {
    n = std::stoll(text, &used);
  } catch (const std::exception&) {
  }
  const std::string unit = n >= 0 ? text.substr(used) : "";
  const long long scale = unit.empty() || unit == "s" ? 1 : unit == "m" ? 60 : unit == "h" ? 3600 : unit == "d" ? 86400 : 0;
  if (n < 0 || scale == 0 || n > (1ll << 40) / scale) {
    return Status::InvalidArgument("expected an age such as 90s, 30m, 12h or 7d, got \"" + text + "\"");
  }
  return std::chrono::seconds(n * scale);
}

}  // namespace

void AddClientCommands(CLI::App& app) {
  {
    auto* cmd = app.add_subcommand("submit", "Submit a job file to the job manager");
    struct Opts {
      JmAddressOptions jm;
      std::string file, output_dir, format = "text";
      bool wait = false;
    };
    auto o = std::make_shared<Opts>();
    AddJmAddressFlags(cmd, o->jm);
    cmd->add_option("FILE", o->file, "job file")->required();
    auto* wait = cmd->add_flag("--wait", o->wait,
                               "wait for the job to finish (outliving a job manager restart); exit 0 only when it completed");
    cmd->add_option("--output", o->output_dir, "copy the declared outputs here once the job completed")->needs(wait);
    cmd->add_option("-o,--format", o->format, "text or json")->check(CLI::IsMember({"text", "json"}));
    cmd->callback([o] {
      if (!o->output_dir.empty()) {
        if (Status st = CheckWritableDir(o->output_dir, "--output"); !st.ok()) return void(ExitCode() = Report(st));
      }
      auto client = ConnectOrReport(o->jm);
      if (!client) return;
      auto job = SubmitJobFile(*client, o->file);
      if (!job.ok()) return void(ExitCode() = Report(job.status()));
      if (!o->wait) {
        // "id", as the job's own field is spelled in every status.
        std::cout << (o->format == "json" ? Json({{"id", *job}}).dump() : "submitted job " + std::to_string(*job)) << "\n";
        return;
      }
      auto status = WatchJob(client, *job, Display(o->format), [o] { return ConnectToJm(o->jm); });
      if (!status.ok()) return void(ExitCode() = Report(status.status()));
      if (status->at("state") == "completed" && !o->output_dir.empty()) {
        auto outputs = FetchOutputs(*client, *job, o->output_dir, o->jm);
        if (!outputs.ok()) return void(ExitCode() = Report(outputs.status()));
        (*status)["outputs"] = *outputs;
      }
      std::cout << (o->format == "json"
                        ? status->dump(2) + "\n"
                        : RenderJobStatus(*status, false) + RenderCopiedOutputs(status->value("outputs", Json::array())));
      ExitCode() = status->at("state") == "completed" ? 0 : 1;
    });
  }
  {
    auto* cmd = app.add_subcommand("status", "Show jobs, or one job's progress");
    struct Opts {
      JmAddressOptions jm;
      uint64_t job = 0;
      bool watch = false;
      std::string format = "text", output_dir;
    };
    auto o = std::make_shared<Opts>();
    AddJmAddressFlags(cmd, o->jm);
    auto* job = cmd->add_option("JOB", o->job, "job id")->check(kJobIdRange);
    cmd->add_flag("-w,--watch", o->watch, "follow the job until it finishes (outliving a job manager restart)");
    cmd->add_option("--output", o->output_dir, "copy the job's declared outputs here (it must have completed)")->needs(job);
    cmd->add_option("-o,--format", o->format, "text or json")->check(CLI::IsMember({"text", "json"}));
    cmd->callback([o] {
      if (!o->output_dir.empty()) {  // before a wait that may be long
        if (Status st = CheckWritableDir(o->output_dir, "--output"); !st.ok()) return void(ExitCode() = Report(st));
      }
      auto client = ConnectOrReport(o->jm);
      if (!client) return;
      if (o->job == 0) {
        auto reply = client->Call({{"op", "status"}});
        if (!reply.ok()) return void(ExitCode() = Report(reply.status()));
        std::cout << (o->format == "json" ? (*reply)["jobs"].dump(2) + "\n" : RenderJobsTable((*reply)["jobs"]));
        return;
      }
      // -w -o json: one JSON object per line at each change, as `kubectl get -w -o json`.
      const bool stream = o->watch && o->format == "json";
      WatchOptions watch = Display(o->format);
      if (stream) {
        watch.interval = std::chrono::milliseconds(250);
        watch.on_change = [](const Json& status) { std::cout << status.dump() << std::endl; };
      }
      Result<Json> status =
          o->watch ? WatchJob(client, o->job, watch, [o] { return ConnectToJm(o->jm); }) : [&]() -> Result<Json> {
        COPSE_ASSIGN_OR_RETURN(Json r, client->Call({{"op", "status"}, {"job", o->job}}));
        return r["job"];
      }();
      if (!status.ok()) return void(ExitCode() = Report(status.status()));
      if (!o->output_dir.empty()) {
        if (status->at("state") != "completed") {
          std::cout << (o->format == "json" ? status->dump(2) + "\n" : RenderJobStatus(*status, false));
          return void(ExitCode() = Report(Status::FailedPrecondition(
                          "job " + std::to_string(o->job) + " is " + status->at("state").get<std::string>() +
                          ": only a completed job's outputs can be copied" + (o->watch ? "" : " (-w waits for it)"))));
        }
        auto outputs = FetchOutputs(*client, o->job, o->output_dir, o->jm);
        if (!outputs.ok()) return void(ExitCode() = Report(outputs.status()));
        (*status)["outputs"] = *outputs;
        if (stream) std::cout << status->dump() << "\n";  // the final line, with where the outputs went
      }
      const std::string copied = o->output_dir.empty() ? "" : RenderCopiedOutputs(status->value("outputs", Json::array()));
      if (!stream) std::cout << (o->format == "json" ? status->dump(2) + "\n" : RenderJobStatus(*status, false) + copied);
      // Waiting for a job, as kubectl wait: success only when it completed.
      if (o->watch && status->at("state") != "completed") ExitCode() = 1;
    });
  }
  {
    auto* cmd = app.add_subcommand("cancel", "Cancel a running job");
    auto jm = std::make_shared<JmAddressOptions>();
    auto job = std::make_shared<uint64_t>(0);
    AddJmAddressFlags(cmd, *jm);
    cmd->add_option("JOB", *job, "job id")->check(kJobIdRange)->required();
    cmd->callback([jm, job] {
      auto reply = CallOrReport(*jm, {{"op", "cancel"}, {"job", *job}});
      if (!reply) return;
      std::cout << "cancelled job " << *job << "\n";
    });
  }
  {
    auto* cmd = app.add_subcommand("daemons", "List the daemons the job manager knows");
    auto jm = std::make_shared<JmAddressOptions>();
    auto format = std::make_shared<std::string>("text");
    auto all = std::make_shared<bool>(false);
    AddJmAddressFlags(cmd, *jm);
    cmd->add_option("-o,--format", *format, "text or json")->check(CLI::IsMember({"text", "json"}));
    cmd->add_flag("--all", *all,
                  "also list earlier registrations of a name, superseded when it registered again (json lists every one)");
    cmd->callback([jm, format, all] {
      auto reply = CallOrReport(*jm, {{"op", "daemons"}});
      if (!reply) return;
      std::cout << (*format == "json" ? (*reply)["daemons"].dump(2) + "\n" : RenderDaemonsTable((*reply)["daemons"], *all));
    });
  }
  {
    auto* cmd = app.add_subcommand("chaos", "Inject faults into a running cluster, targeted or seeded-random");
    cmd->require_subcommand(1);
    auto jm = std::make_shared<JmAddressOptions>();
    auto format = std::make_shared<std::string>("text");
    cmd->add_option("-o,--format", *format, "text or json (the job manager's answer)")->check(CLI::IsMember({"text", "json"}));
    auto send = [jm, format](Json request) {
      auto reply = CallOrReport(*jm, request);
      if (!reply) return;
      std::cout << (*format == "json" ? (*reply)["done"].dump() + "\n" : RenderChaosReply((*reply)["done"]));
    };
    struct Opts {
      std::string daemon, vertex, kinds = "kill,fail,delay,corrupt,cut";
      uint64_t job = 0, seed = 1;
      int64_t ms = 1000, interval_ms = 500, duration_s = 10;
      std::vector<int> attempts;
    };
    auto o = std::make_shared<Opts>();
    auto* kill = cmd->add_subcommand("kill", "SIGKILL a daemon");
    kill->add_option("DAEMON", o->daemon, "daemon name")->required();
    kill->callback([o, send] { send({{"op", "chaos"}, {"action", "kill"}, {"daemon", o->daemon}}); });
    auto* cut = cmd->add_subcommand("cut", "Cut a daemon off from the job manager for a while");
    cut->add_option("DAEMON", o->daemon, "daemon name")->required();
    cut->add_option("--ms", o->ms, "how long")->check(CLI::Range(int64_t{1}, int64_t{3600000}))->capture_default_str();
    cut->callback([o, send] { send({{"op", "chaos"}, {"action", "cut"}, {"daemon", o->daemon}, {"ms", o->ms}}); });
    for (const char* action : {"fail", "delay", "corrupt", "drop"}) {
      std::string help = std::string(action) == "fail"      ? "Make the next attempt (or --attempts) of a vertex fail"
                         : std::string(action) == "delay"   ? "Make the next attempt (or --attempts) of a vertex slow"
                         : std::string(action) == "corrupt" ? "Damage a vertex's stored output once it completed"
                                                            : "Delete a vertex's stored output once it completed";
      auto* sub = cmd->add_subcommand(action, help);
      sub->add_option("JOB", o->job, "job id")->check(kJobIdRange)->required();
      sub->add_option("VERTEX", o->vertex, "vertex name, e.g. count[1]")->required();
      if (std::string(action) == "fail" || std::string(action) == "delay") {
        sub->add_option("--attempts", o->attempts, "attempt numbers, e.g. 1,2 (default: the next one)")
            ->delimiter(',')
            ->check(CLI::Range(1, 1000));
      }
      if (std::string(action) == "delay") {
        sub->add_option("--ms", o->ms, "how much slower")
            ->check(CLI::Range(int64_t{0}, int64_t{86'400'000}))
            ->capture_default_str();
      }
      sub->callback([o, send, a = std::string(action)] {
        Json req = {{"op", "chaos"}, {"action", a}, {"job", o->job}, {"vertex", o->vertex}, {"ms", o->ms}};
        if (!o->attempts.empty()) req["attempts"] = o->attempts;
        send(req);
      });
    }
    auto* random = cmd->add_subcommand("random", "Inject seeded random faults every interval for a while");
    random->add_option("--seed", o->seed, "random seed: the same seed repeats the same choices")
        ->check(Unsigned64())
        ->capture_default_str();
    random->add_option("--interval-ms", o->interval_ms, "time between faults")
        ->check(CLI::Range(int64_t{10}, int64_t{3600000}))
        ->capture_default_str();
    random->add_option("--duration-s", o->duration_s, "how long to keep injecting")
        ->check(CLI::Range(int64_t{1}, int64_t{86400}))
        ->capture_default_str();
    random->add_option("--kinds", o->kinds, "comma-separated: kill, fail, delay, corrupt, cut")->capture_default_str();
    random->add_option("--cut-ms", o->ms, "how long a cut daemon stays away")
        ->check(CLI::Range(int64_t{1}, int64_t{3'600'000}))
        ->capture_default_str();
    random->callback([o, send] {
      std::vector<std::string> kinds;
      std::stringstream ss(o->kinds);
      for (std::string k; std::getline(ss, k, ',');) kinds.push_back(k);
      send({{"op", "chaos"},
            {"action", "random"},
            {"seed", o->seed},
            {"interval_ms", o->interval_ms},
            {"duration_ms", o->duration_s * 1000},
            {"kinds", kinds},
            {"cut_ms", o->ms}});
    });
    auto* stop = cmd->add_subcommand("stop", "Stop random fault injection");
    stop->callback([send] { send({{"op", "chaos"}, {"action", "stop"}}); });
    for (auto* sub : cmd->get_subcommands({})) AddJmAddressFlags(sub, *jm);
  }
  {
    auto* cmd = app.add_subcommand("trace", "Write a job's execution trace (Chrome/Perfetto trace-event JSON)");
    auto jm = std::make_shared<JmAddressOptions>();
    auto job = std::make_shared<uint64_t>(0);
    auto out = std::make_shared<std::string>();
    AddJmAddressFlags(cmd, *jm);
    cmd->add_option("JOB", *job, "job id")->check(kJobIdRange)->required();
    cmd->add_option("-f,--file", *out, "write here instead of standard output (open in ui.perfetto.dev or chrome://tracing)");
    cmd->callback([jm, job, out] {
      auto client = ConnectOrReport(*jm);
      if (!client) return;
      // Written as it arrives: a million attempts make some 200 MB of it.
      Status st = out->empty() ? WriteTrace(*client, *job, std::cout) : WriteTraceFile(*client, *job, *out);
      if (!st.ok()) ExitCode() = Report(st);
    });
  }
  {
    auto* cmd = app.add_subcommand("logs", "Show what a vertex printed, or a job's event log");
    auto o = std::make_shared<LogsOptions>();
    AddJmAddressFlags(cmd, o->jm);
    cmd->add_option("JOB", o->job, "job id")->check(kJobIdRange)->required();
    cmd->add_option("VERTEX", o->vertex, "a vertex, e.g. count[1]: what its attempt printed (without: the job's event log)");
    cmd->add_option("--attempt", o->attempt, "which attempt of VERTEX (default: its newest)")->check(CLI::Range(1, 1 << 30));
    cmd->add_flag("-f,--follow", o->follow, "keep printing what comes until the attempt (or the job) ends");
    cmd->add_flag("--events", o->events, "VERTEX's lines of the job's event log (placements, failures) instead");
    cmd->add_option("-o,--format", o->format, "text, or json: one JSON object per line")->check(CLI::IsMember({"text", "json"}));
    cmd->callback([o] {
      auto client = ConnectOrReport(o->jm);
      if (!client) return;
      const Status st = o->vertex.empty() || o->events ? FollowEventLog(client, *o) : FollowVertexLog(client, *o);
      if (!st.ok()) ExitCode() = Report(st);
    });
  }
  {
    auto* cmd = app.add_subcommand("jobs", "List the jobs the job manager runs and remembers, finished ones from its history");
    struct Opts {
      JmAddressOptions jm;
      std::string since, format = "text";
    };
    auto o = std::make_shared<Opts>();
    AddJmAddressFlags(cmd, o->jm);
    cmd->add_option("--since", o->since, "only jobs submitted within this long, e.g. 90s, 30m, 12h, 7d");
    cmd->add_option("-o,--format", o->format, "text or json")->check(CLI::IsMember({"text", "json"}));
    cmd->callback([o] {
      int64_t since_unix_ms = 0;
      if (!o->since.empty()) {
        auto age = ParseAge(o->since);
        if (!age.ok()) {
          std::cerr << "copse jobs: --since: " << age.status().message() << "\n";
          return void(ExitCode() = 2);
        }
        since_unix_ms =
            std::chrono::duration_cast<std::chrono::milliseconds>((std::chrono::system_clock::now() - *age).time_since_epoch())
                .count();
      }
      auto reply = CallOrReport(o->jm, {{"op", "jobs"}, {"since_unix_ms", since_unix_ms}});
      if (!reply) return;
      std::cout << (o->format == "json" ? (*reply)["jobs"].dump(2) + "\n"
                                        : RenderJobsTable((*reply)["jobs"], /*submitted=*/true));
    });
  }
  {
    auto* cmd = app.add_subcommand("dashboard", "Print a link that opens the job manager's dashboard, logged in");
    struct Opts {
      JmAddressOptions jm;
      std::string http;
      bool admin = false;
    };
    auto o = std::make_shared<Opts>();
    AddJmAddressFlags(cmd, o->jm);
    cmd->add_option("--http", o->http, "the dashboard's HOST:PORT (default: the state directory's http.addr)");
    cmd->add_flag("--admin", o->admin,
                  "log in with the cluster's secret (cancel and chaos allowed) instead of its read-only viewer token");
    cmd->callback([o] {
      std::string address = o->http;
      if (address.empty()) {
        const auto dir = o->jm.state_dir.empty() ? DefaultStateDir() : std::filesystem::path(o->jm.state_dir);
        std::ifstream(dir / "http.addr") >> address;
        if (address.empty()) {
          std::cerr << "copse dashboard: no " << (dir / "http.addr").string()
                    << ": start the job manager with --http HOST:PORT, or give --http\n";
          return void(ExitCode() = 1);
        }
      }
      auto secret = LoadClientSecret(o->jm);
      if (!secret.ok()) return void(ExitCode() = Report(secret.status()));
      // In the fragment, which browsers never send: the token stays out of servers' and proxies' logs.
      std::cout << "http://" << address << "/#token=" << (o->admin ? http::AdminToken(*secret) : http::ViewerToken(*secret))
                << "\n";
    });
  }
}

}  // namespace copse::cli
