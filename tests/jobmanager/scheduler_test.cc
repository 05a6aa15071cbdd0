// The job manager's state machine, driven directly: a fake daemon sink records what would be
// sent, a ManualClock stands in for time, and the test plays the daemons' part.
#include <doctest/doctest.h>
#include <unistd.h>

#include <filesystem>
#include <map>

#include "jobmanager/durable_copies.h"
#include "jobmanager/scheduler.h"
#include "tests/jobmanager/job_test_util.h"

namespace copse::jm {
namespace {

using protocol::JmToDaemon;
using protocol::Task;
/// A message sent, or a task it carried, with the daemon it went to.
using Sent = std::pair<DaemonId, JmToDaemon>;
using Placed = std::pair<DaemonId, Task>;

class FakeSink final : public DaemonSink {
 public:
  void SendToDaemon(DaemonId daemon, const JmToDaemon& message) override { sent.emplace_back(daemon, message); }
  /// Tasks sent since the last call, as (daemon, task).
  std::vector<Placed> TakeTasks() {
    std::vector<Placed> tasks;
    for (auto& [d, m] : sent) {
      for (const Task& t : m.run().tasks()) tasks.emplace_back(d, t);
    }
    Keep(JmToDaemon::kRun, false);
    return tasks;
  }
  /// Messages of this kind since the start (or the last Keep that dropped them).
  std::vector<Sent> With(JmToDaemon::BodyCase body) const {
    std::vector<Sent> out;
    for (auto& [d, m] : sent) {
      if (m.body_case() == body) out.emplace_back(d, m);
    }
    return out;
  }
  void Keep(JmToDaemon::BodyCase body, bool keep) {
    std::erase_if(sent, [&](const auto& p) { return (p.second.body_case() == body) != keep; });
  }
  std::vector<Sent> sent;
};

/// Input `port` of `task`, a stored output's: its key, where it is served from, its durable copy.
const protocol::StoredInput& StoredIn(const Task& task, int port) {
  REQUIRE_MESSAGE(port < task.inputs_size(), task.name() << " has " << task.inputs_size() << " inputs");
  REQUIRE_MESSAGE(task.inputs(port).has_stored(), task.name() << " input " << port << " is not a stored output");
  return task.inputs(port).stored();
}

/// The `i`th attempt `task` is chained after.
const protocol::ChainedAfter& After(const Task& task, int i) {
  REQUIRE_MESSAGE(i < task.after_size(), task.name() << " is chained after " << task.after_size() << " attempts");
  return task.after(i);
}

/// Whether input `port` of `task` is read from its producer's store, on `task`'s own daemon
/// (`local`) or another's; false when no store serves it (only a durable copy).
bool ServedFrom(const Task& task, int port, bool local) {
  const protocol::StoredInput& in = StoredIn(task, port);
  return in.has_store() && in.store().local() == local;
}

struct Harness {
  Harness() { sched.set_storage(&storage); }
  explicit Harness(const SchedulerOptions& options) : sched(sink, clock, options) { sched.set_storage(&storage); }
  FakeSink sink;
  ManualClock clock;
  DurableCopyFiles storage;
  Scheduler sched{sink, clock};

  DaemonId AddDaemon(const std::string& name, double cpus = 1) {
    DaemonSpec spec;
    spec.name = name;
    spec.cpus = cpus;
    spec.data_host = "127.0.0.1";
    spec.data_port = static_cast<uint16_t>(9000 + name.back());
    auto id = sched.AddDaemon(spec);
    REQUIRE(id.ok());
    return *id;
  }
  /// Release messages sent so far, once the releases held for the next tick have gone out.
  std::vector<Sent> Releases() {
    sched.Tick();
    sched.Flush();
    return sink.With(JmToDaemon::kRelease);
  }
  JobId Submit(const std::string& text, const std::string& job_dir = "/tmp") {
    JobId id = sched.Submit(testing::MustLoad(text), job_dir);
    sched.Flush();
    return id;
  }
  /// The task sent for vertex `name`, whenever it was sent (a chained task arrives before its
  /// predecessor ends), as (daemon, task); taken from what was sent and not taken yet.
  Placed Next(const std::string& name) {
    for (auto& t : sink.TakeTasks()) unclaimed.push_back(std::move(t));
    auto it = std::find_if(unclaimed.begin(), unclaimed.end(), [&](const auto& t) { return t.second.name() == name; });
    REQUIRE_MESSAGE(it != unclaimed.end(), "no task for " << name);
    auto t = *it;
    unclaimed.erase(it);
    return t;
  }
  /// The first task sent and not taken yet (chained tasks are sent after their predecessor).
  Placed Next() {
    for (auto& t : sink.TakeTasks()) unclaimed.push_back(std::move(t));
    REQUIRE_MESSAGE(!unclaimed.empty(), "no task was sent");
    auto t = unclaimed.front();
    unclaimed.erase(unclaimed.begin());
    return t;
  }
  std::vector<Placed> unclaimed;
  /// Reports a task's attempt as finished and flushes what the scheduler sends in answer.
  void Finish(const Task& task, bool ok, std::vector<uint64_t> bytes = {}, FailureClass cls = protocol::FAILURE_PROGRAM_ERROR,
              int lost_input = -1, bool unreachable = false, double ran_ms = 0) {
    AttemptReport r;
    r.duration_ms = ran_ms;
    r.job = JobId(task.job());
    r.vertex = VertexId(task.vertex());
    r.version = task.version();
    r.ok = ok;
    r.failure = cls;
    r.error = ok ? "" : "boom";
    r.lost_input_port = lost_input;
    r.lost_input_unreachable = unreachable;
    if (bytes.empty()) bytes.assign(task.outputs_size(), 1);
    r.output_bytes = bytes;
    r.output_messages.assign(bytes.size(), 1);
    sched.OnAttemptFinished(r);
    sched.Flush();
  }
  std::string State(JobId job) { return sched.JobStatus(job)["state"]; }
  /// Daemon `name` registering again as a new process (a new data port, 9100), listing `inventory`.
  DaemonId ComeBack(const std::string& name, const OutputInventory& inventory) {
    DaemonSpec spec;
    spec.name = name;
    spec.cpus = 1;
    spec.data_host = "127.0.0.1";
    spec.data_port = 9100;
    auto id = sched.AddDaemon(spec, inventory);
    REQUIRE(id.ok());
    return *id;
  }
  /// A daemon lost for good: its connection dropped and its return grace passed.
  void LoseForGood(DaemonId d) {
    sched.DaemonLost(d, "test");
    clock.Advance(SchedulerOptions().daemon_return_grace + std::chrono::milliseconds(1));
    sched.Tick();
    sched.Flush();
  }
};

const char* kChain = R"({"stages": [{"name": "a", "program": "noop"}, {"name": "b", "program": "noop"},
                                    {"name": "c", "program": "noop"}],
                         "edges": [{"from": "a", "to": "b"}, {"from": "b", "to": "c"}],
                         "outputs": [{"from": "c", "path": "out"}]})";

TEST_CASE("Scheduler.RunsAChainToCompletion") {
  Harness h;
  h.AddDaemon("d0");
  JobId job = h.Submit(kChain);
  for (const char* name : {"a[0]", "b[0]", "c[0]"}) {
    Task t = h.Next(name).second;
    CHECK(t.version() == 1);
    h.Finish(t, true);
  }
  CHECK(h.sink.TakeTasks().empty());
  CHECK(h.State(job) == "completed");
  auto outputs = h.sched.OutputLocations(job);
  REQUIRE(outputs.ok());
  CHECK((*outputs)[0]["path"] == "out");
  // The job's intermediate outputs are collected; the declared one is kept.
  auto gc = h.sink.With(JmToDaemon::kGc);
  REQUIRE(gc.size() == 1);
  CHECK(gc[0].second.gc().keep_size() == 1);
}

TEST_CASE("Scheduler.ATaskCarriesItsStagesMemoryForItsDaemonToEnforce") {
  Harness h;
  h.AddDaemon("d0", 2);
  h.Submit(
      R"({"stages": [{"name": "a", "program": "noop", "resources": {"memory_mb": 300}}, {"name": "b", "program": "noop"}]})");
  CHECK(h.Next("a[0]").second.memory_mb() == 300);
  CHECK(h.Next("b[0]").second.memory_mb() == 0);  // none declared: its daemon's offer bounds it
}

TEST_CASE("Scheduler.TheJobsTableSaysWhyAJobWithNothingRunningWaits") {
  // A job that can never be placed showed as "running 0/1" with the reason only in its own view.
  Harness h;
  h.AddDaemon("d0", 2);
  JobId big = h.Submit(R"({"stages": [{"name": "big", "program": "noop", "resources": {"cpus": 64}}]})");
  JobId fits = h.Submit(R"({"stages": [{"name": "s", "program": "checksum"}]})");
  Json table = h.sched.JobsTable();
  REQUIRE(table.size() == 2);
  CHECK(table[0]["id"] == big.value());
  REQUIRE(table[0].contains("reason"));
  CHECK_MESSAGE(table[0]["reason"].get<std::string>().find("64") != std::string::npos, table[0].dump());
  CHECK_FALSE(table[1].contains("reason"));  // it runs
  (void)fits;
}

TEST_CASE("Scheduler.InputBytesCountAChainedReadersInputs") {
  // A chained task is sent before its producer's size is known: counted at dispatch, a
  // pipeline's input bytes were 17 with chaining against 2,000,051 without.
  Harness h;
  h.AddDaemon("d0", 2);
  JobId job = h.Submit(kChain);
  Task a = h.Next("a[0]").second;
  Task b = h.Next("b[0]").second;  // chained after a, sent before a's report
  REQUIRE(b.after_size() > 0);
  h.Finish(a, true, {1'000'000});
  h.Finish(b, true, {2'000});
  h.Finish(h.Next("c[0]").second, true);
  Json st = h.sched.JobStatus(job);
  CHECK(st["input_bytes"]["local"] == 1'002'000);
  CHECK(st["input_bytes"]["remote"] == 0);
}

TEST_CASE("Scheduler.AJobsFinalResultsJoinItsProgressFigures") {
  // A training job's test accuracy was only in the metrics file copse run copies: every status
  // now shows it beside the last step's figures.
  Harness h;
  h.AddDaemon("d0");
  JobId job = h.Submit(R"({"stages": [{"name": "update", "program": "noop"}, {"name": "eval", "program": "noop"}],
                           "edges": [{"from": "update", "to": "eval"}]})");
  auto report = [&](const Task& task, Json progress) {
    AttemptReport r;
    r.job = job;
    r.vertex = VertexId(task.vertex());
    r.version = task.version();
    r.ok = true;
    r.output_bytes.assign(task.outputs_size(), 1);
    r.output_messages.assign(task.outputs_size(), 1);
    r.progress = std::move(progress);
    h.sched.OnAttemptFinished(r);
    h.sched.Flush();
  };
  // Figures are the program's: a "final" that is not a boolean is a figure like any other, and
  // must not throw inside the job manager (it once would have taken it down).
  report(h.Next("update[0]").second, {{"step", 50}, {"steps", 50}, {"loss", 0.5}, {"final", 1}});
  report(h.Next("eval[0]").second, {{"final", true}, {"test_accuracy", 0.81}});
  const Json progress = h.sched.JobStatus(job)["progress"];
  CHECK(progress["step"] == 50);
  CHECK(progress["loss"] == 0.5);
  CHECK(progress["test_accuracy"] == 0.81);
  CHECK(progress["final"] == 1);  // the update's own figure: eval's "final": true is not kept
}

TEST_CASE("Scheduler.PlacesAVertexWhereMostOfItsInputBytesAre") {
  Harness h;
  DaemonId d0 = h.AddDaemon("d0", 2), d1 = h.AddDaemon("d1", 2);
  JobId job = h.Submit(R"({"stages": [{"name": "small", "program": "noop"}, {"name": "big", "program": "noop"},
                                      {"name": "join", "program": "noop"}],
                           "edges": [{"from": "small", "to": "join"}, {"from": "big", "to": "join"}]})");
  auto tasks = h.sink.TakeTasks();
  REQUIRE(tasks.size() == 2);
  // Least-loaded placement spreads the two sources over both daemons.
  CHECK(tasks[0].first != tasks[1].first);
  DaemonId big_daemon = tasks[0].second.name() == "big[0]" ? tasks[0].first : tasks[1].first;
  for (auto& [d, t] : tasks) h.Finish(t, true, {t.name() == "big[0]" ? 1'000'000u : 10u});
  auto join = h.sink.TakeTasks();
  REQUIRE(join.size() == 1);
  CHECK(join[0].first == big_daemon);
  CHECK(ServedFrom(join[0].second, 1, /*local=*/true));
  CHECK(ServedFrom(join[0].second, 0, /*local=*/false));
  (void)d0, (void)d1, (void)job;
}

TEST_CASE("Scheduler.TraceHasASpanPerAttemptInLanesPerDaemon") {
  Harness h;
  h.AddDaemon("d0", 2);
  JobId job = h.Submit(R"({"stages": [{"name": "s", "program": "noop", "replicas": 2}, {"name": "t", "program": "noop"}],
                           "edges": [{"from": "s", "to": "t", "pattern": "gather"}], "faults": [{"fail": "t"}]})");
  auto s0 = h.Next("s[0]").second, s1 = h.Next("s[1]").second;
  auto t1 = h.Next("t[0]").second;  // chained after both s attempts, on their slots
  h.clock.Advance(std::chrono::milliseconds(10));
  h.Finish(s0, true);
  h.Finish(s1, true);
  h.Finish(t1, false);              // t, attempt 1 (injected)
  h.Finish(h.Next().second, true);  // t, attempt 2
  auto snapshot = h.sched.Trace(job);
  REQUIRE(snapshot.ok());
  const Json trace = TraceJson(*snapshot);
  int spans = 0, failed = 0;
  std::set<int> lanes;
  for (const auto& e : trace["traceEvents"]) {
    if (e["ph"] != "X") continue;
    ++spans;
    failed += e["args"]["outcome"] == "program_error";
    if (e["cat"] == "s") lanes.insert(e["tid"].get<int>());
  }
  CHECK(spans == 4);
  CHECK(failed == 1);
  CHECK(lanes.size() == 2);  // the two overlapping s attempts sit in two lanes
}

