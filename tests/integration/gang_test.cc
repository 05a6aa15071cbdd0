// Live channels and gangs on a real cluster: stream and shm pipelines, memory bounded while a
// gigabyte streams, gangs placed all or nothing, and a gang restarted whole after a kill.
#include <doctest/doctest.h>

#include <fstream>

#include "cli/job_watch.h"
#include "tests/integration/test_cluster.h"

namespace copse::testing {
namespace {

Json Pipeline(const std::string& channel, int64_t bytes) {
  return {{"name", "pipe"},
          {"stages",
           {{{"name", "produce"}, {"program", "checksum"}, {"params", {{"bytes", bytes}}}},
            {{"name", "relay"}, {"program", "checksum"}, {"params", {{"bytes", bytes / 4}}}},
            {{"name", "consume"}, {"program", "checksum"}}}},
          {"edges",
           {{{"from", "produce"}, {"to", "relay"}, {"channel", channel}},
            {{"from", "relay"}, {"to", "consume"}, {"channel", channel}}}},
          {"outputs", {{{"from", "consume"}, {"path", "digest.txt"}}}}};
}

/// Peak resident memory of a process in MiB (VmHWM).
double PeakMiB(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmHWM:", 0) == 0) return std::stod(line.substr(6)) / 1024.0;
  }
  return -1;
}

TEST_CASE("Gangs.StreamPipelineMovesAGigabyteInBoundedMemory") {
  TestCluster cluster(3, 2);
  uint64_t file_job = cluster.Submit(Pipeline("file", 64 << 20));
  REQUIRE(cluster.Wait(file_job)["state"] == "completed");
  uint64_t stream_small = cluster.Submit(Pipeline("stream", 64 << 20));
  REQUIRE(cluster.Wait(stream_small)["state"] == "completed");
  // Live channels deliver exactly the bytes file channels do.
  CHECK(cluster.Output(stream_small, "digest.txt") == cluster.Output(file_job, "digest.txt"));

  uint64_t big = cluster.Submit(Pipeline("stream", int64_t{1} << 30));
  Json st = cluster.Wait(big, std::chrono::seconds(180));
  REQUIRE_MESSAGE(st["state"] == "completed", st.dump(2));
  for (pid_t pid : cluster.pids()) {
    double peak = PeakMiB(pid);
    INFO("pid " << pid << " peak " << peak << " MiB");
    CHECK(peak < 400);  // a gigabyte went through; no process held it
  }
}

TEST_CASE("Gangs.ShmPipelineSharesADaemonAndMatchesFileChannels") {
  TestCluster cluster(2, 3);
  uint64_t file_job = cluster.Submit(Pipeline("file", 8 << 20));
  uint64_t shm_job = cluster.Submit(Pipeline("shm", 8 << 20));
  REQUIRE(cluster.Wait(file_job)["state"] == "completed");
  Json st = cluster.Wait(shm_job);
  REQUIRE_MESSAGE(st["state"] == "completed", st.dump(2));
  CHECK(cluster.Output(shm_job, "digest.txt") == cluster.Output(file_job, "digest.txt"));
  auto logs = cluster.client().Call({{"op", "logs"}, {"job", shm_job}});
  std::set<std::string> daemons;
  for (const auto& line : (*logs)["lines"]) {
    std::string l = line;
    if (auto p = l.find(" placed on "); p != std::string::npos) daemons.insert(l.substr(p + 11));
  }
  CHECK(daemons.size() == 1);
}

TEST_CASE("Gangs.AGangTooBigForTheFreeSlotsWaitsWithoutHoldingAny") {
  TestCluster cluster(1, 2);
  uint64_t gang_job = cluster.Submit(Pipeline("stream", 1 << 20));  // 3 members, 2 slots
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  Json st = (*cluster.client().Call({{"op", "status"}, {"job", gang_job}}))["job"];
  CHECK(st["state"] == "running");
  CHECK(st["vertices"]["running"] == 0);
  Json daemons = (*cluster.client().Call({{"op", "daemons"}}))["daemons"];
  CHECK(daemons[0]["free_cpus"] == 2.0);  // nothing reserved
  // Other work still runs meanwhile.
  uint64_t other = cluster.Submit({{"stages", {{{"name", "x"}, {"program", "noop"}, {"replicas", 4}}}}});
  CHECK(cluster.Wait(other, std::chrono::seconds(20))["state"] == "completed");
  // A second daemon gives the gang room; stream channels may cross daemons.
  cluster.AddDaemon("d1", 2);
  Json done = cluster.Wait(gang_job, std::chrono::seconds(30));
  CHECK_MESSAGE(done["state"] == "completed", done.dump(2));
}

TEST_CASE("Gangs.AnNcclGangThatCannotJoinEndsItsJobWithTheReason") {
  // Daemons that offer a GPU they cannot use (none here, or no NCCL in the build): joining the
  // gang's NCCL group fails on every attempt. That is charged like a program error, so the job
  // ends after max_attempts; it used to restart the gang for free, thousands of times a second.
  // Where a GPU and NCCL are present the job may complete instead; either way it must end.
  TestCluster cluster(0);
  cluster.AddDaemon("g0", 1, {"--gpus", "1"});
  cluster.AddDaemon("g1", 1, {"--gpus", "1"});
  cluster.WaitForDaemons(2);
  uint64_t job = cluster.Submit({{"stages",
                                  {{{"name", "a"}, {"program", "noop"}, {"max_attempts", 2}, {"resources", {{"gpus", 1}}}},
                                   {{"name", "b"}, {"program", "noop"}, {"max_attempts", 2}, {"resources", {{"gpus", 1}}}}}},
                                 {"edges", {{{"from", "a"}, {"to", "b"}, {"channel", "nccl"}}}}});
  Json st = cluster.Wait(job, std::chrono::seconds(60));
  REQUIRE_MESSAGE((st["state"] == "completed" || st["state"] == "failed"), st.dump(2));
  if (st["state"] == "failed") {
    CHECK_MESSAGE(st["failure"].get<std::string>().find("joining the gang's NCCL group") != std::string::npos, st.dump(2));
    CHECK(st["recoveries"].size() <= 2);
  }
}

TEST_CASE("Gangs.AStageNoDaemonsGpuCanHoldIsRefusedAtSubmitAndTheRestArePlacedByGpuMemory") {
  // Daemons report each GPU's memory (here told, --gpu-memory-mb; measured where CUDA can):
  // a stage that asks more of every live GPU daemon is refused before anything runs, with the
  // stage and both sizes; one that fits runs only where it fits.
  TestCluster cluster(0);
  cluster.AddDaemon("small", 1, {"--gpus", "1", "--gpu-memory-mb", "16000"});
  cluster.AddDaemon("large", 1, {"--gpus", "1", "--gpu-memory-mb", "80000"});
  cluster.WaitForDaemons(2);
  auto daemons = cluster.client().Call({{"op", "daemons"}});
  REQUIRE(daemons.ok());
  std::map<std::string, int64_t> reported;
  for (const Json& d : (*daemons)["daemons"]) reported[d["name"]] = d.value("gpu_memory_mb", int64_t{-1});
  CHECK(reported["small"] == 16000);
  CHECK(reported["large"] == 80000);

  const Json too_big = {
      {"stages", {{{"name", "train"}, {"program", "noop"}, {"resources", {{"gpus", 1}, {"gpu_memory_mb", 90000}}}}}}};
  auto refused = cluster.client().Call({{"op", "submit"}, {"job", too_big}, {"source", "big.json"}});
  REQUIRE_FALSE(refused.ok());
  CHECK_MESSAGE(refused.status().message().find("big.json: stage train needs 90000 MB of memory on each of its 1 GPU(s) "
                                                "(resources.gpu_memory_mb), and the largest GPUs of the live daemons with 1 "
                                                "GPU(s) have 80000 MB (daemon large)") != std::string::npos,
                refused.status().ToString());

  uint64_t job = cluster.Submit(
      {{"stages",
        {{{"name", "train"}, {"program", "noop"}, {"replicas", 3}, {"resources", {{"gpus", 1}, {"gpu_memory_mb", 40000}}}}}}});
  Json st = cluster.Wait(job, std::chrono::seconds(60));
  REQUIRE_MESSAGE(st["state"] == "completed", st.dump(2));
  auto log = cluster.client().Call({{"op", "logs"}, {"job", job}});
  REQUIRE(log.ok());
  int placed = 0;
  for (const Json& line : (*log)["lines"]) {
    const std::string text = line.dump();
    if (text.find("placed on") == std::string::npos) continue;
    ++placed;
    CHECK_MESSAGE(text.find("placed on large") != std::string::npos, text);
  }
  CHECK(placed == 3);
}

TEST_CASE("Gangs.KillingAGangMembersDaemonRestartsTheGangWithIdenticalOutput") {
  TestCluster cluster(3, 2);
  Json job = Pipeline("stream", 512 << 20);
  uint64_t clean = cluster.Submit(job);
  REQUIRE(cluster.Wait(clean)["state"] == "completed");
  std::string expected = cluster.Output(clean, "digest.txt");
  // consume's first attempt starts reading 1 s late: back-pressure holds the whole gang
  // running, so the kill at 150 ms always lands mid-stream.
  job["faults"] = {{{"delay", "consume"}, {"ms", 1000}}, {{"kill_daemon_of", "relay"}, {"when", {{"after_ms", 150}}}}};
  uint64_t id = cluster.Submit(job);
  Json st = cluster.Wait(id, std::chrono::seconds(120));
  REQUIRE_MESSAGE(st["state"] == "completed", st.dump(2));
  CHECK(cluster.Output(id, "digest.txt") == expected);
  bool restarted = false;
  for (const auto& r : st["recoveries"]) {
    restarted = restarted || std::string(r["detail"]).find("gang of 3 restarts") != std::string::npos;
  }
  CHECK_MESSAGE(restarted, st["recoveries"].dump(2));
}

}  // namespace
}  // namespace copse::testing
