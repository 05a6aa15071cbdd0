// Clients against a job manager holding a huge job (issue 38).
//
//   client_load_bench [--replicas R] [--clients C] [--skip status,trace]
//
// Starts `copse jm` on 127.0.0.1 (tests/soak/supervised_cluster.h) and prints:
//  a. status: a job of 10 stages x R replicas (pointwise, noop; default R = 100,000: a million
//     vertices) submitted with no daemon, so it stays pending; then C (default 200) `copse
//     status JOB` processes started at once: how many answered, each client's peak resident
//     memory (median and max, from wait4), the job manager's resident memory before and its
//     peak after, and the wall time for all of them; then the same with `copse-node` as the
//     client (every verb in one binary, as every client was before the split);
//  b. trace: the same job run to completion on 2 daemons x 2 slots, then `copse trace JOB` of
//     its million spans: whether it completed, the file's size and time, and the longest
//     answer to a `daemons` request sent every 10 ms meanwhile (how long the trace kept the
//     job manager's one thread from its other work).
#include <sys/resource.h>
#include <sys/wait.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <fstream>

#include "tests/soak/supervised_cluster.h"

using copse::Json;
using copse::soak::Clock;
using copse::soak::DaemonConfig;
using copse::soak::SupervisedCluster;

namespace {

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

/// A line of /proc/PID/status, in MB ("VmRSS", "VmHWM").
double ProcMb(pid_t pid, const std::string& field) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(field + ":", 0) == 0) return std::atof(line.c_str() + field.size() + 1) / 1024.0;
  }
  return 0;
}

Json BigJob(int replicas) {
  Json job = {{"name", "big"}, {"stages", Json::array()}, {"edges", Json::array()}};
  for (int s = 0; s < 10; ++s) {
    job["stages"].push_back({{"name", "s" + std::to_string(s)}, {"program", "noop"}, {"replicas", replicas}});
    if (s > 0)
      job["edges"].push_back({{"from", "s" + std::to_string(s - 1)}, {"to", "s" + std::to_string(s)}, {"pattern", "pointwise"}});
  }
  return job;
}

uint64_t Submit(SupervisedCluster& cluster, const Json& job) {
  auto reply =
      cluster.client().Call({{"op", "submit"}, {"job", job}, {"job_dir", cluster.dir().string()}}, std::chrono::minutes(5));
  if (!reply.ok()) copse::soak::Die("submit: " + reply.status().ToString());
  return (*reply)["job"].get<uint64_t>();
}

/// Starts a client: `copse` (the small client binary), or `copse-node` (every verb in one binary,
/// as every client was before the split).
pid_t SpawnClient(const std::vector<std::string>& args, const std::string& binary = "copse") {
  auto pid = copse::cli::SpawnProcess(std::string(COPSE_BINARY_DIR) + "/cli/" + binary, args, {{"COPSE_DIE_WITH_PARENT", "1"}},
                                      "/dev/null");
  if (!pid.ok()) copse::soak::Die(pid.status().ToString());
  return *pid;
}

void Status(int replicas, int clients) {
  SupervisedCluster cluster({});
  const auto t0 = Clock::now();
  const uint64_t job = Submit(cluster, BigJob(replicas));
  const double submit_s = std::chrono::duration<double>(Clock::now() - t0).count();
  const double jm_before = ProcMb(cluster.jm_pid(), "VmRSS");
  std::printf(
      "a. %d copse status %llu at once against a job manager holding a %d-vertex pending job (submitted in %.1f s; "
      "job manager %.0f MB resident)\n",
      clients, static_cast<unsigned long long>(job), 10 * replicas, submit_s, jm_before);
  std::fflush(stdout);
  for (const char* binary : {"copse", "copse-node"}) {
    const auto start = Clock::now();
    std::vector<pid_t> pids;
    for (int i = 0; i < clients; ++i) {
      pids.push_back(SpawnClient({"status", std::to_string(job), "--state-dir", cluster.state_dir().string()}, binary));
    }
    int answered = 0;
    std::vector<double> rss_mb;
    for (pid_t p : pids) {
      int status = 0;
      rusage usage{};
      if (wait4(p, &status, 0, &usage) != p) continue;
      answered += WIFEXITED(status) && WEXITSTATUS(status) == 0;
      rss_mb.push_back(usage.ru_maxrss / 1024.0);
    }
    const double wall_s = std::chrono::duration<double>(Clock::now() - start).count();
    std::printf(
        "   %-10s answered %d / %d in %.2f s; client peak resident memory median %.1f MB, max %.1f MB; job manager "
        "peak %.0f MB\n",
        binary, answered, clients, wall_s, Median(rss_mb), rss_mb.empty() ? 0 : *std::max_element(rss_mb.begin(), rss_mb.end()),
        ProcMb(cluster.jm_pid(), "VmHWM"));
    std::fflush(stdout);
  }
}

void Trace(int replicas) {
  SupervisedCluster cluster({{"d0", 2, {}}, {"d1", 2, {}}});
  const auto t0 = Clock::now();
  const uint64_t job = Submit(cluster, BigJob(replicas));
  auto done = cluster.client().Call({{"op", "wait"}, {"job", job}}, std::chrono::minutes(10));
  if (!done.ok() || (*done)["job"]["state"] != "completed") copse::soak::Die("the big job did not complete");
  const double run_s = std::chrono::duration<double>(Clock::now() - t0).count();
  std::printf("b. copse trace of the %d-vertex job, run on 2 daemons x 2 slots in %.1f s (%.0f vertices/s)\n", 10 * replicas,
              run_s, 10.0 * replicas / run_s);
  std::fflush(stdout);
  // A probe: the job manager's answer time to a small request, every 10 ms, while the trace runs.
  std::atomic<bool> stop{false};
  double longest_ms = 0;
  std::thread probe([&] {
    auto c = copse::cli::ConnectToJm(cluster.client_address());
    if (!c.ok()) return;
    while (!stop) {
      const auto asked = Clock::now();
      if (!(*c)->Call({{"op", "daemons"}}).ok()) return;
      longest_ms = std::max(longest_ms, std::chrono::duration<double, std::milli>(Clock::now() - asked).count());
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  });
  const std::string file = (cluster.dir() / "trace.json").string();
  const auto asked = Clock::now();
  pid_t p = SpawnClient({"trace", std::to_string(job), "--state-dir", cluster.state_dir().string(), "-f", file});
  int status = 0;
  rusage usage{};
  wait4(p, &status, 0, &usage);
  const double trace_s = std::chrono::duration<double>(Clock::now() - asked).count();
  stop = true;
  probe.join();
  std::error_code ec;
  const auto bytes = std::filesystem::file_size(file, ec);
  const bool ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
  std::printf(
      "   trace %s in %.2f s: %.1f MB written; client peak %.1f MB resident; longest job manager answer meanwhile "
      "%.1f ms\n",
      ok ? "completed" : "FAILED (see the client's exit status)", trace_s, ec ? 0.0 : bytes / 1e6, usage.ru_maxrss / 1024.0,
      longest_ms);
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  int replicas = 100'000, clients = 200;
  std::string skip;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--replicas"))
      replicas = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--clients"))
      clients = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--skip"))
      skip = argv[i + 1];
  }
  std::printf("client_load_bench: copse jm on 127.0.0.1\n");
  try {
    if (skip.find("status") == std::string::npos) Status(replicas, clients);
    if (skip.find("trace") == std::string::npos) Trace(replicas);
  } catch (const copse::soak::Failure& e) {
    std::fprintf(stderr, "client_load_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