TEST_CASE("Scheduler.AChainedAttemptsSpanStartsWhenItRanNotWhenTheJobManagerHeardItCould") {
  // b is chained after a on a's daemon: it starts there the moment a ends, before the job
  // manager hears of a's end. Its span is its own run time, as its daemon measured it.
  Harness h;
  h.AddDaemon("d0", 1);
  JobId job = h.Submit(R"({"stages": [{"name": "a", "program": "noop"}, {"name": "b", "program": "noop"}],
                           "edges": [{"from": "a", "to": "b"}]})");
  auto a = h.Next("a[0]").second;
  auto b = h.Next("b[0]").second;  // chained after a
  h.clock.Advance(std::chrono::milliseconds(10));
  h.Finish(a, true, {}, protocol::FAILURE_PROGRAM_ERROR, -1, false, 10);  // a ran 10 ms; b started then
  h.clock.Advance(std::chrono::milliseconds(30));
  h.Finish(b, true, {}, protocol::FAILURE_PROGRAM_ERROR, -1, false, 35);  // b ran 35 ms, 5 of them before a's report
  auto snapshot = h.sched.Trace(job);
  REQUIRE(snapshot.ok());
  const Json trace = TraceJson(*snapshot);
  double b_dur = 0;
  for (const auto& e : trace["traceEvents"]) {
    if (e["ph"] == "X" && e["name"] == "b[0]") b_dur = e["dur"].get<double>();
  }
  CHECK(b_dur == doctest::Approx(35'000));  // microseconds
}

TEST_CASE("Scheduler.TraceNamesAnAttemptLostWithItsDaemonAndTellsRegistrationsApart") {
  Harness h;
  h.AddDaemon("d0");
  JobId job = h.Submit(R"({"stages": [{"name": "x", "program": "noop"}]})");
  auto [first, t1] = h.Next("x[0]");
  h.LoseForGood(first);
  h.ComeBack("d0", {});  // the same name, registered again: a new process
  h.sched.Flush();
  h.Finish(h.Next("x[0]").second, true);
  REQUIRE(h.State(job) == "completed");
  auto snapshot = h.sched.Trace(job);
  REQUIRE(snapshot.ok());
  const Json trace = TraceJson(*snapshot);
  std::vector<std::string> outcomes, processes;
  for (const auto& e : trace["traceEvents"]) {
    if (e["ph"] == "X") outcomes.push_back(e["args"]["outcome"]);
    if (e["name"] == "process_name") processes.push_back(e["args"]["name"]);
  }
  CHECK(outcomes == std::vector<std::string>{"daemon_lost", "completed"});  // a failure class, like the others
  CHECK(processes == std::vector<std::string>{"daemon d0 (registration 1)", "daemon d0 (registration 2)"});
  (void)t1;
}

TEST_CASE("Scheduler.RetriesWithNewVersionsThenFailsTheJobWithTheReason") {
  Harness h;
  h.AddDaemon("d0");
  JobId job = h.Submit(R"({"stages": [{"name": "x", "program": "noop", "max_attempts": 3}]})");
  for (int attempt = 1; attempt <= 3; ++attempt) {
    auto tasks = h.sink.TakeTasks();
    REQUIRE(tasks.size() == 1);
    CHECK(tasks[0].second.version() == attempt);
    h.Finish(tasks[0].second, false);
  }
  CHECK(h.State(job) == "failed");
  std::string failure = h.sched.JobStatus(job)["failure"];
  CHECK(failure.find("x[0] failed 3 of 3 attempts (program_error): boom") != std::string::npos);
  CHECK(h.sched.JobStatus(job)["recoveries"].size() == 2);
}

TEST_CASE("Scheduler.AVertexWhoseDaemonsKeepDyingUnderItFailsTheJobAtMaxDaemonLosses") {
  // A vertex that crashes its daemon (or kills its parent) would otherwise be placed on every
  // daemon in turn and take the cluster down one by one.
  Harness h;
  for (const char* name : {"d0", "d1", "d2"}) h.AddDaemon(name);
  JobId job = h.Submit(R"({"stages": [{"name": "x", "program": "noop", "max_daemon_losses": 2}]})");
  auto [first, t1] = h.Next("x[0]");
  h.sched.DaemonLost(first, "connection closed: EOF");
  h.sched.Flush();
  CHECK(h.State(job) == "running");
  Json st = h.sched.JobStatus(job);
  REQUIRE(st["recoveries"].size() == 1);
  CHECK(st["recoveries"][0]["charged"] == false);
  CHECK(st["recoveries"][0]["detail"].get<std::string>().find("(1 of 2 such losses allowed)") != std::string::npos);
  auto [second, t2] = h.Next("x[0]");
  CHECK(second != first);
  h.sched.DaemonLost(second, "connection closed: EOF");
  h.sched.Flush();
  CHECK(h.State(job) == "failed");
  std::string failure = h.sched.JobStatus(job)["failure"];
  CHECK(failure.find("vertex x[0] reached max_daemon_losses 2: its daemon was lost with no fault injected") != std::string::npos);
  CHECK(h.sink.TakeTasks().empty());  // the third daemon is spared
  (void)t1, (void)t2;
}

TEST_CASE("Scheduler.ChaosRequestsOutsideTheJobFilesBoundsAreRefused") {
  // A client is not the CLI: attempt 0 (which never comes), negative or endless delays and cuts
  // are refused by the job manager itself, as the job file's faults are by validation.
  Harness h;
  h.AddDaemon("d0");
  JobId job = h.Submit(kChain);
  const uint64_t id = job.value();
  for (const Json& bad : {Json{{"action", "fail"}, {"job", id}, {"vertex", "b[0]"}, {"attempts", {0}}},
                          Json{{"action", "fail"}, {"job", id}, {"vertex", "b[0]"}, {"attempts", Json::array()}},
                          Json{{"action", "fail"}, {"job", id}, {"vertex", "b[0]"}, {"attempts", {(int64_t{1} << 32) + 1}}},
                          Json{{"action", "delay"}, {"job", id}, {"vertex", "b[0]"}, {"ms", -1}},
                          Json{{"action", "delay"}, {"job", id}, {"vertex", "b[0]"}, {"ms", int64_t{1} << 40}},
                          Json{{"action", "cut"}, {"daemon", "d0"}, {"ms", 0}}}) {
    auto done = h.sched.Chaos(bad);
    CHECK_MESSAGE(done.status().code() == StatusCode::kInvalidArgument, bad.dump());
  }
  CHECK(h.sched.Chaos({{"action", "fail"}, {"job", id}, {"vertex", "b[0]"}, {"attempts", {1, 2}}}).ok());
  // A second random chaos replaces the first, and says so.
  auto first = h.sched.Chaos({{"action", "random"}, {"seed", 1}});
  REQUIRE(first.ok());
  CHECK_FALSE(first->contains("replaced"));
  auto second = h.sched.Chaos({{"action", "random"}, {"seed", 2}});
  REQUIRE(second.ok());
  CHECK((*second)["replaced"] == "the random chaos that was running");
}

TEST_CASE("Scheduler.InjectedKillsAndCutsAreNotCountedAsDaemonLosses") {
  Harness h;
  std::map<DaemonId, std::string> names;
  for (const char* name : {"d0", "d1", "d2", "d3", "d4"}) names[h.AddDaemon(name)] = name;
  JobId job = h.Submit(R"({"defaults": {"max_daemon_losses": 1}, "stages": [{"name": "x", "program": "noop"}]})");
  for (const char* action : {"kill", "cut", "kill"}) {
    DaemonId where = h.Next("x[0]").first;
    REQUIRE(h.sched.Chaos({{"action", action}, {"daemon", names[where]}, {"ms", 500}}).ok());
    h.clock.Advance(std::chrono::milliseconds(5));
    h.sched.DaemonLost(where, "connection closed: EOF");
    h.sched.Flush();
    CHECK(h.State(job) == "running");
  }
  // A kill whose loss does not follow within the window explains nothing after it.
  DaemonId where = h.Next("x[0]").first;
  REQUIRE(h.sched.Chaos({{"action", "kill"}, {"daemon", names[where]}}).ok());
  h.clock.Advance(Scheduler::kInjectedLossWindow + std::chrono::milliseconds(1));
  h.sched.DaemonLost(where, "connection closed: EOF");
  h.sched.Flush();
  CHECK(h.State(job) == "failed");
}

TEST_CASE("Scheduler.StaleReportsOfOldVersionsAreIgnored") {
  Harness h;
  h.AddDaemon("d0");
  JobId job = h.Submit(R"({"stages": [{"name": "x", "program": "noop"}]})");
  Task first = h.Next().second;
  h.Finish(first, false);
  Task second = h.Next().second;
  h.Finish(first, true);  // a late success of version 1 must not complete version 2
  CHECK(h.State(job) == "running");
  h.Finish(second, true);
  CHECK(h.State(job) == "completed");
}

TEST_CASE("Scheduler.ADaemonLossRegeneratesLostOutputsUpstream") {
  Harness h;
  DaemonId d0 = h.AddDaemon("d0");
  JobId job = h.Submit(kChain);
  h.Finish(h.Next("a[0]").second, true);  // a on d0
  h.Finish(h.Next("b[0]").second, true);  // b on d0
  Task c = h.Next("c[0]").second;         // c running on d0 (chained after b)
  DaemonId d1 = h.AddDaemon("d1");
  h.sched.DaemonLost(d0, "test");
  h.sched.Flush();
  // c failed with its daemon (not charged); b's file output is held for d0's return, and c
  // waits for it.
  CHECK(h.sink.TakeTasks().empty());
  h.clock.Advance(SchedulerOptions().daemon_return_grace);
  h.sched.Tick();
  h.sched.Flush();
  CHECK(h.sink.TakeTasks().empty());
  // d0 did not come back in time: b and a lost their outputs, and a runs again first (b is
  // chained after it, and c after b).
  h.clock.Advance(std::chrono::milliseconds(1));
  h.sched.Tick();
  h.sched.Flush();
  auto [where, a2] = h.Next("a[0]");
  CHECK(where == d1);
  CHECK(a2.version() == 2);
  CHECK(h.unclaimed.size() == 2);
  h.Finish(a2, true);
  h.Finish(h.Next("b[0]").second, true);  // b again
  Task c2 = h.Next("c[0]").second;
  CHECK(c2.version() == 2);
  h.Finish(c2, true);
  CHECK(h.State(job) == "completed");
  Json st = h.sched.JobStatus(job);
  int output_lost = 0, daemon_lost = 0;
  for (auto& r : st["recoveries"]) {
    output_lost += r["reason"] == "output_lost";
    daemon_lost += r["reason"] == "daemon_lost";
    CHECK(r["charged"] == false);
  }
  CHECK(output_lost == 2);
  CHECK(daemon_lost == 1);
  (void)c;
}

TEST_CASE("Scheduler.AnInputLostInASupersededVersionDoesNotReRunItsProducerAgain") {
  // Two consumers read a's version 1; the first finds it damaged, and a runs again as version
  // 2. The second's report of the same damage names version 1: it runs again on version 2,
  // and a does not run a third time.
  Harness h;
  h.AddDaemon("d0", 3);
  JobId job = h.Submit(R"({"stages": [{"name": "a", "program": "noop"}, {"name": "b", "program": "noop"},
                                      {"name": "c", "program": "noop"}],
                           "edges": [{"from": "a", "to": "b"}, {"from": "a", "to": "c"}]})");
  Task a1 = h.Next("a[0]").second;
  h.Finish(a1, true);
  Task b1 = h.Next("b[0]").second, c1 = h.Next("c[0]").second;
  auto lost = [&](const Task& task) {
    AttemptReport r;
    r.job = job;
    r.vertex = VertexId(task.vertex());
    r.version = task.version();
    r.failure = protocol::FAILURE_INPUT_LOST;
    r.error = "checksum mismatch";
    r.lost_input_port = 0;
    r.lost_input_version = StoredIn(task, 0).key().version();
    h.sched.OnAttemptFinished(r);
    h.sched.Flush();
  };
  lost(b1);
  Task a2 = h.Next("a[0]").second;
  CHECK(a2.version() == 2);
  h.Finish(a2, true);
  lost(c1);
  for (auto& [d, t] : h.sink.TakeTasks()) h.unclaimed.push_back({d, t});
  for (const auto& [d, t] : h.unclaimed) CHECK(t.name() != "a[0]");  // a is not run again
  Task c2 = h.Next("c[0]").second;
  CHECK(StoredIn(c2, 0).key().version() == 2);
  h.Finish(c2, true);
  h.Finish(h.Next("b[0]").second, true);
  CHECK(h.State(job) == "completed");
  CHECK(h.sched.JobStatus(job)["recoveries"].size() == 3);  // b, a, c: nothing for a second a
}

TEST_CASE("Scheduler.EveryLiveDaemonIsToldToEndItsFetchesFromALostOne") {
  Harness h;
  DaemonId d0 = h.AddDaemon("d0"), d1 = h.AddDaemon("d1"), d2 = h.AddDaemon("d2");
  h.sched.DaemonLost(d1, "missed heartbeats");
  h.sched.DaemonLost(d2, "missed heartbeats");
  auto told = h.sink.With(JmToDaemon::kPeerLost);
  REQUIRE(told.size() == 3);  // d0 and d2 of d1's loss, then d0 of d2's
  CHECK(told[0].first == d0);
  CHECK(told[0].second.peer_lost().host() == "127.0.0.1");
  CHECK(told[0].second.peer_lost().port() == 9000 + '1');
  CHECK(told[1].first == d2);
  CHECK(told[2].first == d0);
  CHECK(told[2].second.peer_lost().port() == 9000 + '2');
}

TEST_CASE("Scheduler.ADaemonBackAfterItsGraceKeepsACompletedJobsDeclaredOutputs") {
  // The hostile test's data loss: a daemon stopped (or cut off) past its return grace came
  // back as a new registration, and every output it listed, a finished job's declared ones
  // included, was released as stale: the job said completed, its output was gone.
  Harness h;
  DaemonId d0 = h.AddDaemon("d0");
  JobId job = h.Submit(kChain);
  Task c;
  for (const char* name : {"a[0]", "b[0]", "c[0]"}) {
    Task t = h.Next(name).second;
    h.Finish(t, true);
    c = t;
  }
  REQUIRE(h.State(job) == "completed");
  h.LoseForGood(d0);
  h.sink.sent.clear();
  const OutputInventory::value_type declared{job.value(), c.vertex(), c.version(), 0};
  const DaemonId back = h.ComeBack("d0", {declared, {job.value(), c.vertex(), 99, 0}});
  CHECK(back != d0);  // a new registration
  auto releases = h.Releases();
  REQUIRE(releases.size() == 1);  // only the version no one reads
  REQUIRE(releases[0].second.release().keys_size() == 1);
  CHECK(releases[0].second.release().keys(0).version() == 99);
  auto outputs = h.sched.OutputLocations(job);
  REQUIRE(outputs.ok());
  CHECK((*outputs)[0]["port"] == 9100);  // served from where it is now
}

TEST_CASE("Scheduler.ADaemonBackAfterItsGraceKeepsADeclaredPortOfAVertexWithOthers") {
  // a's port 1 feeds b; only port 0 is the job's output, so the job's end dropped port 1 from
  // d0 (gc). Back as a new registration, d0 lists port 0 alone: that is all the job still reads.
  Harness h;
  DaemonId d0 = h.AddDaemon("d0");
  JobId job = h.Submit(R"({"stages": [{"name": "a", "program": "noop"}, {"name": "b", "program": "noop"}],
                           "edges": [{"from": "a", "to": "b", "from_port": 1}],
                           "outputs": [{"from": "a", "port": 0, "path": "out"}]})");
  Task a = h.Next("a[0]").second;
  REQUIRE(a.outputs_size() == 2);
  h.Finish(a, true);
  h.Finish(h.Next("b[0]").second, true);
  REQUIRE(h.State(job) == "completed");
  h.LoseForGood(d0);
  h.sink.sent.clear();
  h.ComeBack("d0", {{job.value(), a.vertex(), 1, 0}});
  CHECK(h.Releases().empty());
  auto outputs = h.sched.OutputLocations(job);
  REQUIRE(outputs.ok());
  CHECK((*outputs)[0]["port"] == 9100);
}

TEST_CASE("Scheduler.ADaemonBackAfterItsGraceServesARunningJobsOutputsNotRerunMeanwhile") {
  Harness h;
  DaemonId d0 = h.AddDaemon("d0");
  JobId job = h.Submit(R"({"stages": [{"name": "a", "program": "noop"}, {"name": "b", "program": "noop"},
                                      {"name": "c", "program": "noop"}],
                           "edges": [{"from": "a", "to": "c"}, {"from": "b", "to": "c"}],
                           "outputs": [{"from": "c", "path": "out"}]})");
  Task a = h.Next("a[0]").second;
  h.Finish(a, true);
  h.Next("b[0]"), h.Next("c[0]");  // lost with d0, with a's output
  h.LoseForGood(d0);
  CHECK(h.sched.JobStatus(job)["recoveries"].size() == 3);
  // d0 back under its name before a ran again: a's output is served from there again, not
  // dropped and regenerated.
  const DaemonId back = h.ComeBack("d0", {{job.value(), a.vertex(), 1, 0}});
  h.sched.Flush();
  h.Finish(h.Next("b[0]").second, true);
  auto [where, c] = h.Next("c[0]");
  CHECK(where == back);
  CHECK(c.version() == 2);
  CHECK(StoredIn(c, 0).store().port() == 9100);
  CHECK(StoredIn(c, 0).key().version() == 1);
  CHECK(h.Releases().empty());  // a's output was not dropped as stale
  h.Finish(c, true);
  CHECK(h.State(job) == "completed");
}

TEST_CASE("Scheduler.ADaemonBackWithinItsGraceKeepsTheFileOutputsItStillHolds") {
  Harness h;
  DaemonId d0 = h.AddDaemon("d0");
  JobId job = h.Submit(kChain);
  Task a = h.Next("a[0]").second;
  h.Finish(a, true);
  Task b = h.Next("b[0]").second;
  h.Finish(b, true);
  h.Next("c[0]");  // running on d0 when it dies
  h.AddDaemon("d1");
  h.sched.DaemonLost(d0, "test");
  h.sched.Flush();
  CHECK(h.sink.TakeTasks().empty());  // c waits for b's output, held for d0

  // d0 restarts on its work dir: its store lists b's output, a's (released meanwhile, not
  // dropped yet) and one of a job this job manager does not know.
  auto key = [](const Task& task) { return OutputInventory::value_type{task.job(), task.vertex(), task.version(), 0}; };
  h.sink.sent.clear();
  CHECK(h.ComeBack("d0", {key(a), key(b), {77, 0, 1, 0}}) == d0);
  h.sched.Flush();
  // First what no job reads from there, then c again, reading b from d0's new address.
  REQUIRE(!h.sink.sent.empty());
  CHECK(h.sink.sent.front().first == d0);
  REQUIRE(h.sink.sent.front().second.has_release());
  const protocol::Release stale = h.sink.sent.front().second.release();
  REQUIRE(stale.keys_size() == 2);
  CHECK(stale.keys(0).vertex() == a.vertex());
  CHECK(stale.keys(1).job() == 77);
  Task c2 = h.Next("c[0]").second;
  CHECK(c2.version() == 2);
  CHECK(StoredIn(c2, 0).store().port() == 9100);
  h.Finish(c2, true);
  CHECK(h.State(job) == "completed");
  const Json st = h.sched.JobStatus(job);
  REQUIRE(st["recoveries"].size() == 1);
  CHECK(st["recoveries"][0]["vertex"] == "c[0]");
  CHECK(st["recoveries"][0]["reason"] == "daemon_lost");
}

