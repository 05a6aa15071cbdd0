// Job manager + daemon throughput and latency (issue: a real cluster).
//
//   cluster_bench [--runs R] [--daemons D] [--cpus C]
//
// Starts `copse jm` and D `copse daemon` processes on 127.0.0.1 (like `copse run`) and prints:
//  * end-to-end throughput of a 10,000-vertex noop DAG: 100 layers x 100 vertices, each
//    depending on 2 vertices of the previous layer (submit to completed, medians of R runs);
//  * single-vertex submit-to-completed latency (median and p90 of 50 jobs).
#include <signal.h>
#include <sys/wait.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <thread>

#include "cli/jm_client.h"
#include "cli/process_util.h"

using copse::Json;
using Clock = std::chrono::steady_clock;

namespace {

Json NoopDag(int layers, int width) {
  Json job = {{"name", "noop-dag"}, {"stages", Json::array()}, {"edges", Json::array()}};
  for (int l = 0; l < layers; ++l) {
    std::string name = "L" + std::to_string(l);
    job["stages"].push_back({{"name", name}, {"program", "noop"}, {"replicas", width}});
    if (l == 0) continue;
    std::string prev = "L" + std::to_string(l - 1);
    for (int i = 0; i < width; ++i) {
      for (int k : {i, (i + 1) % width}) {
        job["edges"].push_back({{"from", prev + "[" + std::to_string(k) + "]"}, {"to", name + "[" + std::to_string(i) + "]"}});
      }
    }
  }
  return job;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

double Percentile(std::vector<double> v, double p) {
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(p * v.size()))];
}

/// Submits and waits (one "wait" request the job manager answers when the job ends); returns
/// seconds from submit to completed, or -1.
double RunJob(copse::net::BlockingClient& client, const Json& job) {
  auto t0 = Clock::now();
  auto reply = client.Call({{"op", "submit"}, {"job", job}, {"job_dir", "/tmp"}});
  if (!reply.ok()) {
    std::fprintf(stderr, "submit: %s\n", reply.status().ToString().c_str());
    return -1;
  }
  auto done = client.Call({{"op", "wait"}, {"job", (*reply)["job"]}}, std::chrono::minutes(10));
  if (!done.ok() || (*done)["job"]["state"] != "completed") {
    std::fprintf(stderr, "job did not complete: %s\n", done.ok() ? (*done)["job"].dump().c_str() : done.status().ToString().c_str());
    return -1;
  }
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

}  // namespace

int main(int argc, char** argv) {
  int runs = 5, daemons = 2, cpus = 2;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--runs")) runs = std::atoi(argv[i + 1]);
    if (!std::strcmp(argv[i], "--daemons")) daemons = std::atoi(argv[i + 1]);
    if (!std::strcmp(argv[i], "--cpus")) cpus = std::atoi(argv[i + 1]);
  }
  char tmpl[] = "/tmp/copse-bench-XXXXXX";
  std::filesystem::path dir = mkdtemp(tmpl);
  auto state = dir / "jm";
  std::string copse = std::string(COPSE_BINARY_DIR) + "/cli/copse";
  std::vector<pid_t> pids;
  auto spawn = [&](std::vector<std::string> args, std::map<std::string, std::string> env, std::string log) {
    pid_t pid = fork();
    if (pid == 0) {
      for (auto& [k, v] : env) setenv(k.c_str(), v.c_str(), 1);
      freopen(log.c_str(), "a", stdout);
      freopen(log.c_str(), "a", stderr);
      std::vector<char*> a = {copse.data()};
      for (auto& s : args) a.push_back(s.data());
      a.push_back(nullptr);
      execv(copse.c_str(), a.data());
      _exit(127);
    }
    pids.push_back(pid);
  };
  spawn({"jm", "--listen", "127.0.0.1:0", "--state-dir", state.string()}, {}, (dir / "jm.log").string());
  while (!std::filesystem::exists(state / "jm.addr")) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  copse::cli::JmAddressOptions address;
  address.state_dir = state.string();
  std::string addr = copse::ReadFile((state / "jm.addr").string()).value();
  address.jm = addr.substr(0, addr.find('\n'));
  for (int d = 0; d < daemons; ++d) {
    std::string name = "d" + std::to_string(d);
    spawn({"daemon", "--jm", address.jm, "--name", name, "--cpus", std::to_string(cpus), "--work-dir", (dir / name).string()},
          {{"COPSE_TOKEN_FILE", (state / "secret").string()}}, (dir / (name + ".log")).string());
  }
  auto client = copse::cli::ConnectToJm(address);
  if (!client.ok()) {
    std::fprintf(stderr, "%s\n", client.status().ToString().c_str());
    return 1;
  }
  while ((*(*client)->Call({{"op", "daemons"}}))["daemons"].size() < static_cast<size_t>(daemons)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  Json dag = NoopDag(100, 100);
  std::vector<double> secs;
  RunJob(**client, dag);  // warm-up
  for (int r = 0; r < runs; ++r) secs.push_back(RunJob(**client, dag));
  double med = Median(secs);
  std::printf("cluster_bench: job manager + %d daemons x %d slots, 127.0.0.1\n", daemons, cpus);
  std::printf("  10,000-vertex noop DAG (100 x 100, 2 inputs each): median %.3f s over %d runs -> %.0f vertices/s (target >= 20,000)\n",
              med, runs, 10000 / med);
  Json single = {{"name", "one"}, {"stages", {{{"name", "v"}, {"program", "noop"}}}}};
  std::vector<double> lat;
  for (int i = 0; i < 50; ++i) lat.push_back(RunJob(**client, single) * 1000);
  std::printf("  single vertex submit -> completed: median %.2f ms, p90 %.2f ms over 50 jobs (target <= 2 ms)\n",
              Median(lat), Percentile(lat, 0.9));
  for (pid_t p : pids) kill(p, SIGKILL);
  for (pid_t p : pids) waitpid(p, nullptr, 0);
  std::filesystem::remove_all(dir);
  return 0;
}
