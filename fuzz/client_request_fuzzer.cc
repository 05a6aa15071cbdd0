// Fuzzes what an authenticated client asks the job manager (jobmanager/client_api.h, as the
// control port and the HTTP API answer it): status, jobs, logs, vertex logs, outputs, cancel,
// daemons and chaos (kill, cut, fail, delay, corrupt, drop). The input is the request's JSON;
// it is answered as the op it names and as every other op, against a scheduler with two
// daemons, one completed job and one running (some of its vertices completed, some running),
// and the dashboard's vertex pages and progress series are read for the job it names.
// Properties beyond "no crash, no sanitizer report": the job manager's contract for a request
// (jm_server.cc's HandleClient) - every answer is an object with a string "op", and the only
// exceptions are the JSON library's type errors and std::invalid_argument (a number out of its
// member's range, common/json_util.h), which the server turns into an error reply; any other
// would end the job manager.
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <string_view>

#include "common/clock.h"
#include "common/json_util.h"
#include "common/logging.h"
#include "fuzz/fuzz_check.h"
#include "fuzz/succeeded.h"
#include "jobmanager/client_api.h"
#include "jobmanager/job_history.h"
#include "jobmanager/job_loader.h"
#include "jobmanager/scheduler.h"

namespace fs = std::filesystem;

namespace {

class RunSink final : public copse::jm::DaemonSink {
 public:
  void SendToDaemon(copse::DaemonId, const copse::protocol::JmToDaemon& m) override {
    if (m.has_run()) runs.push_back(m.run());
  }
  std::vector<copse::protocol::Run> runs;
};

constexpr std::string_view kJob = R"({"name": "j", "stages": [
  {"name": "a", "program": "noop", "replicas": 3}, {"name": "b", "program": "noop", "replicas": 2},
  {"name": "c", "program": "noop"}],
  "edges": [{"from": "a", "to": "b", "pattern": "all_to_all"}, {"from": "b", "to": "c", "pattern": "gather"}],
  "outputs": [{"from": "c", "path": "out.txt"}]})";

std::unique_ptr<copse::jm::JobHistory> g_history;
std::shared_ptr<const copse::jm::JobGraph> g_graph;

void Succeed(copse::jm::Scheduler& s, const copse::protocol::Task& task) {
  copse::jm::AttemptReport r = copse::fuzz::Succeeded(task);
  r.progress = {{"step", 1}, {"loss", 0.5}, {"images", 64}};  // for the progress series
  s.OnAttemptFinished(r);
}

void Answer(copse::jm::ClientApi& api, const std::string& op, const copse::Json& msg) {
  try {
    const auto reply = api.Answer(op, msg);
    if (reply) {
      COPSE_FUZZ_CHECK(reply->is_object());
      COPSE_FUZZ_CHECK(reply->contains("op") && (*reply)["op"].is_string());
    }
  } catch (const copse::Json::exception&) {
    // Answered by the server as "malformed <op> message": the peer's fault, not a crash.
  } catch (const std::invalid_argument&) {
    // A number out of its member's range: answered the same way.
  }
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  copse::SetLogLevel("off");
  const fs::path base = fs::exists("/dev/shm") ? fs::path("/dev/shm") : fs::temp_directory_path();
  const fs::path dir = base / ("copse-fuzz-client-" + std::to_string(::getpid()));
  fs::remove_all(dir);
  auto history = copse::jm::JobHistory::Open(dir);
  COPSE_FUZZ_CHECK(history.ok());
  g_history = std::move(*history);
  auto load = copse::jm::LoadJobText(kJob, "fuzz", copse::jm::ProgramCatalog::AcceptAny());
  COPSE_FUZZ_CHECK(load.ok());
  g_graph = load.graph;
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto parsed = copse::ParseJson(std::string_view(reinterpret_cast<const char*>(data), size), "fuzz");
  if (!parsed.ok() || !parsed->is_object()) return 0;
  const copse::Json& msg = *parsed;

  copse::ManualClock clock;
  RunSink sink;
  copse::jm::Scheduler scheduler(sink, clock);
  for (const char* name : {"d0", "d1"}) {
    copse::jm::DaemonSpec d;
    d.name = name;
    d.cpus = 2;
    COPSE_FUZZ_CHECK(scheduler.AddDaemon(d).ok());
  }
  // Job 1 completes; job 2 runs with its first run message's tasks completed.
  const copse::JobId done = scheduler.Submit(g_graph, "/nonexistent");
  for (int round = 0; round < 10 && scheduler.StateOf(done) == copse::jm::JobState::kRunning; ++round) {
    scheduler.Flush();
    auto runs = std::move(sink.runs);
    sink.runs.clear();
    for (const auto& run : runs)
      for (const auto& task : run.tasks()) Succeed(scheduler, task);
    clock.Advance(std::chrono::milliseconds(100));
    scheduler.Tick();
  }
  COPSE_FUZZ_CHECK(scheduler.StateOf(done) == copse::jm::JobState::kCompleted);
  const copse::JobId running = scheduler.Submit(g_graph, "/nonexistent");
  scheduler.Flush();
  if (!sink.runs.empty() && sink.runs[0].tasks_size() > 0) Succeed(scheduler, sink.runs[0].tasks(0));

  copse::jm::ClientApi api(scheduler, *g_history);
  const std::string op = msg.contains("op") && msg["op"].is_string() ? msg["op"].get<std::string>() : "";
  Answer(api, op, msg);
  for (const char* other : {"status", "jobs", "vertex_log", "logs", "outputs", "daemons", "chaos", "cancel"}) {
    if (other != op) Answer(api, other, msg);
  }
  // The dashboard's reads of the job the request names (or of the running one).
  const copse::JobId job = copse::jm::JobIdFrom(msg).valid() ? copse::jm::JobIdFrom(msg) : running;
  copse::jm::Scheduler::VertexFilter filter;
  if (msg.contains("stage") && msg["stage"].is_string()) filter.stage = msg["stage"].get<std::string>();
  if (msg.contains("state") && msg["state"].is_string()) filter.state = msg["state"].get<std::string>();
  if (msg.contains("offset") && msg["offset"].is_number_unsigned()) filter.offset = msg["offset"].get<size_t>();
  if (msg.contains("limit") && msg["limit"].is_number_unsigned()) filter.limit = msg["limit"].get<size_t>() % 1000;
  (void)api.Vertices(job, filter);
  (void)api.ProgressSeries(job);
  const size_t max_spans =
      msg.contains("max_spans") && msg["max_spans"].is_number_unsigned() ? msg["max_spans"].get<size_t>() : 100;
  (void)api.Trace(job, max_spans % 100000);
  scheduler.Flush();
  return 0;
}