/// Two producers on two daemons gathered by c, which runs on one of them and reads the other's
/// (the holder's) output through input `port`, over a `channel` channel.
struct RemoteGather {
  explicit RemoteGather(const std::string& channel = "file", Duration grace = SchedulerOptions().daemon_return_grace)
      : h([&] {
          SchedulerOptions options;
          options.chain_dispatch = false;
          options.daemon_return_grace = grace;
          return options;
        }()) {
    h.AddDaemon("d0");
    h.AddDaemon("d1");
    job = h.Submit(R"({"stages": [{"name": "a", "program": "noop", "replicas": 2}, {"name": "c", "program": "noop"}],
                       "edges": [{"from": "a", "to": "c", "pattern": "gather", "channel": ")" +
                   channel + R"("}],
                       "outputs": [{"from": "c", "path": "out"}]})");
    auto [a0_daemon, a0] = h.Next("a[0]");
    auto [a1_daemon, a1] = h.Next("a[1]");
    REQUIRE(a0_daemon != a1_daemon);
    h.Finish(a0, true);
    h.Finish(a1, true);
    std::tie(c_daemon, c) = h.Next("c[0]");
    holder = c_daemon == a0_daemon ? a1_daemon : a0_daemon;
    held = c_daemon == a0_daemon ? a1 : a0;
    port = c_daemon == a0_daemon ? 1 : 0;
  }
  /// The holder registers again at a new address, still holding the output: c runs again
  /// reading it there, and completes the job; c's were the only recoveries.
  void HolderIsBackAndCCompletes() {
    h.ComeBack(holder == DaemonId(0) ? "d0" : "d1", {{job.value(), held.vertex(), 1, 0}});
    h.sched.Flush();
    Task c2 = h.Next("c[0]").second;
    CHECK(StoredIn(c2, port).store().port() == 9100);
    h.Finish(c2, true);
    CHECK(h.State(job) == "completed");
    for (const auto& r : h.sched.JobStatus(job)["recoveries"]) {
      CHECK(r["vertex"] == "c[0]");
      CHECK(r["reason"] == "input_lost");
    }
  }
  Harness h;
  JobId job;
  DaemonId c_daemon, holder;
  Task c, held;
  int port = 0;
};

TEST_CASE("Scheduler.AConsumerThatCouldNotReachAHeldOutputRunsAgainOnceItsDaemonIsBack") {
  RemoteGather g;
  auto& [h, job, c_daemon, holder, c, held, port] = g;
  h.sched.DaemonLost(holder, "test");
  h.sched.Flush();
  SUBCASE("a damaged output is regenerated at once") {
    h.Finish(c, false, {}, protocol::FAILURE_INPUT_LOST, port, /*unreachable=*/false);
    auto [where, again] = h.Next(held.name());
    CHECK(where == c_daemon);
    CHECK(again.version() == 2);
    return;
  }
  // c, on the other daemon, could not connect to the gone process: it runs again, but its
  // producer's file output is held, not regenerated.
  h.Finish(c, false, {}, protocol::FAILURE_INPUT_LOST, port, /*unreachable=*/true);
  CHECK(h.sink.TakeTasks().empty());
  g.HolderIsBackAndCCompletes();
}

TEST_CASE("Scheduler.AnOutputUnreachableOnADaemonThatStillLooksAliveIsHeldOnceForItsGrace") {
  // The consumer's report can beat the dead daemon's connection close to the job manager.
  RemoteGather g;
  auto& [h, job, c_daemon, holder, c, held, port] = g;
  h.Finish(c, false, {}, protocol::FAILURE_INPUT_LOST, port, /*unreachable=*/true);
  CHECK(h.sink.TakeTasks().empty());  // neither c again nor its producer
  CHECK(h.sched.JobStatus(job)["waiting"][0]["reason"] == "ready; reads an output held for its daemon's return");
  SUBCASE("its loss is seen, and it comes back") {
    h.sched.DaemonLost(holder, "test");
    h.sched.Flush();
    CHECK(h.sink.TakeTasks().empty());
    g.HolderIsBackAndCCompletes();
  }
  SUBCASE("it stays registered and unreachable") {
    h.clock.Advance(SchedulerOptions().daemon_return_grace / 2);
    h.sched.Tick();
    h.sched.Flush();
    CHECK(h.sink.TakeTasks().empty());
    h.clock.Advance(SchedulerOptions().daemon_return_grace / 2 + std::chrono::milliseconds(1));
    h.sched.Tick();
    h.sched.Flush();
    Task c2 = h.Next("c[0]").second;  // tried once more, at the same address
    h.Finish(c2, false, {}, protocol::FAILURE_INPUT_LOST, port, /*unreachable=*/true);
    auto [where, again] = h.Next(held.name());  // now lost: regenerated
    CHECK(again.version() == 2);
  }
}

TEST_CASE("Scheduler.AnOutputUnreachableOnADaemonThatStillLooksAliveIsRegeneratedAtOnceWhenNotHeld") {
  auto regenerated_at_once = [](RemoteGather& g) {
    g.h.Finish(g.c, false, {}, protocol::FAILURE_INPUT_LOST, g.port, /*unreachable=*/true);
    auto [where, again] = g.h.Next(g.held.name());
    CHECK(again.version() == 2);
  };
  SUBCASE("a memory output (it dies with its process: nothing to wait for)") {
    RemoteGather g("memory");
    regenerated_at_once(g);
  }
  SUBCASE("no return grace") {
    RemoteGather g("file", Duration::zero());
    regenerated_at_once(g);
  }
}

TEST_CASE("Scheduler.AConsumerThatTriedWhileItsInputsDaemonRestartedRunsAgainAtOnce") {
  // The holder came back at the same address after c had started: c's "unreachable" is from
  // the downtime, so it runs again at once, neither waiting for a grace nor regenerating.
  RemoteGather g;
  auto& [h, job, c_daemon, holder, c, held, port] = g;
  h.clock.Advance(std::chrono::milliseconds(1));
  h.sched.DaemonLost(holder, "test");
  DaemonSpec spec;
  spec.name = holder == DaemonId(0) ? "d0" : "d1";
  spec.cpus = 1;
  spec.data_host = "127.0.0.1";
  spec.data_port = static_cast<uint16_t>(9000 + spec.name.back());  // where it was
  REQUIRE(h.sched.AddDaemon(spec, {{job.value(), held.vertex(), 1, 0}}).ok());
  h.sched.Flush();
  h.Finish(c, false, {}, protocol::FAILURE_INPUT_LOST, port, /*unreachable=*/true);
  Task c2 = h.Next("c[0]").second;
  CHECK(c2.version() == 2);
  h.Finish(c2, true);
  CHECK(h.State(job) == "completed");
  for (const auto& r : h.sched.JobStatus(job)["recoveries"]) CHECK(r["vertex"] == "c[0]");
}

TEST_CASE("Scheduler.APinnedConsumerOfAHeldOutputWaitsForItsDaemon") {
  // q1 is pinned (affinity) to a live daemon but reads p's file output, held for p's lost
  // daemon: it waits instead of failing to connect time after time.
  SchedulerOptions options;
  options.chain_dispatch = false;
  Harness h(options);
  h.AddDaemon("d0");
  h.AddDaemon("d1");
  JobId job = h.Submit(R"({"stages": [{"name": "p", "program": "noop", "affinity": "g1"},
                                      {"name": "q0", "program": "noop", "affinity": "g2"},
                                      {"name": "q1", "program": "noop", "affinity": "g2"}],
                           "edges": [{"from": "p", "to": "q1"}, {"from": "q0", "to": "q1"}],
                           "outputs": [{"from": "q1", "path": "out"}]})");
  auto [p_daemon, p] = h.Next("p[0]");
  auto [q_daemon, q0] = h.Next("q0[0]");
  REQUIRE(p_daemon != q_daemon);
  h.Finish(p, true);
  h.sched.DaemonLost(p_daemon, "test");
  h.Finish(q0, true);  // q1 is ready, pinned to q0's daemon
  CHECK(h.sink.TakeTasks().empty());
  h.ComeBack(p_daemon == DaemonId(0) ? "d0" : "d1", {{job.value(), p.vertex(), 1, 0}});
  h.sched.Flush();
  auto [where, q1] = h.Next("q1[0]");
  CHECK(where == q_daemon);
  h.Finish(q1, true);
  CHECK(h.State(job) == "completed");
  CHECK(h.sched.JobStatus(job)["recoveries"].empty());
}

TEST_CASE("Scheduler.ADaemonBackWithoutAHeldOutputRegeneratesIt") {
  std::string text = kChain;
  SUBCASE("its producer's output was released") {}
  SUBCASE("its producer's output is retained") {
    // Kept past b's completion, a's output is checked once b is regenerated, not found missing by b.
    text = R"({"stages": [{"name": "a", "program": "noop", "retain": true}, {"name": "b", "program": "noop"},
                          {"name": "c", "program": "noop"}],
               "edges": [{"from": "a", "to": "b"}, {"from": "b", "to": "c"}],
               "outputs": [{"from": "c", "path": "out"}]})";
  }
  Harness h;
  DaemonId d0 = h.AddDaemon("d0");
  JobId job = h.Submit(text);
  h.Finish(h.Next("a[0]").second, true);
  h.Finish(h.Next("b[0]").second, true);
  h.Next("c[0]");
  h.sched.DaemonLost(d0, "test");
  h.ComeBack("d0", {});  // its work dir was wiped
  h.sched.Flush();
  Task a = h.Next().second;  // b needs a's output again: a runs first
  CHECK(a.name() == "a[0]");
  CHECK(a.version() == 2);
  h.Finish(a, true);
  h.Finish(h.Next("b[0]").second, true);
  h.Finish(h.Next("c[0]").second, true);
  CHECK(h.State(job) == "completed");
}

TEST_CASE("Scheduler.ALostDaemonsMemoryOutputsAreRegeneratedAtOnce") {
  Harness h;
  DaemonId d0 = h.AddDaemon("d0");
  JobId job = h.Submit(R"({"stages": [{"name": "a", "program": "noop"}, {"name": "b", "program": "noop"},
                                      {"name": "c", "program": "noop"}],
                           "edges": [{"from": "a", "to": "b", "channel": "memory"}, {"from": "b", "to": "c", "channel": "memory"}],
                           "outputs": [{"from": "c", "path": "out"}]})");
  h.Finish(h.Next("a[0]").second, true);
  h.Finish(h.Next("b[0]").second, true);
  h.Next("c[0]");
  DaemonId d1 = h.AddDaemon("d1");
  h.sched.DaemonLost(d0, "test");
  h.sched.Flush();
  auto [where, a2] = h.Next("a[0]");  // no grace: memory ends with the process
  CHECK(where == d1);
  h.Finish(a2, true);
  h.Finish(h.Next("b[0]").second, true);
  h.Finish(h.Next("c[0]").second, true);
  CHECK(h.State(job) == "completed");
}

TEST_CASE("Scheduler.ConsumedOutputsAreReleasedAndRegeneratedWhenNeededAgain") {
  Harness h;
  h.AddDaemon("d0");
  JobId job = h.Submit(kChain);
  Task a = h.Next("a[0]").second;
  h.Finish(a, true);
  Task b = h.Next("b[0]").second;
  h.Finish(b, true);
  // b consumed a's output: a's output is released; b's is still needed by c.
  auto releases = h.Releases();
  REQUIRE(releases.size() == 1);
  REQUIRE(releases[0].second.release().keys_size() == 1);
  CHECK(releases[0].second.release().keys(0).vertex() == a.vertex());
  // c cannot read b's output (corrupted, say): b re-runs, and so must a, whose output is gone.
  Task c = h.Next("c[0]").second;
  h.Finish(c, false, {}, protocol::FAILURE_INPUT_LOST, 0);
  Task a2 = h.Next("a[0]").second;
  CHECK(h.unclaimed.size() == 2);  // b, chained after a, and c after b
  h.Finish(a2, true);
  h.Finish(h.Next("b[0]").second, true);
  Task c2 = h.Next("c[0]").second;
  CHECK(c2.version() == 2);
  h.Finish(c2, true);
  CHECK(h.State(job) == "completed");
  // The input-lost consumer was not charged an attempt.
  CHECK(h.sched.JobStatus(job)["stages"][2]["failed_attempts"] == 0);
}

TEST_CASE("Scheduler.AnInputLostTimeAfterTimeFailsTheJobInsteadOfLoopingForever") {
  Harness h;
  h.AddDaemon("d0");
  JobId job = h.Submit(kChain);
  h.Finish(h.Next("a[0]").second, true);
  h.Finish(h.Next("b[0]").second, true);
  // c never reads b's output, whatever b's re-runs write (an unreadable disk, say): each
  // loss re-runs b (and a, whose output was released), up to the bound.
  for (int i = 1; i < 8; ++i) {
    h.Finish(h.Next("c[0]").second, false, {}, protocol::FAILURE_INPUT_LOST, 0);
    REQUIRE(h.State(job) == "running");
    h.Finish(h.Next("a[0]").second, true);
    h.Finish(h.Next("b[0]").second, true);
  }
  h.Finish(h.Next("c[0]").second, false, {}, protocol::FAILURE_INPUT_LOST, 0);
  CHECK(h.State(job) == "failed");
  std::string failure = h.sched.JobStatus(job)["failure"];
  CHECK_MESSAGE(failure.find("c[0] could not read input 0 (from b[0]) 8 times,") != std::string::npos, failure);
}

TEST_CASE("Scheduler.InputLossesAreCountedUntilTheConsumerCompletesNotOverTheJob") {
  Harness h;
  h.AddDaemon("d0");
  JobId job = h.Submit(kChain);
  h.Finish(h.Next("a[0]").second, true);
  // Each failure of b also ends c's task, chained after b, unstarted (as its daemon reports).
  auto lose_b_input = [&] {
    h.Finish(h.Next("b[0]").second, false, {}, protocol::FAILURE_INPUT_LOST, 0);
    h.Finish(h.Next("c[0]").second, false);
    h.Finish(h.Next("a[0]").second, true);
  };
  // b loses its input 7 times, completes, and later loses its input once more (a re-run of b
  // after c lost b's output): the count starts again.
  for (int i = 0; i < 7; ++i) lose_b_input();
  h.Finish(h.Next("b[0]").second, true);
  h.Finish(h.Next("c[0]").second, false, {}, protocol::FAILURE_INPUT_LOST, 0);
  h.Finish(h.Next("a[0]").second, true);
  lose_b_input();
  CHECK(h.State(job) == "running");
  h.Finish(h.Next("b[0]").second, true);
  h.Finish(h.Next("c[0]").second, true);
  CHECK(h.State(job) == "completed");
}

TEST_CASE("Scheduler.AReportOfALostInputAVertexDoesNotHaveIsAChargedProgramError") {
  // A daemon's report is a network message: a port out of range (even on a vertex without
  // inputs) must fail that attempt with an error saying so, not take the job manager down.
  SchedulerOptions options;
  options.chain_dispatch = false;
  Harness h(options);
  h.AddDaemon("d0");
  JobId job = h.Submit(R"({"stages": [{"name": "a", "program": "noop", "max_attempts": 2},
                                      {"name": "b", "program": "noop", "max_attempts": 2}],
                           "edges": [{"from": "a", "to": "b"}]})");
  h.Finish(h.Next("a[0]").second, false, {}, protocol::FAILURE_INPUT_LOST, 0);  // a has no inputs
  h.Finish(h.Next("a[0]").second, true);
  h.Finish(h.Next("b[0]").second, false, {}, protocol::FAILURE_INPUT_LOST, 7);
  const Json st = h.sched.JobStatus(job);
  CHECK(st["state"] == "running");
  REQUIRE(st["recoveries"].size() == 2);
  for (const auto& r : st["recoveries"]) {
    CHECK(r["reason"] == "program_error");
    CHECK(r["charged"] == true);
    CHECK(r["detail"].get<std::string>().find("reported input") != std::string::npos);
  }
}

