// What `copse daemons` and `copse status` print for people.
#include <doctest/doctest.h>

#include "cli/status_view.h"

namespace copse::cli {
namespace {

Json DaemonRow(const std::string& name, const std::string& state, bool superseded, int port) {
  return {{"name", name},
          {"alive", state == "alive"},
          {"state", state},
          {"superseded", superseded},
          {"cpus", 2.0},
          {"free_cpus", 2.0},
          {"gpus", 0},
          {"running", 0},
          {"labels", Json::object()},
          {"data", port ? "127.0.0.1:" + std::to_string(port) : ""},
          {"control", port ? "local socket" : ""}};
}

size_t Count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

TEST_CASE("StatusView.ADaemonNotRegisteredSinceARestartShowsNoAddresses") {
  const std::string table = RenderDaemonsTable(Json::array({DaemonRow("d7", "awaited", false, 0)}));
  INFO(table);
  CHECK(table.find("d7            awaited     2     2        0                -        0  -                     -") !=
        std::string::npos);
}

TEST_CASE("StatusView.TheDaemonsTableShowsEachGpusMemoryWhereReported") {
  Json row = DaemonRow("g0", "alive", false, 9001);
  row["gpus"] = 2;
  row["gpu_memory_mb"] = 81559;
  CHECK(RenderDaemonsTable(Json::array({row})).find(" 2x80G ") != std::string::npos);
  row["gpu_memory_mb"] = 0;  // not measured: the count alone
  CHECK(RenderDaemonsTable(Json::array({row})).find("        2  ") != std::string::npos);
}

TEST_CASE("StatusView.TheDaemonsTableShowsFreeAndDeclaredMemory") {
  Json row = DaemonRow("d0", "alive", false, 9001);
  row["memory_mb"] = 16384;
  row["free_memory_mb"] = 15360;
  const std::string table = RenderDaemonsTable(Json::array({row}));
  INFO(table);
  CHECK(table.find("15.0/16.0G") != std::string::npos);
}

TEST_CASE("StatusView.TheDaemonsTableListsANameOnceUnlessAskedForEveryRegistration") {
  const Json rows = Json::array({DaemonRow("d0", "lost", true, 9001), DaemonRow("d1", "alive", false, 9002),
                                 DaemonRow("d0", "lost", true, 9003), DaemonRow("d0", "alive", false, 9004),
                                 DaemonRow("d2", "lost", false, 9005)});
  const std::string newest = RenderDaemonsTable(rows);
  INFO(newest);
  CHECK(Count(newest, "d0 ") == 1);
  CHECK(Count(newest, "127.0.0.1:9004") == 1);  // d0's newest registration
  CHECK(Count(newest, "127.0.0.1:9001") == 0);
  CHECK(Count(newest, "d2 ") == 1);  // lost and never back: still listed
  CHECK(Count(newest, "2 earlier registrations of these names not shown (--all lists them)") == 1);

  const std::string all = RenderDaemonsTable(rows, /*all=*/true);
  INFO(all);
  CHECK(Count(all, "d0 ") == 3);
  CHECK(Count(all, "not shown") == 0);
}

}  // namespace
TEST_CASE("StatusView.ChaosAnswersReadAsSentences") {
  CHECK(RenderChaosReply({{"fault", "kill_daemon"}, {"daemon", "d1"}, {"source", "chaos"}}) == "killed daemon d1\n");
  CHECK(RenderChaosReply({{"fault", "cut_daemon"}, {"daemon", "d0"}, {"ms", 500}}) ==
        "cut daemon d0 off from the job manager for 500 ms\n");
  CHECK(RenderChaosReply({{"fault", "fail"},
                          {"vertex", "a[0]"},
                          {"job", 3},
                          {"armed", true},
                          {"note", "a[0] has completed: the fault fires only if it runs again"}}) ==
        "armed fail on a[0] of job 3\n  note: a[0] has completed: the fault fires only if it runs again\n");
  CHECK(RenderChaosReply({{"random", true}, {"kinds", {"kill", "cut"}}}) == "random chaos started (kill, cut)\n");
  CHECK(RenderChaosReply({{"random", false}}) == "random chaos stopped\n");
}

TEST_CASE("StatusView.TheJobsTableHasAReasonColumnWhenAJobWaits") {
  const Json jobs = {{{"id", 1},
                      {"name", "big"},
                      {"state", "running"},
                      {"completed", 0},
                      {"total", 5},
                      {"elapsed_s", 2.0},
                      {"reason", "needs 64 cpus; the largest daemon offers 2"}},
                     {{"id", 2}, {"name", "small"}, {"state", "completed"}, {"completed", 1}, {"total", 1}, {"elapsed_s", 0.1}}};
  const std::string table = RenderJobsTable(jobs);
  CHECK(table.find("REASON") != std::string::npos);
  CHECK(table.find("needs 64 cpus; the largest daemon offers 2") != std::string::npos);
  CHECK(RenderJobsTable(Json::array({jobs[1]})).find("REASON") == std::string::npos);  // none waits: no column
}

TEST_CASE("StatusView.AJobsTestAccuracyShowsInItsProgressLine") {
  const Json job = {{"id", 1},
                    {"name", "mlp"},
                    {"state", "completed"},
                    {"elapsed_s", 3.0},
                    {"vertices", {{"completed", 1}, {"total", 1}}},
                    {"stages", Json::array()},
                    {"waiting", Json::array()},
                    {"faults", Json::array()},
                    {"recoveries", Json::array()},
                    {"progress", {{"step", 50}, {"steps", 50}, {"loss", 0.25}, {"test_accuracy", 0.8123}}}};
  CHECK(RenderJobStatus(job, false).find("progress: step 50/50, loss 0.2500, test accuracy 81.23 %") != std::string::npos);
}

}  // namespace copse::cli
