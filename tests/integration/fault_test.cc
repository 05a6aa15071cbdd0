// Fault injection on a real cluster: every faulted run must produce outputs byte-identical to
// the same job's fault-free run.
#include <doctest/doctest.h>

#include <functional>

#include "cli/job_watch.h"
#include "jobmanager/journal.h"
#include "tests/integration/test_cluster.h"

namespace copse::testing {
namespace {

/// The declared output `output` of `job` run without faults.
std::string FaultFreeOutput(TestCluster& cluster, Json job, const std::string& output) {
  job.erase("faults");
  uint64_t id = cluster.Submit(job);
  Json st = cluster.Wait(id);
  REQUIRE_MESSAGE(st["state"] == "completed", st.dump());
  return cluster.Output(id, output);
}

/// Runs `job` without its faults, then with them, on one cluster; returns the faulted run's
/// final status after checking every declared output is identical.
Json RunWithAndWithoutFaults(TestCluster& cluster, Json job, const std::string& output) {
  std::string expected = FaultFreeOutput(cluster, job, output);
  uint64_t b = cluster.Submit(job);
  Json sb = cluster.Wait(b);
  REQUIRE_MESSAGE(sb["state"] == "completed", sb.dump(2));
  CHECK(cluster.Output(b, output) == expected);
  CHECK(sb["faults"].size() >= 1);
  return sb;
}

Json ChecksumChain(int width) {
  return {{"name", "chain"},
          {"stages",
           {{{"name", "a"}, {"program", "checksum"}, {"replicas", width}, {"params", {{"bytes", 200000}}}},
            {{"name", "b"}, {"program", "checksum"}, {"replicas", width}, {"params", {{"bytes", 100000}}}},
            {{"name", "c"}, {"program", "checksum"}}}},
          {"edges", {{{"from", "a"}, {"to", "b"}, {"channel", "memory"}}, {{"from", "b"}, {"to", "c"}, {"pattern", "gather"}}}},
          {"outputs", {{{"from", "c"}, {"path", "digest.txt"}}}}};
}

bool HasRecovery(const Json& status, const std::string& vertex, const std::string& reason) {
  for (const auto& r : status["recoveries"]) {
    if (r["vertex"] == vertex && r["reason"] == reason) return true;
  }
  return false;
}

TEST_CASE("Faults.DaemonKilledMidWordCount") {
  TestCluster cluster(3);
  for (int shard = 0; shard < 6; ++shard) {
    std::ofstream f(cluster.dir() / ("s" + std::to_string(shard) + ".txt"));
    for (int line = 0; line < 3000; ++line) f << "w" << (line * 7 + shard) % 97 << " x" << line % 13 << "\n";
  }
  Json job = {{"name", "wc"},
              {"stages",
               {{{"name", "read"}, {"program", "text.read_lines"}, {"replicas", 6}, {"params", {{"path", "s{replica}.txt"}}}},
                {{"name", "count"}, {"program", "text.count_words"}, {"replicas", 3}},
                {{"name", "merge"}, {"program", "text.merge_counts"}}}},
              {"edges",
               {{{"from", "read"}, {"to", "count"}, {"pattern", "all_to_all"}, {"channel", "memory"}},
                {{"from", "count"}, {"to", "merge"}, {"pattern", "gather"}}}},
              {"outputs", {{{"from", "merge"}, {"path", "counts.txt"}}}},
              {"faults", {{{"kill_daemon_of", "count[1]"}, {"when", {{"completed", 7}}}}}}};
  Json st = RunWithAndWithoutFaults(cluster, job, "counts.txt");
  CHECK(st["faults"][0]["fault"] == "kill_daemon_of");
  CHECK(st["recoveries"].size() >= 1);
}

TEST_CASE("Faults.KillingTheDaemonThatHoldsNeededOutputsCascadesUpstream") {
  TestCluster cluster(3);
  Json job = ChecksumChain(4);
  // c waits 700 ms before reading, so b[0]'s output is still needed when its daemon dies;
  // a[0]'s output was already released, so lineage must re-run a[0] as well.
  job["faults"] = {{{"delay", "c"}, {"ms", 700}}, {{"kill_daemon_of", "b[0]"}, {"when", {{"completed", 8}}}}};
  Json st = RunWithAndWithoutFaults(cluster, job, "digest.txt");
  CHECK_MESSAGE(HasRecovery(st, "b[0]", "output_lost"), st["recoveries"].dump(2));
  CHECK_MESSAGE(HasRecovery(st, "a[0]", "output_lost"), st["recoveries"].dump(2));
}

TEST_CASE("Faults.ADaemonRestartedOnItsWorkDirKeepsItsFileOutputs") {
  // A service manager restarts the killed daemon under its name and work dir within the job
  // manager's return grace: b's file outputs it wrote are listed again and read from there,
  // so nothing runs again for a lost output.
  TestCluster cluster(2, 2, 1000, {"--daemon-return-grace-ms", "30000"});
  Json job = ChecksumChain(4);
  job["faults"] = {{{"delay", "c"}, {"ms", 700}}, {{"kill_daemon_of", "b[0]"}, {"when", {{"completed", 8}}}}};
  const std::string expected = FaultFreeOutput(cluster, job, "digest.txt");
  const uint64_t id = cluster.Submit(job);
  std::string dead;
  for (auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20); dead.empty();) {
    REQUIRE(std::chrono::steady_clock::now() < deadline);
    auto reply = cluster.client().Call({{"op", "daemons"}});
    REQUIRE(reply.ok());
    for (const auto& d : (*reply)["daemons"]) {
      if (!d["alive"].get<bool>()) dead = d["name"];
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  cluster.AddDaemon(dead, 2);
  const Json st = cluster.Wait(id);
  REQUIRE_MESSAGE(st["state"] == "completed", st.dump(2));
  CHECK(cluster.Output(id, "digest.txt") == expected);
  CHECK(st["faults"].size() == 2);
  for (const auto& r : st["recoveries"]) CHECK_MESSAGE(r["reason"] != "output_lost", st["recoveries"].dump(2));
  // It came back as itself: one daemon of that name, alive.
  auto reply = cluster.client().Call({{"op", "daemons"}});
  REQUIRE(reply.ok());
  CHECK((*reply)["daemons"].size() == 2);
  for (const auto& d : (*reply)["daemons"]) CHECK(d["alive"].get<bool>());
}

/// ChecksumChain with durable channels from a to b: a's outputs have copies under durable_dir.
Json DurableChecksumChain(int width) {
  Json job = ChecksumChain(width);
  job["edges"][0]["channel"] = "durable";
  return job;
}

TEST_CASE("Faults.LineageStopsAtADurableOutputWhoseDaemonWasKilled") {
  TestCluster cluster(3);
  Json job = DurableChecksumChain(4);
  // As in the cascade above, b[0]'s output is lost with its daemon, but a[0]'s copy is read
  // instead of re-running a[0].
  job["faults"] = {{{"delay", "c"}, {"ms", 700}}, {{"kill_daemon_of", "b[0]"}, {"when", {{"completed", 8}}}}};
  Json st = RunWithAndWithoutFaults(cluster, job, "digest.txt");
  CHECK_MESSAGE(HasRecovery(st, "b[0]", "output_lost"), st["recoveries"].dump(2));
  for (const auto& r : st["recoveries"]) CHECK_MESSAGE(r["vertex"].get<std::string>()[0] != 'a', st["recoveries"].dump(2));
  CHECK(!std::filesystem::exists(cluster.dir() / "durable"));  // removed with the job
}

TEST_CASE("Faults.ACorruptedDurableOutputIsReadFromItsCopy") {
  TestCluster cluster(2);
  Json job = DurableChecksumChain(2);
  job["faults"] = {{{"delay", "b[0]"}, {"ms", 300}}, {{"corrupt_output_of", "a[0]"}}};
  Json st = RunWithAndWithoutFaults(cluster, job, "digest.txt");
  CHECK_MESSAGE(st["recoveries"].empty(), st["recoveries"].dump(2));  // the store failed, the copy served
}

TEST_CASE("Faults.ACorruptedStoredOutputIsDetectedAndRegenerated") {
  TestCluster cluster(2);
  Json job = ChecksumChain(2);
  job["faults"] = {{{"delay", "b[0]"}, {"ms", 300}}, {{"corrupt_output_of", "a[0]"}}};
  Json st = RunWithAndWithoutFaults(cluster, job, "digest.txt");
  CHECK_MESSAGE(HasRecovery(st, "b[0]", "input_lost"), st["recoveries"].dump(2));
  CHECK_MESSAGE(HasRecovery(st, "a[0]", "output_lost"), st["recoveries"].dump(2));
  CHECK(st["stages"][1]["failed_attempts"] == 0);  // the reader is not charged
}

TEST_CASE("Faults.AVertexFailingTwiceThenSucceeding") {
  TestCluster cluster(2);
  Json job = ChecksumChain(2);
  job["faults"] = {{{"fail", "b[1]"}, {"attempts", {1, 2}}}};
  Json st = RunWithAndWithoutFaults(cluster, job, "digest.txt");
  CHECK(st["stages"][1]["failed_attempts"] == 2);
  CHECK(st["recoveries"].size() == 2);
}

TEST_CASE("Faults.AVertexChainedAfterSeveralPredecessorsOnADaemonRunsAfterAllOrIsWithdrawn") {
  // One daemon, two slots: c (gathering b[0] and b[1]) is chained after both b attempts as soon
  // as they are placed, and held there until they have succeeded; when b[1]'s attempt fails,
  // the daemon withdraws c, which is chained again. The output equals the fault-free run's.
  TestCluster cluster(1, 2);
  Json job = {{"name", "gather"},
              {"stages",
               {{{"name", "b"}, {"program", "checksum"}, {"replicas", 2}, {"params", {{"bytes", 100000}}}},
                {{"name", "c"}, {"program", "checksum"}}}},
              {"edges", {{{"from", "b"}, {"to", "c"}, {"pattern", "gather"}}}},
              {"outputs", {{{"from", "c"}, {"path", "digest.txt"}}}},
              {"faults", {{{"fail", "b[1]"}, {"attempts", {1}}}}}};
  Json st = RunWithAndWithoutFaults(cluster, job, "digest.txt");
  CHECK(st["stages"][0]["failed_attempts"] == 1);
  CHECK(st["stages"][1]["failed_attempts"] == 0);  // withdrawn, not charged
  auto logs = cluster.client().Call({{"op", "logs"}, {"job", st["id"]}, {"vertex", "c[0]"}});
  REQUIRE(logs.ok());
  int chained_after_both = 0, withdrawn = 0;
  for (const auto& line : (*logs)["lines"]) {
    const std::string text = line.dump();
    chained_after_both +=
        text.find("chained after b[0], b[1]") != std::string::npos || text.find("chained after b[1], b[0]") != std::string::npos;
    withdrawn += text.find("withdrawn") != std::string::npos;
  }
  CHECK(chained_after_both >= 1);
  CHECK(withdrawn >= 1);
}

TEST_CASE("Faults.AVertexFailingEveryAttemptFailsItsJobWithTheReason") {
  TestCluster cluster(2);
  Json job = ChecksumChain(2);
  job["stages"][1]["max_attempts"] = 3;
  job["faults"] = {{{"fail", "b[0]"}, {"attempts", {1, 2, 3}}}};
  uint64_t id = cluster.Submit(job);
  Json st = cluster.Wait(id);
  CHECK(st["state"] == "failed");
  std::string failure = st["failure"];
  CHECK_MESSAGE(failure.find("b[0] failed 3 of 3 attempts") != std::string::npos, failure);
  CHECK_MESSAGE(failure.find("injected fault /faults/0") != std::string::npos, failure);
}

TEST_CASE("Faults.AStragglerIsDuplicatedAndTheJobDoesNotWaitForIt") {
  TestCluster cluster(2, 4, 1000, {"--straggler-min-ms", "300"});
  Json job = {{"name", "straggler"},
              {"stages",
               {{{"name", "s"}, {"program", "checksum"}, {"replicas", 4}, {"params", {{"sleep_ms", 50}}}},
                {{"name", "sink"}, {"program", "checksum"}}}},
              {"edges", {{{"from", "s"}, {"to", "sink"}, {"pattern", "gather"}}}},
              {"outputs", {{{"from", "sink"}, {"path", "digest.txt"}}}},
              {"faults", {{{"delay", "s[2]"}, {"ms", 20000}}}}};  // only the first attempt is slow
  auto started = std::chrono::steady_clock::now();
  Json st = RunWithAndWithoutFaults(cluster, job, "digest.txt");
  CHECK(std::chrono::steady_clock::now() - started < std::chrono::seconds(10));
  CHECK_MESSAGE(HasRecovery(st, "s[2]", "straggler"), st["recoveries"].dump(2));
}

/// 4 lanes of 6 steps, 60 ms each: about 0.8 s of work on 4 slots, and a sink.
Json LanesJob() {
  Json job = {{"name", "resume"}, {"stages", Json::array()}, {"edges", Json::array()}};
  const int steps = 6;
  for (int s = 0; s < steps; ++s) {
    job["stages"].push_back({{"name", "s" + std::to_string(s)},
                             {"program", "checksum"},
                             {"replicas", 4},
                             {"params", {{"sleep_ms", 60}, {"bytes", 1000}}}});
    if (s)
      job["edges"].push_back({{"from", "s" + std::to_string(s - 1)}, {"to", "s" + std::to_string(s)}, {"channel", "memory"}});
  }
  job["stages"].push_back({{"name", "sink"}, {"program", "checksum"}});
  job["edges"].push_back({{"from", "s" + std::to_string(steps - 1)}, {"to", "sink"}, {"pattern", "gather"}});
  job["outputs"] = {{{"from", "sink"}, {"path", "digest.txt"}}};
  return job;
}

/// Runs LanesJob fault-free (job 1), then again (job 2) with the job manager SIGKILLed once 8
/// of its 25 vertices are done and restarted with `restart_args`, `kills` times in a row (a
/// restarted job manager has compacted its journal once it listens): job 2 completes with job
/// 1's output, and the last job manager runs only what its journal did not record as done.
/// `before_kill` looks at the cluster just before the first kill.
void CheckAJobManagerKilledMidJobResumesIt(
    TestCluster& cluster, const std::vector<std::string>& restart_args, int kills = 1,
    const std::function<void()>& before_kill = [] {}) {
  const Json job = LanesJob();
  std::string expected = FaultFreeOutput(cluster, job, "digest.txt");
  uint64_t id = cluster.Submit(job);
  size_t done_before = 0;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (done_before < 8) {
    REQUIRE(std::chrono::steady_clock::now() < deadline);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    done_before = (*cluster.client().Call({{"op", "status"}, {"job", id}}))["job"]["vertices"]["completed"];
  }
  REQUIRE(done_before < 25);
  before_kill();
  for (int k = 0; k < kills; ++k) {
    cluster.KillJm();
    cluster.RestartJm(restart_args);
  }
  Json st = cluster.Wait(id);
  REQUIRE_MESSAGE(st["state"] == "completed", st.dump(2));
  CHECK(cluster.Output(id, "digest.txt") == expected);
  auto logs = cluster.client().Call({{"op", "logs"}, {"job", id}});
  REQUIRE(logs.ok());
  // The log covers the job's whole life (its history): count the placements the last job
  // manager made, after its restore.
  size_t placed = 0;
  bool restored = false;
  for (const auto& line : (*logs)["lines"]) {
    std::string l = line;
    if (l.find("restored from the journal") != std::string::npos) {
      restored = true;
      placed = 0;
    }
    placed += l.find(" placed on ") != std::string::npos;
  }
  CHECK(restored);
  CHECK_MESSAGE(placed <= 25 - done_before, "placed " << placed << " after " << done_before << " were done; the log:\n"
                                                      << (*logs)["lines"].dump(1).substr(0, 20000));
  CHECK(placed > 0);
}

TEST_CASE("Faults.AJobManagerKilledAndRestartedResumesItsJobs") {
  TestCluster cluster(2, 2);
  CheckAJobManagerKilledMidJobResumesIt(cluster, {});
}

TEST_CASE("Faults.AJobManagerWhoseJournalWasCompactedMidJobResumesFromTheSnapshot") {
  // Finished jobs are forgotten after 1 s, and the journal is compacted past 1 KiB once half of
  // it is superseded: job 1, run and forgotten first, is that half.
  const std::vector<std::string> args = {"--journal-compact-size", "1KiB", "--finished-job-ttl-s", "1"};
  TestCluster cluster(2, 2, 1000, args);
  REQUIRE(cluster.Wait(cluster.Submit(ChecksumChain(1)))["state"] == "completed");
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  // Forgotten: answered from its history from then on.
  while (!(*cluster.client().Call({{"op", "status"}, {"job", 1}}))["job"].value("forgotten", false)) {
    REQUIRE(std::chrono::steady_clock::now() < deadline);
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  // Killed with a compacted journal (plus what was appended since), then again right after
  // the restarted job manager wrote its snapshot of the running job 3.
  CheckAJobManagerKilledMidJobResumesIt(cluster, args, /*kills=*/2, [&] {
    auto records = jm::Journal::Replay(cluster.dir() / "jm", nullptr);
    REQUIRE(records.ok());
    bool ids = false;
    for (const auto& r : *records) {
      ids |= r.has_ids();                           // only a snapshot writes one
      CHECK((!r.has_job() || r.job().job() != 1));  // the forgotten job is gone
      CHECK((!r.has_done() || r.done().job() != 1));
    }
    CHECK(ids);
  });
  CHECK(cluster.Submit(ChecksumChain(1)) == 4);  // no job id is handed out twice
}

/// The contents of the damaged journals the job manager kept in `state` for a person.
std::vector<std::string> KeptDamagedJournals(const std::filesystem::path& state) {
  std::vector<std::string> kept;
  for (const auto& entry : std::filesystem::directory_iterator(state)) {
    if (entry.path().filename().string().rfind("journal.bin.damaged-", 0) == 0) {
      kept.push_back(ReadFile(entry.path().string()).value());
    }
  }
  return kept;
}

/// Runs job 1 to completion on `cluster`, kills its job manager, and returns the journal the
/// job manager left, for a test to damage before restarting it.
std::string JournalOfAFinishedJobAfterTheJobManagerDied(TestCluster& cluster) {
  REQUIRE(cluster.Wait(cluster.Submit(ChecksumChain(1)))["state"] == "completed");
  cluster.KillJm();
  return ReadFile((cluster.dir() / "jm" / jm::Journal::kFileName).string()).value();
}

TEST_CASE("Faults.JobsSubmittedAfterTheJournalWasDamagedSurviveTheNextRestart") {
  TestCluster cluster(1, 2);
  const std::string before = JournalOfAFinishedJobAfterTheJobManagerDied(cluster);
  // Its start damaged: nothing after it can be trusted, so none of it is restored.
  const auto state = cluster.dir() / "jm";
  std::ofstream(state / jm::Journal::kFileName) << "GARBAGE\n" << before;
  cluster.RestartJm();
  const uint64_t after = cluster.Submit(ChecksumChain(1));
  CHECK(after == 2);  // job 1 is named after the damage: its id is not handed out again
  REQUIRE(cluster.Wait(after)["state"] == "completed");
  cluster.KillJm();
  cluster.RestartJm();
  auto status = cluster.client().Call({{"op", "status"}, {"job", after}});
  REQUIRE_MESSAGE(status.ok(), "job " << after << " was lost: " << status.status().ToString());
  CHECK((*status)["job"]["state"] == "completed");
  // The damaged journal is kept, whole, for a person to look at.
  CHECK(KeptDamagedJournals(state) == std::vector<std::string>{"GARBAGE\n" + before});
}

TEST_CASE("Faults.AJournalRecordThatContradictsTheOthersIsSkippedAndTheJournalKept") {
  // A second copy of a finished job's record (damage that still parses) used to reset the job
  // and run it again, and the rewrite made that permanent.
  TestCluster cluster(1, 2);
  const std::string before = JournalOfAFinishedJobAfterTheJobManagerDied(cluster);
  const auto state = cluster.dir() / "jm";
  // The header line, then frames of a 16-byte head (its length at bytes 4-7) and a body.
  const size_t first = before.find('\n') + 1;
  size_t first_length = 0;
  for (int i = 3; i >= 0; --i) first_length = first_length << 8 | static_cast<unsigned char>(before[first + 4 + i]);
  const std::string damaged = before + before.substr(first, 16 + first_length);  // the job's record again
  std::ofstream(state / jm::Journal::kFileName) << damaged;
  cluster.RestartJm();
  auto status = cluster.client().Call({{"op", "status"}, {"job", 1}});
  REQUIRE(status.ok());
  CHECK((*status)["job"]["state"] == "completed");
  CHECK(KeptDamagedJournals(state) == std::vector<std::string>{damaged});
}

/// A 120-vertex layered checksum DAG that keeps running for at least 1.5 s.
Json SlowDag() {
  Json job = {{"name", "chaos"}, {"stages", Json::array()}, {"edges", Json::array()}};
  for (int l = 0; l < 12; ++l) {
    job["stages"].push_back({{"name", "l" + std::to_string(l)},
                             {"program", "checksum"},
                             {"replicas", 10},
                             {"params", {{"sleep_ms", 6}, {"bytes", 20000}}}});
    if (l)
      job["edges"].push_back({{"from", "l" + std::to_string(l - 1)},
                              {"to", "l" + std::to_string(l)},
                              {"pattern", "all_to_all"},
                              {"channel", l % 2 ? "memory" : "file"}});
  }
  job["stages"].push_back({{"name", "sink"}, {"program", "checksum"}});
  job["edges"].push_back({{"from", "l11"}, {"to", "sink"}, {"pattern", "gather"}});
  job["outputs"] = {{{"from", "sink"}, {"path", "digest.txt"}}};
  // The sink's first attempt waits 1.5 s, so the job is certainly still running when a test
  // injects faults into it, however fast the machine (chaos records faults in running jobs).
  job["faults"] = {{{"delay", "sink"}, {"ms", 1500}}};
  return job;
}

/// Runs `copse chaos ARGS` against the cluster, as a user would.
int Chaos(TestCluster& cluster, const std::string& args) {
  std::string cmd = CopseBinary() + " chaos " + args + " --jm " + cluster.address().jm + " --state-dir " +
                    cluster.address().state_dir + " > /dev/null";
  return std::system(cmd.c_str());
}

TEST_CASE("Faults.SeededRandomChaosFromTheCliLeavesOutputsIdentical") {
  TestCluster cluster(3, 2);
  Json job = SlowDag();
  std::string expected = FaultFreeOutput(cluster, job, "digest.txt");
  uint64_t id = cluster.Submit(job);
  REQUIRE(Chaos(cluster, "random --seed 7 --interval-ms 60 --duration-s 20 --kinds fail,delay,corrupt,cut --cut-ms 300") == 0);
  Json st = cluster.Wait(id, std::chrono::seconds(120));
  REQUIRE(Chaos(cluster, "stop") == 0);
  REQUIRE_MESSAGE(st["state"] == "completed", st.dump(2));
  CHECK(cluster.Output(id, "digest.txt") == expected);
  INFO(st["faults"].dump());
  CHECK(st["faults"].size() >= 3);
  CHECK(st["recoveries"].size() >= 1);
}

TEST_CASE("Faults.ChaosKillsADaemonByNameMidJob") {
  TestCluster cluster(3, 2);
  Json job = SlowDag();
  std::string expected = FaultFreeOutput(cluster, job, "digest.txt");
  uint64_t id = cluster.Submit(job);
  std::this_thread::sleep_for(std::chrono::milliseconds(400));
  REQUIRE(Chaos(cluster, "kill d1") == 0);
  CHECK(Chaos(cluster, "kill no-such-daemon 2>/dev/null") != 0);  // a clear error, exit 1
  Json st = cluster.Wait(id, std::chrono::seconds(60));
  REQUIRE_MESSAGE(st["state"] == "completed", st.dump(2));
  CHECK(cluster.Output(id, "digest.txt") == expected);
  bool killed = false;
  for (const auto& f : st["faults"]) killed = killed || (f["fault"] == "kill_daemon" && f["daemon"] == "d1");
  CHECK(killed);
}

TEST_CASE("Faults.SeveralJobsRunAtOnce") {
  TestCluster cluster(2);
  std::vector<uint64_t> ids;
  for (int i = 0; i < 4; ++i) ids.push_back(cluster.Submit(ChecksumChain(3 + i)));
  for (uint64_t id : ids) CHECK(cluster.Wait(id)["state"] == "completed");
}

}  // namespace
}  // namespace copse::testing