TEST_CASE("Scheduler.DifferentInputsLostOnceEachDoNotFailTheJob") {
  // A gather whose ten inputs are damaged one after another (chaos corrupting outputs faster
  // than the consumer reads them): ten losses, none of an input twice, and the job completes.
  Harness h;
  h.AddDaemon("d0");
  JobId job = h.Submit(R"({"stages": [{"name": "a", "program": "noop", "replicas": 10}, {"name": "c", "program": "noop"}],
                           "edges": [{"from": "a", "to": "c", "pattern": "gather"}]})");
  for (int i = 0; i < 10; ++i) h.Finish(h.Next("a[" + std::to_string(i) + "]").second, true);
  for (int i = 0; i < 10; ++i) {
    h.Finish(h.Next("c[0]").second, false, {}, protocol::FAILURE_INPUT_LOST, i);
    REQUIRE(h.State(job) == "running");
    h.Finish(h.Next("a[" + std::to_string(i) + "]").second, true);
  }
  h.Finish(h.Next("c[0]").second, true);
  CHECK(h.State(job) == "completed");
}

TEST_CASE("Scheduler.ReleasesWaitForATickAndGoOutAsOneMessagePerDaemon") {
  Harness h;
  h.AddDaemon("d0");
  h.Submit(R"({"stages": [{"name": "a", "program": "noop"}, {"name": "b", "program": "noop"},
                          {"name": "c", "program": "noop"}, {"name": "d", "program": "noop"}],
               "edges": [{"from": "a", "to": "b"}, {"from": "b", "to": "c"}, {"from": "c", "to": "d"}]})");
  for (const char* v : {"a[0]", "b[0]", "c[0]"}) h.Finish(h.Next(v).second, true);
  CHECK(h.sink.With(JmToDaemon::kRelease).empty());  // a's and b's outputs are consumed; held until a tick
  auto releases = h.Releases();
  REQUIRE(releases.size() == 1);
  CHECK(releases[0].second.release().keys_size() == 2);
  h.sched.Flush();
  CHECK(h.sink.With(JmToDaemon::kRelease).size() == 1);  // sent once
}

TEST_CASE("Scheduler.AReleaseThatFreesAMebibyteGoesAtOnce") {
  Harness h;
  h.AddDaemon("d0");
  h.Submit(kChain);
  h.Finish(h.Next("a[0]").second, true, {2 << 20});  // a 2 MiB output
  h.Finish(h.Next("b[0]").second, true);
  auto releases = h.sink.With(JmToDaemon::kRelease);  // no tick: a's output is freed now
  REQUIRE(releases.size() == 1);
  CHECK(releases[0].second.release().keys_size() == 1);
}

TEST_CASE("Scheduler.RetainedStagesAreNotReleased") {
  Harness h;
  h.AddDaemon("d0");
  h.Submit(R"({"stages": [{"name": "a", "program": "noop", "retain": true}, {"name": "b", "program": "noop"},
                          {"name": "c", "program": "noop"}],
               "edges": [{"from": "a", "to": "b"}, {"from": "b", "to": "c"}]})");
  h.Finish(h.Next().second, true);
  h.Finish(h.Next().second, true);
  CHECK(h.Releases().empty());  // a is retained
  h.Finish(h.Next().second, true);
  CHECK(h.Releases().size() == 1);  // b is not
}

TEST_CASE("Scheduler.RetainedPortsOutliveTheirProducersOtherOutputs") {
  Harness h;
  h.AddDaemon("d0");
  h.Submit(R"({"stages": [{"name": "a", "program": "noop", "retain": [1]}, {"name": "b", "program": "noop"},
                          {"name": "c", "program": "noop"}, {"name": "d", "program": "noop"}],
               "edges": [{"from": "a", "from_port": 0, "to": "b"}, {"from": "a", "from_port": 1, "to": "c"},
                         {"from": "c", "to": "d", "to_port": 0}, {"from": "b", "to": "d", "to_port": 1}]})");
  Task a = h.Next().second;
  h.Finish(a, true);
  for (int i = 0; i < 2; ++i) h.Finish(h.Next().second, true);  // b (chained after a), then c
  // Both of a's consumers completed: port 0 is released, the retained port 1 is not.
  auto releases = h.Releases();
  REQUIRE(releases.size() == 1);
  REQUIRE(releases[0].second.release().keys_size() == 1);
  CHECK(releases[0].second.release().keys(0).vertex() == a.vertex());
  CHECK(releases[0].second.release().keys(0).port() == 0);
  // d loses c's output: c re-runs from a's retained port, without regenerating a.
  h.Finish(h.Next("d[0]").second, false, {}, protocol::FAILURE_INPUT_LOST, 0);
  h.Next("c[0]");
  CHECK(h.unclaimed.size() == 1);  // d, chained after c
  CHECK(h.unclaimed[0].second.name() == "d[0]");
}

const char* kDurableChain = R"({"stages": [{"name": "a", "program": "noop"}, {"name": "b", "program": "noop"},
                                           {"name": "c", "program": "noop"}],
                                "durable_dir": "ckpt",
                                "edges": [{"from": "a", "to": "b", "channel": "durable"}, {"from": "b", "to": "c"}]})";

TEST_CASE("Scheduler.ARetainedOutputIsDroppedOnceADurableCopySettlesItsConsumers") {
  // a's retained output feeds b, whose output has a durable copy for c, then d reads c. Once b
  // completed no fault can make it run again (c reads the copy when b's store is gone), so a's
  // retained output can never be needed: dropped. c's consumer d has not run yet, so c stays
  // unsettled and keeps its retained output (b's is released as usual once c has read it).
  Harness h;
  h.AddDaemon("d0");
  h.Submit(R"({"stages": [{"name": "a", "program": "noop", "retain": true}, {"name": "b", "program": "noop"},
                          {"name": "c", "program": "noop", "retain": true}, {"name": "d", "program": "noop"}],
               "durable_dir": "ckpt",
               "edges": [{"from": "a", "to": "b"}, {"from": "b", "to": "c", "channel": "durable"},
                         {"from": "c", "to": "d"}]})",
           "/jobs/x");
  Task a = h.Next("a[0]").second;
  h.Finish(a, true);
  CHECK(h.Releases().empty());  // retained, and b has not run
  h.Finish(h.Next("b[0]").second, true);
  auto releases = h.Releases();
  REQUIRE(releases.size() == 1);
  REQUIRE(releases[0].second.release().keys_size() == 1);
  CHECK(releases[0].second.release().keys(0).vertex() == a.vertex());
  h.Finish(h.Next("c[0]").second, true);
  releases = h.Releases();
  REQUIRE(releases.size() == 2);
  for (const auto& key : releases[1].second.release().keys()) CHECK(key.vertex() == 1);  // b's, consumed; not c's
}

TEST_CASE("Scheduler.WithoutADurableCopyRetainedOutputsAreKept") {
  Harness h;
  h.AddDaemon("d0");
  JobId job = h.Submit(R"({"stages": [{"name": "a", "program": "noop", "retain": true}, {"name": "b", "program": "noop"},
                                      {"name": "c", "program": "noop"}, {"name": "d", "program": "noop"}],
                           "edges": [{"from": "a", "to": "b"}, {"from": "b", "to": "c"}, {"from": "c", "to": "d"}]})");
  for (const char* v : {"a[0]", "b[0]", "c[0]"}) h.Finish(h.Next(v).second, true);
  // b was released once c completed; a is retained: every key released so far is b's.
  for (const auto& [daemon, msg] : h.Releases()) {
    for (const auto& key : msg.release().keys()) CHECK(key.vertex() == 1);
  }
  CHECK(h.State(job) == "running");
}

TEST_CASE("Scheduler.ADurableOutputOutlivesItsDaemonAndStopsLineage") {
  Harness h;
  DaemonId d0 = h.AddDaemon("d0");
  JobId job = h.Submit(kDurableChain, "/jobs/x");
  Task a = h.Next("a[0]").second;
  // A memory output with its copy under <job dir>/<durable_dir>/job<J>.
  const std::string copy = "/jobs/x/ckpt/job" + std::to_string(job.value()) + "/v0.1.p0.out";
  REQUIRE(a.outputs_size() == 1);
  CHECK(a.outputs(0).durable() == copy);
  h.Finish(a, true);
  Task b = h.Next("b[0]").second;  // on d0, where a's memory output is: read there, copy as fallback
  CHECK(ServedFrom(b, 0, /*local=*/true));
  CHECK(StoredIn(b, 0).durable() == copy);
  DaemonId d1 = h.AddDaemon("d1");
  h.LoseForGood(d0);
  // b (and c, chained after it) died with d0; a's output is lost with d0's store but its copy
  // is not: a does not re-run.
  auto [where, b2] = h.Next("b[0]");
  CHECK(where == d1);
  for (const auto& [d, t] : h.unclaimed) CHECK(t.name() == "c[0]");  // chained after b, then b2
  // Read from a's copy alone: no store serves it.
  const protocol::StoredInput& from_a = StoredIn(b2, 0);
  CHECK(protocol::ToString(from_a.key()) == protocol::ToString(protocol::MakeOutputKey(job.value(), 0, 1, 0)));
  CHECK_FALSE(from_a.has_store());
  CHECK(from_a.durable() == copy);
  h.Finish(b2, true);
  h.Finish(h.unclaimed.back().second, true);
  CHECK(h.State(job) == "completed");
  for (const auto& r : h.sched.JobStatus(job)["recoveries"]) {
    CHECK(r["vertex"] != "a[0]");
    CHECK(r["reason"] == "daemon_lost");
  }
}

TEST_CASE("Scheduler.AReleasedDurableOutputIsReadFromItsCopyWithoutRerunningItsProducer") {
  Harness h;
  h.AddDaemon("d0");
  const auto dir = std::filesystem::temp_directory_path() / ("copse-sched-durable-" + std::to_string(::getpid()));
  JobId job = h.Submit(kDurableChain, dir.string());
  const auto job_copies = dir / "ckpt" / ("job" + std::to_string(job.value()));
  std::filesystem::create_directories(job_copies);  // what a daemon would have written
  h.Finish(h.Next("a[0]").second, true);
  h.Finish(h.Next("b[0]").second, true);
  // a's memory output is released once b completed; its copy stays.
  REQUIRE(h.Releases().size() == 1);
  // c cannot read b's output: b re-runs, reading a's copy; a does not re-run.
  h.Finish(h.Next("c[0]").second, false, {}, protocol::FAILURE_INPUT_LOST, 0);
  Task b2 = h.Next("b[0]").second;
  CHECK(h.unclaimed.size() == 1);  // c, chained after b
  CHECK(!StoredIn(b2, 0).durable().empty());
  CHECK(!StoredIn(b2, 0).has_store());
  h.Finish(b2, true);
  h.Finish(h.Next("c[0]").second, true);
  CHECK(h.State(job) == "completed");
  // The job's copies are deleted when it ends, and the durable directory once empty.
  CHECK(!std::filesystem::exists(dir / "ckpt"));
  CHECK(std::filesystem::exists(dir));
  std::filesystem::remove_all(dir);
}

// a -> b -> c, each output mirrored, all pinned to one daemon (the affinity group): the copies
// go to the other daemon.
const char* kMirroredChain = R"({"stages": [{"name": "a", "program": "noop", "affinity": "g"},
                                            {"name": "b", "program": "noop", "affinity": "g"},
                                            {"name": "c", "program": "noop", "affinity": "g"},
                                            {"name": "d", "program": "noop", "affinity": "g"}],
                                 "edges": [{"from": "a", "to": "b", "channel": "mirrored"},
                                           {"from": "b", "to": "c", "channel": "mirrored"},
                                           {"from": "c", "to": "d"}]})";

/// The Mirror messages sent so far, as (daemon, key as text); forgets them.
std::vector<std::pair<DaemonId, std::string>> TakeMirrors(FakeSink& sink) {
  std::vector<std::pair<DaemonId, std::string>> out;
  for (const auto& [d, m] : sink.With(JmToDaemon::kMirror)) out.emplace_back(d, protocol::ToString(m.mirror().key()));
  sink.Keep(JmToDaemon::kMirror, false);
  return out;
}

/// The keys released on daemon `d` so far.
std::set<std::string> ReleasedOn(Harness& h, DaemonId d) {
  std::set<std::string> keys;
  for (const auto& [to, m] : h.Releases())
    if (to == d)
      for (const auto& k : m.release().keys()) keys.insert(protocol::ToString(k));
  return keys;
}

/// Daemon `at` reports its copy of output 0 of `vertex` (version 1) whole.
void ReportCopied(Harness& h, JobId job, uint32_t vertex, DaemonId at) {
  protocol::Mirrored done;
  *done.mutable_key() = protocol::MakeOutputKey(job.value(), vertex, 1, 0);
  done.set_ok(true);
  h.sched.OnMirrored(done, at);
  h.sched.Flush();
}

/// Two daemons and a chain of `text` whose first vertex a ran on `home` and completed; its
/// output's copy goes to `other` (whole once `copied`).
struct MirrorRun {
  explicit MirrorRun(const char* text, bool copied = true) {
    const DaemonId d0 = h.AddDaemon("d0", 2), d1 = h.AddDaemon("d1", 2);
    job = h.Submit(text);
    auto [where, a] = h.Next("a[0]");
    home = where;
    other = home == d0 ? d1 : d0;
    key_a = protocol::ToString(protocol::MakeOutputKey(job.value(), 0, 1, 0));
    h.Finish(a, true);
    if (copied) ReportCopied(h, job, 0, other);
  }
  /// Runs what is left of the chain (b, c, d, each once more) to the end.
  void FinishRest(const std::vector<std::string>& names) {
    for (const auto& n : names) h.Finish(h.Next(n).second, true);
    CHECK(h.State(job) == "completed");
  }
  Harness h;
  JobId job;
  DaemonId home, other;
  std::string key_a;
};

TEST_CASE("Scheduler.AMirroredOutputOutlivesItsDaemonInAnotherDaemonsMemory") {
  MirrorRun m(kMirroredChain, /*copied=*/false);
  auto& [h, job, home, other, key_a] = m;
  // Once a completed, the other daemon is asked to copy its output from a's daemon.
  const auto mirrors = TakeMirrors(h.sink);
  REQUIRE(mirrors.size() == 1);
  CHECK(mirrors[0].first == other);
  CHECK(mirrors[0].second == key_a);
  ReportCopied(h, job, 0, other);
  // b runs on a's daemon, which is lost: b runs again on the other daemon, reading a's copy
  // there; a does not run again.
  h.Next("b[0]");
  h.LoseForGood(home);
  h.unclaimed.clear();  // what was sent to the lost daemon (b, and c and d chained after it)
  auto [where, b2] = h.Next("b[0]");
  CHECK(where == other);
  CHECK(ServedFrom(b2, 0, /*local=*/true));
  CHECK(protocol::ToString(StoredIn(b2, 0).key()) == key_a);
  h.Finish(b2, true);
  h.Finish(h.Next("c[0]").second, true);
  h.Finish(h.Next("d[0]").second, true);
  CHECK(h.State(job) == "completed");
  const Json status = h.sched.JobStatus(job);
  CHECK(status["mirrors_used"] == 1);
  for (const auto& r : status["recoveries"]) CHECK(r["vertex"] != "a[0]");
  // A copy that comes too late (its output released by then) is dropped where it was made.
  protocol::Mirrored late;
  *late.mutable_key() = protocol::MakeOutputKey(job.value(), 2, 1, 0);
  late.set_ok(true);
  h.sched.OnMirrored(late, other);
  h.sched.Flush();
  bool dropped = false;
  for (const auto& [to, msg] : h.sink.With(JmToDaemon::kRelease))
    for (const auto& k : msg.release().keys())
      dropped = dropped || (to == other && protocol::ToString(k) == protocol::ToString(late.key()));
  CHECK(dropped);
}

TEST_CASE("Scheduler.AnOutputsCopyGuardsItsConsumerUntilTheConsumersOwnCopyIsWhole") {
  MirrorRun m(kMirroredChain);
  auto& [h, job, home, other, key_a] = m;
  h.Finish(h.Next("b[0]").second, true);
  // a's output was consumed: released where it was made, but its copy stays until b's is whole.
  CHECK(ReleasedOn(h, home).count(key_a) == 1);
  CHECK(ReleasedOn(h, other).count(key_a) == 0);
  // a's daemon is lost before b's copy was made: b runs again from a's copy (a does not).
  h.LoseForGood(home);
  h.unclaimed.clear();  // what was sent to the lost daemon (c, chained after b)
  auto [where, b2] = h.Next("b[0]");
  CHECK(where == other);
  CHECK(protocol::ToString(StoredIn(b2, 0).key()) == key_a);
  CHECK(ServedFrom(b2, 0, /*local=*/true));
  h.Finish(b2, true);
  for (const auto& r : h.sched.JobStatus(job)["recoveries"]) CHECK(r["vertex"] != "a[0]");
  // No other live daemon is left to copy b's new output to: the job goes on without.
  h.Finish(h.Next("c[0]").second, true);
  h.Finish(h.Next("d[0]").second, true);
  CHECK(h.State(job) == "completed");
}

TEST_CASE("Scheduler.AReleasedOutputsCopyIsDroppedOnceItsConsumersCopyIsWhole") {
  MirrorRun m(kMirroredChain);
  auto& [h, job, home, other, key_a] = m;
  h.Finish(h.Next("b[0]").second, true);
  CHECK(ReleasedOn(h, other).count(key_a) == 0);
  ReportCopied(h, job, 1, other);  // b's copy is whole: a's guards nothing more
  CHECK(ReleasedOn(h, other).count(key_a) == 1);
  h.Finish(h.Next("c[0]").second, true);
  h.Finish(h.Next("d[0]").second, true);
  CHECK(h.State(job) == "completed");
}

TEST_CASE("Scheduler.AnUnreadableMirroredOutputMovesToItsCopyInsteadOfRunningAgain") {
  MirrorRun m(kMirroredChain);
  auto& [h, job, home, other, key_a] = m;
  // b could not read a's output where it was made (a daemon about to be found lost).
  Task b = h.Next("b[0]").second;
  h.Finish(b, false, {}, protocol::FAILURE_INPUT_LOST, 0, /*unreachable=*/true);
  for (const char* chained : {"c[0]", "d[0]"}) h.Finish(h.Next(chained).second, false);  // never started, as their daemon says
  Task b2 = h.Next("b[0]").second;
  CHECK(b2.version() > b.version());
  CHECK(protocol::ToString(StoredIn(b2, 0).key()) == key_a);
  CHECK(StoredIn(b2, 0).store().port() == 9000 + (other == DaemonId(0) ? '0' : '1'));
  CHECK(ReleasedOn(h, home).count(key_a) == 1);  // the primary, where it could not be read
  for (const auto& r : h.sched.JobStatus(job)["recoveries"]) CHECK(r["vertex"] != "a[0]");
  CHECK(h.sched.JobStatus(job)["mirrors_used"] == 1);
}

// Every other output mirrored (as --mirror-every 2 mirrors every second step's update).
const char* kSparselyMirroredChain = R"({"stages": [{"name": "a", "program": "noop", "affinity": "g"},
                                                    {"name": "b", "program": "noop", "affinity": "g"},
                                                    {"name": "c", "program": "noop", "affinity": "g"},
                                                    {"name": "d", "program": "noop", "affinity": "g"}],
                                         "edges": [{"from": "a", "to": "b", "channel": "mirrored"},
                                                   {"from": "b", "to": "c"},
                                                   {"from": "c", "to": "d", "channel": "mirrored"}]})";

TEST_CASE("Scheduler.ACopyGuardsUpToTheNextMirroredOutputDownstream") {
  MirrorRun m(kSparselyMirroredChain);
  auto& [h, job, home, other, key_a] = m;
  h.Finish(h.Next("b[0]").second, true);
  h.Finish(h.Next("c[0]").second, true);
  // a's output was consumed and released; its copy guards b and c until c's copy is whole.
  CHECK(ReleasedOn(h, home).count(key_a) == 1);
  CHECK(ReleasedOn(h, other).count(key_a) == 0);
  // Lost before c's copy was made: c and b run again, from a's copy; a does not.
  h.LoseForGood(home);
  h.unclaimed.clear();
  auto [where, b2] = h.Next("b[0]");
  CHECK(where == other);
  CHECK(protocol::ToString(StoredIn(b2, 0).key()) == key_a);
  h.Finish(b2, true);
  h.Finish(h.Next("c[0]").second, true);
  h.Finish(h.Next("d[0]").second, true);
  CHECK(h.State(job) == "completed");
  for (const auto& r : h.sched.JobStatus(job)["recoveries"]) CHECK(r["vertex"] != "a[0]");
}

TEST_CASE("Scheduler.ACopyIsDroppedOnceTheNextMirroredOutputDownstreamIsCopied") {
  MirrorRun m(kSparselyMirroredChain);
  auto& [h, job, home, other, key_a] = m;
  h.Finish(h.Next("b[0]").second, true);
  h.Finish(h.Next("c[0]").second, true);
  CHECK(ReleasedOn(h, other).count(key_a) == 0);
  ReportCopied(h, job, 2, other);  // c's copy is whole: a's guards nothing more
  CHECK(ReleasedOn(h, other).count(key_a) == 1);
  h.Finish(h.Next("d[0]").second, true);
  CHECK(h.State(job) == "completed");
}

const char* kPinnedChain = R"({"stages": [{"name": "a", "program": "noop", "affinity": "g"},
                                          {"name": "b", "program": "noop", "affinity": "g"},
                                          {"name": "c", "program": "noop", "affinity": "g"}],
                              "edges": [{"from": "a", "to": "b"}, {"from": "b", "to": "c", "channel": "order"}]})";

TEST_CASE("Scheduler.ChainedDispatchSendsTheNextVertexOfAPinnedChainAhead") {
  Harness h;
  h.AddDaemon("d0", 2);
  JobId job = h.Submit(kPinnedChain);
  // a runs; b, whose only unfinished predecessor is a, goes to the same daemon at once, to
  // start there when a succeeds, and c, chained after b, to start when b succeeds.
  auto tasks = h.sink.TakeTasks();
  REQUIRE(tasks.size() == 3);
  CHECK(tasks[0].second.name() == "a[0]");
  CHECK(tasks[1].second.name() == "b[0]");
  CHECK(After(tasks[1].second, 0).vertex() == tasks[0].second.vertex());
  CHECK(After(tasks[1].second, 0).version() == tasks[0].second.version());
  // a's input key in b's task names a's attempt, to be read locally.
  CHECK(ServedFrom(tasks[1].second, 0, /*local=*/true));
  CHECK(tasks[2].second.name() == "c[0]");
  CHECK(After(tasks[2].second, 0).vertex() == tasks[1].second.vertex());
  for (auto& [d, t] : tasks) h.Finish(t, true);
  CHECK(h.sink.TakeTasks().empty());
  CHECK(h.State(job) == "completed");
  CHECK(h.sched.JobStatus(job)["recoveries"].empty());
}

TEST_CASE("Scheduler.AChainIsSentAtMostTwoTasksAheadOfOneThatStarted") {
  Harness h;
  h.AddDaemon("d0", 2);
  JobId job = h.Submit(R"({"stages": [{"name": "a", "program": "noop", "affinity": "g"},
                                      {"name": "b", "program": "noop", "affinity": "g"},
                                      {"name": "c", "program": "noop", "affinity": "g"},
                                      {"name": "d", "program": "noop", "affinity": "g"}],
                           "edges": [{"from": "a", "to": "b"}, {"from": "b", "to": "c"}, {"from": "c", "to": "d"}]})");
  // a runs, b waits behind it and c behind b: d would wait three deep, so it is not sent.
  auto tasks = h.sink.TakeTasks();
  REQUIRE(tasks.size() == 3);
  CHECK(tasks[2].second.name() == "c[0]");
  // a ends and b starts: c waits one deep, d two.
  h.Finish(tasks[0].second, true);
  auto next = h.sink.TakeTasks();
  REQUIRE(next.size() == 1);
  CHECK(next[0].second.name() == "d[0]");
  CHECK(After(next[0].second, 0).vertex() == tasks[2].second.vertex());
  // The chain took its slots ahead of time: the daemon shows none free.
  CHECK(h.sched.DaemonsTable()[0]["free_cpus"] == 0);
  h.Finish(tasks[1].second, true);
  h.Finish(tasks[2].second, true);
  h.Finish(next[0].second, true);
  CHECK(h.State(job) == "completed");
}

TEST_CASE("Scheduler.AChainedVertexWhosePredecessorFailedIsWithdrawnUncharged") {
  Harness h;
  h.AddDaemon("d0", 2);
  JobId job = h.Submit(kPinnedChain);
  auto tasks = h.sink.TakeTasks();
  REQUIRE(tasks.size() == 3);
  h.Finish(tasks[0].second, false);  // a fails; its daemon withdraws b, and c behind b
  h.Finish(tasks[1].second, false, {}, protocol::FAILURE_CANCELLED);
  h.Finish(tasks[2].second, false, {}, protocol::FAILURE_CANCELLED);
  // a runs again with b and c chained again; their withdrawals are neither charged nor
  // recoveries.
  auto again = h.sink.TakeTasks();
  REQUIRE(again.size() == 3);
  CHECK(again[0].second.name() == "a[0]");
  CHECK(again[0].second.version() == 2);
  CHECK(again[1].second.name() == "b[0]");
  CHECK(After(again[1].second, 0).version() == 2);
  CHECK(again[2].second.name() == "c[0]");
  CHECK(again[2].second.version() == 2);
  Json st = h.sched.JobStatus(job);
  REQUIRE(st["recoveries"].size() == 1);
  CHECK(st["recoveries"][0]["vertex"] == "a[0]");
  for (auto& [d, t] : again) h.Finish(t, true);
  CHECK(h.State(job) == "completed");
}

TEST_CASE("Scheduler.ChaosFailArmedOnAChainedVertexFiresWhenItRuns") {
  // The CLI friction: `copse chaos fail JOB b[0]`, armed before b starts, never fired, since b
  // was already chained on its daemon with a task carrying no fault.
  Harness h;
  h.AddDaemon("d0", 2);
  JobId job = h.Submit(kPinnedChain);
  auto tasks = h.sink.TakeTasks();
  REQUIRE(tasks.size() == 3);
  REQUIRE(tasks[1].second.name() == "b[0]");
  h.sink.sent.clear();
  auto armed = h.sched.Chaos({{"action", "fail"}, {"job", job.value()}, {"vertex", "b[0]"}});
  REQUIRE(armed.ok());
  h.sched.Flush();
  // The chained attempt is cancelled on its daemon (and c behind it), then b is sent again,
  // chained after a as before, as attempt 2 with the fault in it.
  auto cancels = h.sink.With(JmToDaemon::kCancel);
  REQUIRE_FALSE(cancels.empty());
  REQUIRE(cancels[0].second.cancel().has_vertex());
  CHECK(cancels[0].second.cancel().vertex() == tasks[1].second.vertex());
  CHECK(cancels[0].second.cancel().version() == 1);
  auto [d, b] = h.Next("b[0]");
  CHECK(b.version() == 2);
  CHECK_FALSE(b.inject_failure().empty());
  CHECK(After(b, 0).vertex() == tasks[0].second.vertex());
  // The withdrawn attempts report their cancels (stale); a succeeds; b fails as injected, is
  // retried, and the job completes with the fault counted as fired.
  h.Finish(tasks[1].second, false, {}, protocol::FAILURE_CANCELLED);
  h.Finish(tasks[2].second, false, {}, protocol::FAILURE_CANCELLED);
  h.Finish(tasks[0].second, true);
  h.Finish(b, false);
  for (int i = 0; i < 10 && h.State(job) == "running"; ++i) {
    for (auto& [daemon, t] : h.sink.TakeTasks()) h.Finish(t, true);
  }
  Json st = h.sched.JobStatus(job);
  CHECK(st["state"] == "completed");
  REQUIRE(st["faults"].size() == 1);
  CHECK(st["faults"][0]["vertex"] == "b[0]");
  CHECK_FALSE(st.contains("faults_not_fired"));
}

TEST_CASE("Scheduler.ADeterministicProgramErrorIsNotRetried") {
  // A program error that says it repeats (a missing input file: NotFound) fails the job at its
  // first attempt; any other program error is retried up to max_attempts.
  Harness h;
  h.AddDaemon("d0");
  JobId job = h.Submit(R"({"stages": [{"name": "a", "program": "noop", "max_attempts": 4}]})");
  auto [d, a] = h.Next("a[0]");
  AttemptReport r;
  r.job = job;
  r.vertex = VertexId(a.vertex());
  r.version = a.version();
  r.error = "a[0]: cannot open missing.txt";
  r.deterministic = true;
  h.sched.OnAttemptFinished(r);
  h.sched.Flush();
  Json st = h.sched.JobStatus(job);
  CHECK(st["state"] == "failed");
  CHECK(st["failure"].get<std::string>().find("not retried") != std::string::npos);
  CHECK(st["failure"].get<std::string>().find("cannot open missing.txt") != std::string::npos);
  CHECK(h.sink.TakeTasks().empty());

  JobId other = h.Submit(R"({"stages": [{"name": "a", "program": "noop", "max_attempts": 2}]})");
  auto [d2, first] = h.Next("a[0]");
  h.Finish(first, false);  // not deterministic: retried
  auto [d3, second] = h.Next("a[0]");
  CHECK(second.version() == 2);
  h.Finish(second, false);
  CHECK(h.State(other) == "failed");
}

// p1 runs where g0 is pinned; q1, pinned by g1 to the other daemon, reads it.
const char* kTwoPinnedChains = R"({"stages": [{"name": "p0", "program": "noop", "affinity": "g0"},
                                              {"name": "q0", "program": "noop", "affinity": "g1"},
                                              {"name": "p1", "program": "noop", "affinity": "g0"},
                                              {"name": "q1", "program": "noop", "affinity": "g1"}],
  "edges": [{"from": "p0", "to": "p1"}, {"from": "q0", "to": "q1", "to_port": 0},
            {"from": "p1", "to": "q1", "to_port": 1}]})";

/// Runs p0 and q0 of kTwoPinnedChains on different daemons; returns p1's task then q1's.
std::pair<Task, Task> StartTwoPinnedChains(Harness& h) {
  h.AddDaemon("d0");
  h.AddDaemon("d1");
  h.Submit(kTwoPinnedChains);
  auto [p0_daemon, p0] = h.Next("p0[0]");
  auto [q0_daemon, q0] = h.Next("q0[0]");
  CHECK(p0_daemon != q0_daemon);
  // p1 is chained after p0 at once, on p0's slot; q1 after q0, on its slot, and after p1 (on
  // the other daemon, running chained).
  auto [p1_daemon, p1] = h.Next("p1[0]");
  CHECK(p1_daemon == p0_daemon);
  CHECK(p1.after_size() == 1);
  CHECK(After(p1, 0).vertex() == p0.vertex());
  auto [q1_daemon, q1] = h.Next("q1[0]");
  CHECK(q1_daemon == q0_daemon);
  REQUIRE(q1.after_size() == 2);
  CHECK(After(q1, 0).vertex() == q0.vertex());
  CHECK_FALSE(After(q1, 0).remote());
  CHECK(h.unclaimed.empty());
  h.Finish(q0, true);
  h.Finish(p0, true);
  CHECK(h.sink.TakeTasks().empty());
  return {p1, q1};
}

TEST_CASE("Scheduler.ChainedDispatchReachesAcrossDaemonsThroughData") {
  Harness h;
  auto [p1, q1] = StartTwoPinnedChains(h);
  // q1 goes to g1's daemon while p1 still runs on the other: it starts there when p1's output
  // arrives, fetched from p1's daemon as it is written.
  CHECK(p1.name() == "p1[0]");
  CHECK(q1.name() == "q1[0]");
  CHECK(After(q1, 1).vertex() == p1.vertex());
  CHECK(After(q1, 1).version() == p1.version());
  CHECK(After(q1, 1).remote());
  REQUIRE(q1.inputs_size() == 2);
  CHECK_FALSE(q1.inputs(1).has_empty());
  CHECK(ServedFrom(q1, 1, /*local=*/false));
  CHECK(StoredIn(q1, 1).key().version() == p1.version());
  h.Finish(p1, true);
  CHECK(h.sink.TakeTasks().empty());  // q1 is already there
  h.Finish(q1, true);
  JobId job(q1.job());
  CHECK(h.State(job) == "completed");
  CHECK(h.sched.JobStatus(job)["recoveries"].empty());
}

TEST_CASE("Scheduler.ARemoteChainIsCancelledWhenItsPredecessorFails") {
  Harness h;
  auto [p1, q1] = StartTwoPinnedChains(h);
  h.sink.sent.clear();
  // p1 fails: q1's daemon would wait for its output forever, so it is told to drop q1, which
  // is chained again after p1's next attempt.
  h.Finish(p1, false);
  auto cancels = h.sink.With(JmToDaemon::kCancel);
  REQUIRE(cancels.size() == 1);
  REQUIRE(cancels[0].second.cancel().has_vertex());
  CHECK(cancels[0].second.cancel().vertex() == q1.vertex());
  auto again = h.sink.TakeTasks();
  REQUIRE(again.size() == 2);
  if (again[0].second.name() == "q1[0]") std::swap(again[0], again[1]);
  CHECK(again[0].second.name() == "p1[0]");
  CHECK(again[1].second.name() == "q1[0]");
  CHECK(cancels[0].first == again[1].first);  // q1's pinned daemon, not p1's
  CHECK(cancels[0].first != again[0].first);
  CHECK(After(again[1].second, 0).version() == again[0].second.version());
  // The cancelled attempt's own report comes late and changes nothing.
  h.Finish(q1, false, {}, protocol::FAILURE_CANCELLED);
  CHECK(h.sink.TakeTasks().empty());
  h.Finish(again[0].second, true);
  h.Finish(again[1].second, true);
  JobId job(q1.job());
  CHECK(h.State(job) == "completed");
  Json st = h.sched.JobStatus(job);
  REQUIRE(st["recoveries"].size() == 1);
  CHECK(st["recoveries"][0]["vertex"] == "p1[0]");
}

TEST_CASE("Scheduler.ARemoteChainWithdrawnByItsDaemonWaitsForThePredecessor") {
  Harness h;
  auto [p1, q1] = StartTwoPinnedChains(h);
  // q1's daemon could not reach p1's (gone before the job manager noticed): q1 is not chained
  // again after the same attempt, but placed when p1 completes.
  h.Finish(q1, false, {}, protocol::FAILURE_CANCELLED);
  CHECK(h.sink.TakeTasks().empty());
  h.Finish(p1, true);
  auto tasks = h.sink.TakeTasks();
  REQUIRE(tasks.size() == 1);
  CHECK(tasks[0].second.name() == "q1[0]");
  CHECK(tasks[0].second.after().empty());
  h.Finish(tasks[0].second, true);
  JobId job(q1.job());
  CHECK(h.State(job) == "completed");
  CHECK(h.sched.JobStatus(job)["recoveries"].empty());
}

TEST_CASE("Scheduler.ARemoteChainThatCompletedStaysCompletedWhenItsPredecessorsDaemonIsLost") {
  // q1 read p1's output the moment it was written and reported first; p1's daemon died before
  // p1's own report came. q1 must stay completed: withdrawing it as a chain that never ran
  // counted its completion twice once it ran again, and the job "completed" one vertex short.
  Harness h;
  auto [p1, q1] = StartTwoPinnedChains(h);
  const JobId job(q1.job());
  const DaemonId p1_daemon(StoredIn(q1, 1).store().port() == 9000 + '0' ? 0 : 1);  // where q1 fetched from
  h.Finish(q1, true);
  h.LoseForGood(p1_daemon);
  for (int i = 0; i < 10 && h.State(job) == "running"; ++i) {
    auto [where, t] = h.Next();
    CHECK(where != p1_daemon);
    CHECK(t.name() != "q1[0]");  // it completed with p1's output: nothing to run again
    h.Finish(t, true);
  }
  const Json st = h.sched.JobStatus(job);
  CHECK(st["state"] == "completed");
  CHECK(st["vertices"]["completed"] == 4);
  CHECK(st["vertices"]["waiting"] == 0);
  CHECK(h.sink.TakeTasks().empty());
}

TEST_CASE("Scheduler.TasksChainedOnAPredecessorsDaemonTakeItsSlotsAheadOfTime") {
  // A data-parallel step: the update holds the whole daemon; the next step's gradient
  // vertices (unpinned, reading only the update) are chained on its slots, a third does not fit.
  Harness h;
  DaemonId d0 = h.AddDaemon("d0", 2);
  h.AddDaemon("d1", 2);
  JobId job = h.Submit(R"({"stages": [{"name": "upd", "program": "noop", "resources": {"cpus": 2}},
                                      {"name": "grad", "program": "noop", "replicas": 3}],
                           "edges": [{"from": "upd", "to": "grad", "pattern": "broadcast"}]})");
  auto [where, upd] = h.Next("upd[0]");
  std::vector<Placed> chained = h.unclaimed;
  for (auto& t : h.sink.TakeTasks()) chained.push_back(t);
  h.unclaimed.clear();
  REQUIRE(chained.size() == 2);
  for (auto& [d, t] : chained) {
    CHECK(d == where);
    CHECK(After(t, 0).vertex() == upd.vertex());
    CHECK(ServedFrom(t, 0, /*local=*/true));
  }
  CHECK(h.sched.DaemonsTable()[where.value()]["free_cpus"] == 0);  // shown as full, not as -2
  h.Finish(upd, true);
  CHECK(h.sink.TakeTasks().empty());  // the third waits for a slot where its input is
  for (auto& [d, t] : chained) h.Finish(t, true);
  auto third = h.Next();
  CHECK(third.first == where);
  CHECK(third.second.after().empty());
  h.Finish(third.second, true);
  CHECK(h.State(job) == "completed");
  CHECK(h.sched.JobStatus(job)["recoveries"].empty());
  (void)d0;
}

TEST_CASE("Scheduler.AVertexIsChainedAfterAllItsRunningPredecessorsOnTheirDaemon") {
  // A data-parallel update (both cpus) gathering two gradient vertices running on one daemon is
  // chained after both at once, on their slots; it starts when both have succeeded.
  Harness h;
  DaemonId d0 = h.AddDaemon("d0", 2);
  JobId job = h.Submit(R"({"stages": [{"name": "grad", "program": "noop", "replicas": 2},
                                      {"name": "upd", "program": "noop", "resources": {"cpus": 2}}],
                           "edges": [{"from": "grad", "to": "upd", "pattern": "gather"}]})");
  Task g0 = h.Next("grad[0]").second, g1 = h.Next("grad[1]").second;
  auto [where, upd] = h.Next("upd[0]");
  CHECK(where == d0);
  REQUIRE(upd.after_size() == 2);
  std::set<uint32_t> after{After(upd, 0).vertex(), After(upd, 1).vertex()};
  CHECK(after == std::set<uint32_t>{g0.vertex(), g1.vertex()});
  CHECK(ServedFrom(upd, 0, /*local=*/true));
  CHECK(h.sched.DaemonsTable()[0]["free_cpus"] == 0);
  // grad[1] fails: its daemon withdraws the update (reported as cancelled), which gives back
  // the slots; grad[1] runs again and the update is chained after grad[0] and that attempt.
  h.Finish(g1, false);
  CHECK(h.sink.TakeTasks().empty());  // the update holds the slots until it is withdrawn
  h.Finish(upd, false, {}, protocol::FAILURE_CANCELLED);
  Task g1b = h.Next("grad[1]").second;
  Task upd2 = h.Next("upd[0]").second;
  REQUIRE(upd2.after_size() == 2);
  for (const protocol::ChainedAfter& a : upd2.after()) {
    if (a.vertex() == g1b.vertex()) CHECK(a.version() == g1b.version());
  }
  h.Finish(g0, true);
  h.Finish(g1b, true);
  CHECK(h.sink.TakeTasks().empty());  // the update is already there
  h.Finish(upd2, true);
  CHECK(h.State(job) == "completed");
  Json st = h.sched.JobStatus(job);
  CHECK(st["stages"][1]["failed_attempts"] == 0);  // withdrawn, not charged
}

TEST_CASE("Scheduler.AWideGatherIsNotChained") {
  // Chaining after up to 8 running predecessors; a wider gather waits for them as usual (its
  // daemon would hold a long list, and every predecessor's dispatch would rescan its inputs).
  for (int width : {8, 9}) {
    CAPTURE(width);
    Harness h;
    h.AddDaemon("d0", 16);
    h.Submit(R"({"stages": [{"name": "g", "program": "noop", "replicas": )" + std::to_string(width) + R"(},
                             {"name": "u", "program": "noop"}],
                 "edges": [{"from": "g", "to": "u", "pattern": "gather"}]})");
    for (int i = 0; i < width; ++i) (void)h.Next("g[" + std::to_string(i) + "]");
    const bool chained = !h.unclaimed.empty();
    CHECK(chained == (width <= 8));
    if (chained) CHECK(h.unclaimed[0].second.after_size() == width);
  }
}

TEST_CASE("Scheduler.AVertexIsNotChainedAfterTwoPredecessorsOnOtherDaemons") {
  // u is pinned with z; p and q, which it reads, run on two other daemons: its daemon can watch
  // one remote predecessor's outputs, so u is chained only once one of them has completed.
  Harness h;
  h.AddDaemon("d0");
  h.AddDaemon("d1");
  h.AddDaemon("d2");
  JobId job = h.Submit(R"({"stages": [{"name": "z", "program": "noop", "affinity": "c"},
                                      {"name": "p", "program": "noop", "affinity": "a"},
                                      {"name": "q", "program": "noop", "affinity": "b"},
                                      {"name": "u", "program": "noop", "affinity": "c"}],
                           "edges": [{"from": "z", "to": "u", "to_port": 0}, {"from": "p", "to": "u", "to_port": 1},
                                     {"from": "q", "to": "u", "to_port": 2}]})");
  auto [z_daemon, z] = h.Next("z[0]");
  Task p = h.Next("p[0]").second, q = h.Next("q[0]").second;
  CHECK(h.unclaimed.empty());
  h.Finish(z, true);
  CHECK(h.sink.TakeTasks().empty());
  h.Finish(p, true);
  auto [u_daemon, u] = h.Next("u[0]");
  CHECK(u_daemon == z_daemon);
  REQUIRE(u.after_size() == 1);
  CHECK(After(u, 0).vertex() == q.vertex());
  CHECK(After(u, 0).remote());
  h.Finish(q, true);
  h.Finish(u, true);
  CHECK(h.State(job) == "completed");
}

TEST_CASE("Scheduler.AnUnpinnedVertexIsChainedOnlyWhereAllItsInputsAre") {
  Harness h;
  h.AddDaemon("d0", 2);
  h.AddDaemon("d1", 2);
  JobId job = h.Submit(R"({"stages": [{"name": "p", "program": "noop"}, {"name": "q", "program": "noop"},
                                      {"name": "u", "program": "noop"}],
                           "edges": [{"from": "p", "to": "u", "to_port": 0}, {"from": "q", "to": "u", "to_port": 1}]})");
  auto [p_daemon, p] = h.Next("p[0]");
  auto [q_daemon, q] = h.Next("q[0]");
  REQUIRE(p_daemon != q_daemon);
  h.Finish(q, true);
  // u's only unfinished predecessor is p, but q's output is on the other daemon: placement,
  // which weighs both inputs' bytes, decides when p completes.
  CHECK(h.sink.TakeTasks().empty());
  h.Finish(p, true);
  Task u = h.Next("u[0]").second;
  CHECK(u.after().empty());
  h.Finish(u, true);
  CHECK(h.State(job) == "completed");
}

TEST_CASE("Scheduler.AnUnpinnedVertexIsNotChainedWherePlacementMightNotPutIt") {
  // Chaining anticipates placement by inputs: not under the locality-blind policy, nor for a
  // stage that names input hosts of its own.
  const char* two = R"({"stages": [{"name": "a", "program": "noop"}, {"name": "b", "program": "noop"}],
                        "edges": [{"from": "a", "to": "b"}]})";
  const char* hosted = R"({"stages": [{"name": "a", "program": "noop"},
                                      {"name": "b", "program": "noop", "input_hosts": ["h1"]}],
                           "edges": [{"from": "a", "to": "b"}]})";
  for (const auto& [placement, job_text] : {std::pair{"load", two}, std::pair{"locality", hosted}}) {
    CAPTURE(placement);
    SchedulerOptions o;
    o.placement = placement;
    Harness h(o);
    h.AddDaemon("d0", 2);
    h.Submit(job_text);
    auto tasks = h.sink.TakeTasks();
    REQUIRE(tasks.size() == 1);
    CHECK(tasks[0].second.name() == "a[0]");
  }
}

TEST_CASE("Scheduler.ChainedDispatchCanBeTurnedOff") {
  SchedulerOptions o;
  o.chain_dispatch = false;
  Harness h(o);
  h.AddDaemon("d0", 2);
  h.Submit(kPinnedChain);
  CHECK(h.sink.TakeTasks().size() == 1);
}

TEST_CASE("Scheduler.TimeoutsFailTheAttemptAndCancelIt") {
  Harness h;
  h.AddDaemon("d0");
  JobId job = h.Submit(R"({"stages": [{"name": "slow", "program": "noop", "timeout_s": 2, "max_attempts": 1}]})");
  REQUIRE(h.sink.TakeTasks().size() == 1);
  h.clock.Advance(std::chrono::seconds(1));
  h.sched.Tick();
  CHECK(h.State(job) == "running");
  h.clock.Advance(std::chrono::seconds(2));
  h.sched.Tick();
  CHECK(h.State(job) == "failed");
  CHECK(std::string(h.sched.JobStatus(job)["failure"]).find("timeout") != std::string::npos);
  CHECK_FALSE(h.sink.With(JmToDaemon::kCancel).empty());
}

TEST_CASE("Scheduler.InjectedFaultsFromTheJobFile") {
  Harness h;
  h.AddDaemon("d0");
  JobId job = h.Submit(R"({"stages": [{"name": "a", "program": "noop"}, {"name": "b", "program": "noop"}],
                           "edges": [{"from": "a", "to": "b"}],
                           "faults": [{"fail": "a", "attempts": [1]}, {"kill_daemon_of": "b", "when": {"completed": 1}}]})");
  Task a1 = h.Next().second;
  CHECK_FALSE(a1.inject_failure().empty());
  h.Finish(a1, false);
  Task a2 = h.Next().second;
  CHECK(a2.inject_failure().empty());
  h.Finish(a2, true);
  REQUIRE(h.sink.TakeTasks().size() == 1);  // b placed: now its daemon is killed
  CHECK(h.sink.With(JmToDaemon::kKill).size() == 1);
  const Json faults = h.sched.JobStatus(job)["faults"];
  REQUIRE(faults.size() == 2);
  CHECK(faults[0]["source"] == "/faults/0");  // which entry of the job file fired
  CHECK(faults[1]["source"] == "/faults/1");
}

TEST_CASE("Scheduler.AFinishedJobListsTheFaultsThatNeverFired") {
  Harness h;
  h.AddDaemon("d0");
  JobId job = h.Submit(R"({"stages": [{"name": "a", "program": "noop"}],
                           "faults": [{"kill_daemon": "d9"}, {"fail": "a", "attempts": [1]}, {"fail": "a", "attempts": [3]}]})");
  CHECK_FALSE(h.sched.JobStatus(job).contains("faults_not_fired"));  // running: they may still fire
  h.Finish(h.Next().second, false);                                  // attempt 1 fails, as /faults/1 asks
  h.Finish(h.Next().second, true);
  REQUIRE(h.State(job) == "completed");
  const Json not_fired = h.sched.JobStatus(job)["faults_not_fired"];
  REQUIRE(not_fired.size() == 2);
  CHECK(not_fired[0] == Json{{"source", "/faults/0"}, {"fault", "kill_daemon"}});
  CHECK(not_fired[1] == Json{{"source", "/faults/2"}, {"fault", "fail"}});
}

TEST_CASE("Scheduler.AFinishedJobListsTheChaosFaultsThatNeverFired") {
  Harness h;
  h.AddDaemon("d0");
  JobId job = h.Submit(kChain);
  const uint64_t id = job.value();
  Task a = h.Next().second;
  h.Finish(a, true);  // a[0] completed
  auto late = h.sched.Chaos({{"action", "fail"}, {"job", id}, {"vertex", "a[0]"}});
  REQUIRE(late.ok());
  CHECK((*late)["note"] == "a[0] has completed: the fault fires only if it runs again");
  // c[0]'s first attempt may already be chained after b[0]'s: its second is armed.
  REQUIRE(h.sched.Chaos({{"action", "fail"}, {"job", id}, {"vertex", "c[0]"}, {"attempts", {2}}}).ok());
  h.Finish(h.Next().second, true);   // b[0]
  h.Finish(h.Next().second, false);  // c[0] attempt 1 fails on its own
  Task c2 = h.Next().second;
  CHECK_FALSE(c2.inject_failure().empty());  // attempt 2 fails as armed
  h.Finish(c2, false);
  h.Finish(h.Next().second, true);  // attempt 3
  REQUIRE(h.State(job) == "completed");
  const Json not_fired = h.sched.JobStatus(job)["faults_not_fired"];
  REQUIRE(not_fired.size() == 1);  // a[0]'s, not c[0]'s, though both came from chaos
  CHECK(not_fired[0] == Json{{"source", "chaos"}, {"fault", "fail"}, {"vertex", "a[0]"}});
}

TEST_CASE("Scheduler.AJobOutputDamagedByAFaultIsRegenerated") {
  // Readers detect damage; a job output may have none that will (here none inside the job once
  // its consumers are done), so the job would complete with it damaged and its fetch fail (seen
  // under random chaos, which may damage the sink while another branch still runs).
  Harness h;
  h.AddDaemon("d0", 2);
  JobId job = h.Submit(R"({"stages": [{"name": "a", "program": "noop"}, {"name": "s", "program": "noop"},
                                      {"name": "c", "program": "noop"}],
                           "edges": [{"from": "a", "to": "s"}, {"from": "a", "to": "c"}],
                           "outputs": [{"from": "s", "path": "out"}]})");
  h.Finish(h.Next("a[0]").second, true);
  Task s1 = h.Next("s[0]").second, c1 = h.Next("c[0]").second;
  h.Finish(s1, true);  // the job output is stored; c still runs
  REQUIRE(h.sched.Chaos({{"action", "corrupt"}, {"job", job.value()}, {"vertex", "s[0]"}}).ok());
  const auto damage = h.sink.With(JmToDaemon::kDamage);
  REQUIRE(damage.size() == 1);
  CHECK(damage[0].second.damage().damage() == protocol::DamageOutputs::CORRUPT);
  h.Finish(c1, true);
  CHECK(h.State(job) == "running");  // not completed with a damaged output
  Task s2 = h.Next("s[0]").second;
  CHECK(s2.version() > s1.version());
  h.Finish(s2, true);
  CHECK(h.State(job) == "completed");

  // A reader already running when the damage came keeps the copy it opened, and reports
  // nothing: the job output runs again all the same, and at once.
  JobId chain = h.Submit(R"({"stages": [{"name": "a", "program": "noop"}, {"name": "s", "program": "noop"},
                                        {"name": "t", "program": "noop"}],
                             "edges": [{"from": "a", "to": "s"}, {"from": "s", "to": "t"}],
                             "outputs": [{"from": "s", "path": "out"}]})");
  h.Finish(h.Next("a[0]").second, true);
  Task first = h.Next("s[0]").second;
  h.Finish(first, true);
  Task t = h.Next("t[0]").second;  // running
  REQUIRE(h.sched.Chaos({{"action", "drop"}, {"job", chain.value()}, {"vertex", "s[0]"}}).ok());
  h.sched.Flush();  // as the job manager does after each request
  // Placed by the chaos request itself, not at a later tick: a first (s's input was released
  // once s had read it), then s.
  h.Finish(h.Next("a[0]").second, true);
  Task again = h.Next("s[0]").second;
  CHECK(again.version() > first.version());
  h.Finish(t, true);
  CHECK(h.State(chain) == "running");
  h.Finish(again, true);
  CHECK(h.State(chain) == "completed");
}

TEST_CASE("Scheduler.AVertexLogSaysWhereAndWhenItCompleted") {
  // Placements and failures were logged, completions not: after "placed on" a reader could
  // not tell whether the attempt succeeded.
  Harness h;
  h.AddDaemon("d0");
  JobId job = h.Submit(kChain);
  h.Finish(h.Next().second, true, {42});
  const std::string logs = h.sched.Logs(job, "a[0]").dump();
  CHECK_MESSAGE(logs.find("a[0] version 1 completed on d0 in ") != std::string::npos, logs);
  CHECK_MESSAGE(logs.find(" ms, 42 output bytes") != std::string::npos, logs);
  // In time order, a completion before what it caused at the same instant: the job's end last.
  h.Finish(h.Next().second, true);
  h.Finish(h.Next().second, true);
  REQUIRE(h.State(job) == "completed");
  const Json all = h.sched.Logs(job, "");
  REQUIRE(all.size() >= 2);
  CHECK_MESSAGE(all[all.size() - 2].get<std::string>().find("c[0] version 1 completed on d0") != std::string::npos, all.dump());
  CHECK_MESSAGE(all.back().get<std::string>().find("s completed") != std::string::npos, all.dump());
}

TEST_CASE("Scheduler.AStragglerGetsADuplicateAndTheFirstToFinishWins") {
  Harness h;
  DaemonId d0 = h.AddDaemon("d0", 4);
  DaemonId d1 = h.AddDaemon("d1", 4);
  JobId job = h.Submit(R"({"stages": [{"name": "s", "program": "noop", "replicas": 4}]})");
  auto tasks = h.sink.TakeTasks();
  REQUIRE(tasks.size() == 4);
  h.clock.Advance(std::chrono::milliseconds(100));
  for (int i = 0; i < 3; ++i) h.Finish(tasks[i].second, true);  // peers took 100 ms
  h.clock.Advance(std::chrono::seconds(3));                     // s[3] has run 3.1 s
  h.sched.Tick();
  h.sched.Flush();
  auto dup = h.sink.TakeTasks();
  REQUIRE(dup.size() == 1);
  CHECK(dup[0].second.name() == tasks[3].second.name());
  CHECK(dup[0].second.version() == 2);
  CHECK(dup[0].first != tasks[3].first);  // on another daemon
  h.sched.Tick();
  CHECK(h.sink.TakeTasks().empty());  // one duplicate at a time
  h.Finish(dup[0].second, true);      // the duplicate wins
  CHECK(h.State(job) == "completed");
  auto cancels = h.sink.With(JmToDaemon::kCancel);
  REQUIRE(cancels.size() == 1);
  CHECK(cancels[0].first == tasks[3].first);
  CHECK(cancels[0].second.cancel().version() == 1);
  h.Finish(tasks[3].second, true);  // the loser's late report changes nothing
  CHECK(h.State(job) == "completed");
  CHECK(h.sched.JobStatus(job)["recoveries"][0]["reason"] == "straggler");
  (void)d0, (void)d1;
}

/// Four replicas of `stage` (a stage object's JSON) on two daemons of 4 slots: three finish in
/// 100 ms, the fourth is still running 3 s later and gets a duplicate on the other daemon.
struct StragglerWithDuplicate {
  explicit StragglerWithDuplicate(const std::string& stage) {
    h.AddDaemon("d0", 4);
    h.AddDaemon("d1", 4);
    job = h.Submit(R"({"stages": [)" + stage + "]}");
    tasks = h.sink.TakeTasks();
    REQUIRE(tasks.size() == 4);
    h.clock.Advance(std::chrono::milliseconds(100));
    for (int i = 0; i < 3; ++i) h.Finish(tasks[i].second, true);
    h.clock.Advance(std::chrono::seconds(3));
    h.sched.Tick();
    h.sched.Flush();
    dup = h.sink.TakeTasks();
    REQUIRE(dup.size() == 1);
  }
  Harness h;
  JobId job;
  std::vector<Placed> tasks, dup;
};

TEST_CASE("Scheduler.AStragglerWhoseDaemonDiesUnderItCountsTheLossThoughItsDuplicateCarriesOn") {
  // A vertex that slowly kills its daemon (a leak until the OOM killer) turns straggler first.
  StragglerWithDuplicate t(R"({"name": "s", "program": "noop", "replicas": 4, "max_daemon_losses": 1})");
  auto& h = t.h;
  const JobId job = t.job;
  h.sched.DaemonLost(t.tasks[3].first, "connection closed: EOF");
  h.sched.Flush();
  CHECK(h.State(job) == "failed");
  CHECK(h.sched.JobStatus(job)["failure"].get<std::string>().find("vertex s[3] reached max_daemon_losses 1") !=
        std::string::npos);
}

TEST_CASE("Scheduler.TheDaemonsListingShowsALostDaemonAsAwaitedThenLostWithNothingRunning") {
  StragglerWithDuplicate t(R"({"name": "s", "program": "noop", "replicas": 4})");
  auto& h = t.h;
  const JobId job = t.job;
  const auto& tasks = t.tasks;
  const auto& dup = t.dup;
  const DaemonId slow = tasks[3].first;
  auto row = [&](DaemonId d) { return h.sched.DaemonsTable()[d.value()]; };
  CHECK(row(slow)["running"] == 1);
  CHECK(row(dup[0].first)["running"] == 1);
  CHECK(row(slow)["state"] == "alive");

  // The straggler dies with its daemon; the duplicate carries on elsewhere.
  h.sched.DaemonLost(slow, "test");
  h.sched.Flush();
  CHECK(row(slow)["state"] == "awaited");
  CHECK(row(slow)["alive"] == false);
  CHECK(row(slow)["running"] == 0);
  h.Finish(dup[0].second, true);
  CHECK(h.State(job) == "completed");
  CHECK(row(dup[0].first)["running"] == 0);

  h.clock.Advance(SchedulerOptions().daemon_return_grace + std::chrono::milliseconds(1));
  h.sched.Tick();
  CHECK(row(slow)["state"] == "lost");
  CHECK(row(slow)["running"] == 0);
  CHECK(row(slow)["superseded"] == false);

  // Registering again after its grace gives the name a new row; the old one is superseded.
  const std::string name = row(slow)["name"];
  const DaemonId back = h.ComeBack(name, {});
  CHECK(back != slow);
  CHECK(row(back)["state"] == "alive");
  CHECK(row(back)["superseded"] == false);
  CHECK(row(slow)["superseded"] == true);
  CHECK(row(dup[0].first)["superseded"] == false);
}

TEST_CASE("Scheduler.GangsArePlacedWholeShareAVersionAndRestartTogether") {
  Harness h;
  h.AddDaemon("d0", 2);
  JobId job = h.Submit(R"({"stages": [{"name": "src", "program": "noop"}, {"name": "p", "program": "noop"},
                                      {"name": "q", "program": "noop", "max_attempts": 2}],
                           "edges": [{"from": "src", "to": "p"}, {"from": "p", "to": "q", "channel": "stream"}]})");
  h.Finish(h.Next().second, true);  // src
  auto gang = h.sink.TakeTasks();
  REQUIRE(gang.size() == 2);  // p and q together, once p's file input is there
  CHECK(gang[0].second.version() == gang[1].second.version());
  Task p = gang[0].second.name() == "p[0]" ? gang[0].second : gang[1].second;
  Task q = gang[0].second.name() == "q[0]" ? gang[0].second : gang[1].second;
  REQUIRE(p.outputs_size() == 1);
  CHECK(p.outputs(0).live().kind() == protocol::CHANNEL_STREAM);
  REQUIRE(q.inputs_size() == 1);
  CHECK(q.inputs(0).live().kind() == protocol::CHANNEL_STREAM);
  h.Finish(q, false);  // q's own error: charged to q, and p is cancelled with it
  CHECK_FALSE(h.sink.With(JmToDaemon::kCancel).empty());
  auto again = h.sink.TakeTasks();
  REQUIRE(again.size() == 2);
  CHECK(again[0].second.version() == 2);
  Json st = h.sched.JobStatus(job);
  CHECK(st["stages"][1]["failed_attempts"] == 0);
  CHECK(st["stages"][2]["failed_attempts"] == 1);
  for (auto& [d, t] : again) h.Finish(t, true);
  CHECK(h.State(job) == "completed");
}

TEST_CASE("Scheduler.NcclGangsGetRanksAndTheUniqueIdIsRelayed") {
  Harness h;
  DaemonSpec spec;
  for (const char* name : {"g0", "g1", "g2"}) {
    spec.name = name;
    spec.cpus = 1;
    spec.gpus = 1;
    REQUIRE(h.sched.AddDaemon(spec).ok());
  }
  // A ring of three GPU replicas joined by nccl channels: one gang, ranks 0..2.
  h.Submit(R"({"stages": [{"name": "w", "program": "noop", "replicas": 3, "resources": {"gpus": 1}}],
               "edges": [{"from": "w[0]", "to": "w[1]", "channel": "nccl"}, {"from": "w[1]", "to": "w[2]", "channel": "nccl"},
                         {"from": "w[2]", "to": "w[0]", "channel": "nccl"}]})");
  auto tasks = h.sink.TakeTasks();
  REQUIRE(tasks.size() == 3);
  std::set<int> ranks;
  std::set<DaemonId> daemons;
  for (auto& [d, t] : tasks) {
    REQUIRE(t.has_nccl());
    CHECK(t.nccl().nranks() == 3);
    ranks.insert(t.nccl().rank());
    daemons.insert(d);
    if (t.name() == "w[1]") {
      REQUIRE(t.inputs_size() == 1);
      CHECK(t.inputs(0).live().kind() == protocol::CHANNEL_NCCL);
      CHECK(t.inputs(0).live().peer_rank() == 0);
      REQUIRE(t.outputs_size() == 1);
      CHECK(t.outputs(0).live().kind() == protocol::CHANNEL_NCCL);
      REQUIRE(t.outputs(0).live().channels_size() == 1);
      CHECK(t.outputs(0).live().channels(0).peer_rank() == 2);
    }
  }
  CHECK(ranks == std::set<int>{0, 1, 2});
  CHECK(daemons.size() == 3);  // one GPU each
  std::string group = tasks[0].second.nccl().group();
  DaemonId rank0 = tasks[0].first;
  for (auto& [d, t] : tasks) {
    if (t.nccl().rank() == 0) rank0 = d;
  }
  h.sched.RelayNcclId(group, "abcd", rank0);
  auto relayed = h.sink.With(JmToDaemon::kNcclId);
  CHECK(relayed.size() == 2);
  for (auto& [d, m] : relayed) {
    CHECK(d != rank0);
    CHECK(m.nccl_id().id() == "abcd");
  }
}

/// A daemon with these capacities (Harness::AddDaemon gives cpus only); GPUs of
/// `gpu_memory_mb` each (0: not reported).
DaemonId AddDaemonOf(Harness& h, const std::string& name, double cpus, int gpus, int64_t memory_mb = 0,
                     int64_t gpu_memory_mb = 0) {
  DaemonSpec spec;
  spec.name = name;
  spec.cpus = cpus;
  spec.gpus = gpus;
  spec.memory_mb = memory_mb;
  spec.gpu_memory_mb = gpu_memory_mb;
  auto id = h.sched.AddDaemon(spec);
  REQUIRE(id.ok());
  return *id;
}

TEST_CASE("Scheduler.MemoryIsPlacedLikeCpus") {
  SUBCASE("vertices that together need more than a daemon's memory run one after the other") {
    Harness h;
    AddDaemonOf(h, "d0", 4, 0, 1000);
    JobId job = h.Submit(R"({"stages": [{"name": "big", "program": "noop", "replicas": 2,
                                         "resources": {"cpus": 1, "memory_mb": 600}}]})");
    auto first = h.sink.TakeTasks();
    REQUIRE(first.size() == 1);  // cpus for both, memory for one
    const Json waiting = h.sched.JobStatus(job)["waiting"];
    REQUIRE(waiting.size() == 1);
    CHECK_MESSAGE(std::string(waiting[0]["reason"]).find("no daemon has 1 cpus and 600 MB of memory free") != std::string::npos,
                  waiting.dump());
    h.Finish(first[0].second, true);
    CHECK(h.sink.TakeTasks().size() == 1);
  }
  SUBCASE("a vertex goes to a daemon with the memory it needs, and waits for none that has it") {
    Harness h;
    AddDaemonOf(h, "small", 4, 0, 1000);
    const DaemonId large = AddDaemonOf(h, "large", 4, 0, 4000);
    h.Submit(R"({"stages": [{"name": "big", "program": "noop", "resources": {"memory_mb": 2000}},
                            {"name": "huge", "program": "noop", "resources": {"memory_mb": 8000}}]})");
    auto tasks = h.sink.TakeTasks();
    REQUIRE(tasks.size() == 1);
    CHECK(tasks[0].second.name() == "big[0]");
    CHECK(tasks[0].first == large);
  }
  SUBCASE("a gang's members are spread where memory, not cpus, runs out") {
    const char* gang = R"({"stages": [{"name": "a", "program": "noop", "resources": {"memory_mb": 600}},
                                      {"name": "b", "program": "noop", "resources": {"memory_mb": 600}}],
                           "edges": [{"from": "a", "to": "b", "channel": "stream"}]})";
    Harness one;
    AddDaemonOf(one, "d0", 4, 0, 1000);
    JobId job = one.Submit(gang);
    CHECK(one.sink.TakeTasks().empty());
    const Json waiting = one.sched.JobStatus(job)["waiting"];
    REQUIRE_FALSE(waiting.empty());
    CHECK_MESSAGE(std::string(waiting[0]["reason"]).find("1200 MB of memory") != std::string::npos, waiting.dump());
    Harness two;
    AddDaemonOf(two, "d0", 4, 0, 1000);
    AddDaemonOf(two, "d1", 4, 0, 1000);
    two.Submit(gang);
    auto tasks = two.sink.TakeTasks();
    REQUIRE(tasks.size() == 2);
    CHECK(tasks[0].first != tasks[1].first);
  }
  SUBCASE("a daemon that declares no memory does not count it") {
    Harness h;
    AddDaemonOf(h, "d0", 4, 0, 0);
    h.Submit(R"({"stages": [{"name": "big", "program": "noop", "replicas": 2, "resources": {"memory_mb": 600000}}]})");
    CHECK(h.sink.TakeTasks().size() == 2);
  }
}

/// A daemon of 4 cpus and `gpus` GPUs of `gpu_memory_mb` each (0: not reported).
DaemonId AddGpuDaemon(Harness& h, const std::string& name, int gpus, int64_t gpu_memory_mb) {
  return AddDaemonOf(h, name, 4, gpus, 0, gpu_memory_mb);
}

TEST_CASE("Scheduler.GpuMemoryBoundsWhereAVertexMayRun") {
  const char* job = R"({"stages": [{"name": "train", "program": "noop", "replicas": 2,
                                    "resources": {"gpus": 1, "gpu_memory_mb": 40000}}]})";
  SUBCASE("vertices go only to daemons whose GPUs have the memory") {
    Harness h;
    AddGpuDaemon(h, "small", 2, 24000);
    const DaemonId large = AddGpuDaemon(h, "large", 1, 81559);
    JobId id = h.Submit(job);
    auto tasks = h.sink.TakeTasks();
    REQUIRE(tasks.size() == 1);  // one GPU large enough: the second replica waits for it
    CHECK(tasks[0].first == large);
    const Json waiting = h.sched.JobStatus(id)["waiting"];
    REQUIRE(waiting.size() == 1);
    CHECK_MESSAGE(std::string(waiting[0]["reason"]).find("1 gpus of 40000 MB each") != std::string::npos, waiting.dump());
    h.Finish(tasks[0].second, true);
    tasks = h.sink.TakeTasks();
    REQUIRE(tasks.size() == 1);
    CHECK(tasks[0].first == large);
  }
  SUBCASE("a stage no live daemon's GPUs can hold is refused before it runs, naming it and the sizes") {
    Harness h;
    AddGpuDaemon(h, "h100", 1, 81559);
    AddGpuDaemon(h, "a10", 4, 24000);
    const auto graph = testing::MustLoad(R"({"stages": [{"name": "ok", "program": "noop"},
                                                        {"name": "huge", "program": "noop",
                                                         "resources": {"gpus": 1, "gpu_memory_mb": 100000}}]})");
    CHECK(h.sched.WhyItCannotFit(*graph) ==
          "stage huge needs 100000 MB of memory on each of its 1 GPU(s) (resources.gpu_memory_mb), and the largest GPUs of "
          "the live daemons with 1 GPU(s) have 81559 MB (daemon h100)");
    CHECK(h.sched.WhyItCannotFit(*testing::MustLoad(job)).empty());
  }
  SUBCASE("a daemon that does not know its GPUs' memory, or no GPU daemon at all, refuses nothing") {
    Harness none;
    none.AddDaemon("cpu-only", 4);
    CHECK(none.sched.WhyItCannotFit(*testing::MustLoad(job)).empty());  // waits for GPU daemons
    Harness unknown;
    AddGpuDaemon(unknown, "old", 1, 24000);
    AddGpuDaemon(unknown, "unmeasured", 1, 0);
    CHECK(unknown.sched.WhyItCannotFit(*testing::MustLoad(job)).empty());
    unknown.Submit(job);
    auto tasks = unknown.sink.TakeTasks();
    REQUIRE(tasks.size() == 1);
    CHECK(tasks[0].second.name() == "train[0]");
  }
}

TEST_CASE("Scheduler.AGangThatDoesNotFitHoldsNoSlot") {
  Harness h;
  h.AddDaemon("d0", 1);
  h.Submit(R"({"stages": [{"name": "a", "program": "noop"}, {"name": "b", "program": "noop"}],
               "edges": [{"from": "a", "to": "b", "channel": "stream"}]})");
  CHECK(h.sink.TakeTasks().empty());
  CHECK(h.sched.DaemonsTable()[0]["free_cpus"] == 1.0);
  h.AddDaemon("d1", 1);
  h.sched.Flush();
  CHECK(h.sink.TakeTasks().size() == 2);
}

/// Two workers (affinity w0, w1) whose first vertices read one producer's output, and then a
/// gang of one GPU member per worker: the data-parallel `--reducer nccl` graph's first step.
const char* kWorkersThenAGpuGang = R"({"stages": [
    {"name": "init", "program": "noop", "resources": {"cpus": 2}},
    {"name": "a0", "program": "noop", "affinity": "w0"}, {"name": "a1", "program": "noop", "affinity": "w1"},
    {"name": "g0", "program": "noop", "affinity": "w0", "resources": {"cpus": 0.5, "gpus": 1}},
    {"name": "g1", "program": "noop", "affinity": "w1", "resources": {"cpus": 0.5, "gpus": 1}}],
  "edges": [{"from": "init", "to": "a0"}, {"from": "init", "to": "a1"}, {"from": "a0", "to": "g0"},
            {"from": "a1", "to": "g1"}, {"from": "g0", "to": "g1", "channel": "stream"}]})";

TEST_CASE("Scheduler.AnAffinityGroupIsPinnedOnlyWhereTheGangsItJoinsCanFollow") {
  Harness h;
  AddDaemonOf(h, "d0", 2, 1);
  AddDaemonOf(h, "d1", 2, 1);
  JobId job = h.Submit(kWorkersThenAGpuGang);
  auto [init_daemon, init] = h.Next("init[0]");
  h.Finish(init, true, {1000, 1000});
  // Locality alone puts both workers beside init's output, and then their gang would need two
  // GPUs on a daemon that has one, for ever.
  auto [d_a0, a0] = h.Next("a0[0]");
  auto [d_a1, a1] = h.Next("a1[0]");
  CHECK(d_a0 != d_a1);
  h.Finish(a0, true);
  h.Finish(a1, true);
  CHECK(h.Next("g0[0]").first == d_a0);
  CHECK(h.Next("g1[0]").first == d_a1);
  CHECK(h.State(job) == "running");
}

TEST_CASE("Scheduler.AGroupTooBigForTheLiveDaemonsWaitsForOneThatFits") {
  // Not a failure: daemons may join or return (one by one after a job manager restart).
  SUBCASE("a gang's unpinned group") {
    Harness h;
    h.AddDaemon("d0", 2);
    h.AddDaemon("d1", 2);
    JobId job = h.Submit(R"({"stages": [{"name": "a", "program": "noop", "affinity": "g"},
                                        {"name": "b", "program": "noop", "affinity": "g"},
                                        {"name": "c", "program": "noop", "affinity": "g"}],
                             "edges": [{"from": "a", "to": "b", "channel": "stream"}, {"from": "b", "to": "c", "channel": "stream"}]})");
    CHECK(h.sink.TakeTasks().empty());
    CHECK(h.State(job) == "running");
    CHECK(h.sched.DaemonsTable()[0]["free_cpus"] == 2.0);
    h.AddDaemon("big", 3);
    h.sched.Flush();
    CHECK(h.sink.TakeTasks().size() == 3);
  }
  SUBCASE("two groups of one gang that only one small daemon could take") {
    Harness h;
    AddDaemonOf(h, "d0", 4, 1);
    JobId job = h.Submit(kWorkersThenAGpuGang);
    h.Finish(h.Next("init[0]").second, true);
    auto [first_daemon, first] = h.Next();  // one worker pins its group to d0; the other waits
    h.Finish(first, true);
    CHECK(h.sink.TakeTasks().empty());
    CHECK(h.State(job) == "running");
    const std::string logs = h.sched.Logs(job, "").dump();
    CHECK_MESSAGE(logs.find("waits: no live daemon can hold affinity group w") != std::string::npos, logs);
    (void)first_daemon;
  }
  SUBCASE("a group whose first vertex would pin it where its gang cannot follow") {
    Harness h;
    AddDaemonOf(h, "cpu", 4, 0);  // the GPU daemon has not come back yet
    JobId job = h.Submit(kWorkersThenAGpuGang);
    h.Finish(h.Next("init[0]").second, true);
    CHECK(h.sink.TakeTasks().empty());  // a0 and a1 wait rather than pin their groups to "cpu"
    CHECK(h.State(job) == "running");
    AddDaemonOf(h, "gpu", 2, 2);
    h.sched.Flush();
    CHECK(h.Next("a0[0]").first == h.Next("a1[0]").first);  // both on "gpu", the one that fits
  }
}

/// A clock that moves `step` each time it is read: every search then costs time.
class TickingClock final : public Clock {
 public:
  explicit TickingClock(Duration step) : step_(step) {}
  TimePoint Now() const override { return TimePoint(Duration(now_ns_ += step_.count())); }
  int64_t UnixMs() const override { return 1'800'000'000'000 + now_ns_.load() / 1'000'000; }
  void Advance(Duration d) { now_ns_ += d.count(); }

 private:
  const Duration step_;
  mutable std::atomic<int64_t> now_ns_{1'000'000'000};
};

TEST_CASE("Scheduler.AGangThatDidNotFitIsSearchedAgainNoSoonerThanItsSearchCostAllowsButNotMissed") {
  // A search that found no placement is not repeated on every freed slot of the cluster within
  // 100 times what it cost (a big gang would take the job manager's thread), nor waited on for
  // more than a second: a later tick finds the room that came meanwhile.
  for (const auto step : {std::chrono::milliseconds(1), std::chrono::milliseconds(20)}) {
    CAPTURE(step.count());
    FakeSink sink;
    TickingClock clock(step);  // a search costs one step: 100 ms, or 2 s capped at 1 s
    Scheduler sched(sink, clock);
    auto add = [&](const std::string& name, double cpus) {
      DaemonSpec spec;
      spec.name = name;
      spec.cpus = cpus;
      REQUIRE(sched.AddDaemon(spec).ok());
      sched.Flush();
    };
    add("small", 1);
    sched.Submit(testing::MustLoad(R"({"stages": [{"name": "a", "program": "noop"}, {"name": "b", "program": "noop"}],
                                       "edges": [{"from": "a", "to": "b", "channel": "stream"}]})"),
                 "/tmp");
    sched.Flush();
    CHECK(sink.TakeTasks().empty());  // searched once: no daemon has two CPUs
    add("big", 2);                    // room, a few steps later
    CHECK(sink.TakeTasks().empty());
    clock.Advance(std::chrono::milliseconds(50));  // still well within the wait
    sched.Tick();
    sched.Flush();
    CHECK(sink.TakeTasks().empty());
    clock.Advance(std::chrono::seconds(1));  // past the longest wait
    sched.Tick();
    sched.Flush();
    CHECK(sink.TakeTasks().size() == 2);
  }
}

TEST_CASE("Scheduler.AGangWaitingOnItsGroupsPinIsPlacedOnceThePinnedDaemonIsLost") {
  // A gang whose affinity group is pinned to a daemon without room waits, and is not searched
  // again until capacity changes. Losing that daemon is such a change (the pin goes with it):
  // the gang must be placed elsewhere at once, not after the next slot frees somewhere.
  Harness h;
  const DaemonId gpu = AddDaemonOf(h, "gpu", 2, 1);
  // Another job holds a CPU of "gpu" for as long as the test runs (and, once "gpu" is lost,
  // waits: no other daemon has a GPU).
  h.Submit(R"({"stages": [{"name": "hold", "program": "noop", "resources": {"cpus": 1, "gpus": 1}}]})");
  CHECK(h.Next("hold[0]").first == gpu);
  // p pins group g to "gpu", the only daemon yet; s waits for one with two CPUs free; b and c,
  // a gang in g, need two CPUs of whichever daemon holds g.
  JobId job = h.Submit(R"({"stages": [
      {"name": "p", "program": "noop", "affinity": "g"}, {"name": "s", "program": "noop", "resources": {"cpus": 2}},
      {"name": "b", "program": "noop", "affinity": "g"}, {"name": "c", "program": "noop", "affinity": "g"}],
    "edges": [{"from": "s", "to": "b"}, {"from": "b", "to": "c", "channel": "stream"}]})");
  auto [p_daemon, p] = h.Next("p[0]");
  REQUIRE(p_daemon == gpu);
  const DaemonId cpu = AddDaemonOf(h, "cpu", 2, 0);
  h.sched.Flush();
  auto [s_daemon, s] = h.Next("s[0]");
  REQUIRE(s_daemon == cpu);
  h.Finish(p, true);
  h.Finish(s, true);
  CHECK(h.sink.TakeTasks().empty());  // g is on "gpu", which has one CPU free
  h.sched.DaemonLost(gpu, "connection closed: EOF");
  h.sched.Flush();
  CHECK(h.Next("b[0]").first == cpu);
  CHECK(h.Next("c[0]").first == cpu);
  CHECK(h.State(job) == "running");
}

TEST_CASE("Scheduler.AGangIsPlacedWhereOnlyAnotherMemberOrderFits") {
  // Member by member, "one" took d0 (most room) and "two" then fitted nowhere, for ever.
  Harness h;
  DaemonId big = AddDaemonOf(h, "big", 4, 2);
  DaemonId small = AddDaemonOf(h, "small", 2, 1);
  JobId job = h.Submit(R"({"stages": [{"name": "one", "program": "noop", "resources": {"gpus": 1}},
                                      {"name": "two", "program": "noop", "resources": {"gpus": 2}}],
                           "edges": [{"from": "one", "to": "two", "channel": "stream"}]})");
  CHECK(h.Next("one[0]").first == small);
  CHECK(h.Next("two[0]").first == big);
  CHECK(h.State(job) == "running");
}

TEST_CASE("Scheduler.TheStatusSaysWhyAReadyVertexWaits") {
  Harness h;
  h.AddDaemon("d0", 2);
  auto reasons = [&](JobId job) {
    std::string all;
    Json status = h.sched.JobStatus(job);
    for (const auto& w : status["waiting"]) all += w["vertex"].get<std::string>() + ": " + w["reason"].get<std::string>() + "\n";
    return all;
  };
  SUBCASE("a vertex bigger than every live daemon") {
    JobId job = h.Submit(R"({"stages": [{"name": "huge", "program": "noop", "resources": {"cpus": 4}}]})");
    CHECK_MESSAGE(reasons(job).find("huge[0]: ready; needs 4 cpus, more than any live daemon has") != std::string::npos,
                  reasons(job));
  }
  SUBCASE("a gang the live daemons cannot hold even when idle") {
    JobId job = h.Submit(R"({"stages": [{"name": "a", "program": "noop"}, {"name": "b", "program": "noop"},
                                        {"name": "c", "program": "noop"}],
                             "edges": [{"from": "a", "to": "b", "channel": "stream"}, {"from": "b", "to": "c", "channel": "stream"}]})");
    CHECK_MESSAGE(reasons(job).find("ready; its gang of 3 cannot be placed on the live daemons even when they are idle: its "
                                    "members need 3 cpus together, and the live daemons have 2 cpus free") != std::string::npos,
                  reasons(job));
    h.AddDaemon("d1", 1);
    h.sched.Flush();
    CHECK(h.sink.TakeTasks().size() == 3);
  }
  SUBCASE("a gang waiting for a member") {
    JobId job = h.Submit(R"({"stages": [{"name": "src", "program": "noop"}, {"name": "p", "program": "noop"},
                                        {"name": "q", "program": "noop"}],
                             "edges": [{"from": "src", "to": "p"}, {"from": "p", "to": "q", "channel": "stream"}]})");
    CHECK_MESSAGE(reasons(job).find("q[0]: ready; its gang of 2 waits for its member p[0] to be ready") != std::string::npos,
                  reasons(job));
  }
  SUBCASE("a gang waiting for slots") {
    JobId busy = h.Submit(R"({"stages": [{"name": "busy", "program": "noop"}]})");
    JobId job = h.Submit(R"({"stages": [{"name": "a", "program": "noop"}, {"name": "b", "program": "noop"}],
                             "edges": [{"from": "a", "to": "b", "channel": "stream"}]})");
    CHECK_MESSAGE(reasons(job).find("ready; its gang of 2 waits for 2 cpus free at once") != std::string::npos, reasons(job));
    h.Finish(h.Next("busy[0]").second, true);
    CHECK(h.State(busy) == "completed");
    CHECK(h.sink.TakeTasks().size() == 2);
  }
}

TEST_CASE("Scheduler.AffinityGroupsShareADaemon") {
  Harness h;
  h.AddDaemon("d0", 4);
  h.AddDaemon("d1", 4);
  h.Submit(R"({"stages": [{"name": "s", "program": "noop", "replicas": 4, "affinity": "g"}]})");
  auto tasks = h.sink.TakeTasks();
  REQUIRE(tasks.size() == 4);
  for (auto& [d, t] : tasks) CHECK(d == tasks[0].first);
}

}  // namespace
}  // namespace copse::jm
