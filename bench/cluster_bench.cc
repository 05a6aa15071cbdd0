// Job manager + daemon throughput and latency (issue: a real cluster).
//
//   cluster_bench [--runs R] [--daemons D] [--tls-compare]
//
// Starts `copse jm` and D `copse daemon` processes on 127.0.0.1 (like `copse run`) and prints:
//  * end-to-end throughput of a 10,000-vertex noop DAG: 100 layers x 100 vertices, each
//    depending on 2 vertices of the previous layer (submit to completed, medians of R runs),
//    with 1, 2 and 4 vertex slots per daemon (a cluster per setting);
//  * single-vertex submit-to-completed latency (median and p90 of 50 jobs).
// With --tls-compare, instead: the same DAG (2 slots per daemon) and latency on two clusters
// whose daemons use TCP only, one plaintext and one with `copse jm --tls` (every connection
// TLS), measured in interleaved runs.
#include <signal.h>
#include <sys/wait.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <thread>

#include "bench/noop_dag.h"
#include "cli/jm_client.h"
#include "cli/process_util.h"

using copse::Json;
using Clock = std::chrono::steady_clock;

namespace {

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
    std::fprintf(stderr, "job did not complete: %s\n",
                 done.ok() ? (*done)["job"].dump().c_str() : done.status().ToString().c_str());
    return -1;
  }
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

/// A job manager and `daemons` daemons of `cpus` slots as processes; torn down on destruction.
class Cluster {
 public:
  /// `tls`: the job manager runs --tls; `tcp_only`: daemons never use local sockets.
  Cluster(int daemons, int cpus, bool tls = false, bool tcp_only = false) {
    char tmpl[] = "/tmp/copse-bench-XXXXXX";
    dir_ = mkdtemp(tmpl);
    auto state = dir_ / "jm";
    std::vector<std::string> jm = {"jm", "--listen", "127.0.0.1:0", "--state-dir", state.string()};
    if (tls) jm.push_back("--tls");
    Spawn(jm, {}, (dir_ / "jm.log").string());
    while (!std::filesystem::exists(state / "jm.addr")) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    copse::cli::JmAddressOptions address;
    address.state_dir = state.string();
    std::string addr = copse::ReadFile((state / "jm.addr").string()).value();
    address.jm = addr.substr(0, addr.find('\n'));
    for (int d = 0; d < daemons; ++d) {
      std::string name = "d" + std::to_string(d);
      std::vector<std::string> args = {
          "daemon", "--jm", address.jm, "--name", name, "--cpus", std::to_string(cpus), "--work-dir", (dir_ / name).string()};
      if (tcp_only) args.push_back("--no-local-socket");
      std::map<std::string, std::string> env = {{"COPSE_TOKEN_FILE", (state / "secret").string()}};
      if (tls) env["COPSE_TLS_DIR"] = (state / "tls").string();
      Spawn(args, env, (dir_ / (name + ".log")).string());
    }
    auto client = copse::cli::ConnectToJm(address);
    if (!client.ok()) {
      std::fprintf(stderr, "%s\n", client.status().ToString().c_str());
      std::exit(1);
    }
    client_ = std::move(*client);
    while ((*client_->Call({{"op", "daemons"}}))["daemons"].size() < static_cast<size_t>(daemons)) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
  ~Cluster() {
    for (pid_t p : pids_) kill(p, SIGKILL);
    for (pid_t p : pids_) waitpid(p, nullptr, 0);
    std::filesystem::remove_all(dir_);
  }
  copse::net::BlockingClient& client() { return *client_; }

 private:
  void Spawn(std::vector<std::string> args, std::map<std::string, std::string> env, const std::string& log) {
    env["COPSE_DIE_WITH_PARENT"] = "1";
    auto pid = copse::cli::SpawnProcess(std::string(COPSE_BINARY_DIR) + "/cli/copse", args, env, log);
    if (!pid.ok()) {
      std::fprintf(stderr, "%s\n", pid.status().ToString().c_str());
      std::exit(1);
    }
    pids_.push_back(*pid);
  }

  std::filesystem::path dir_;
  std::vector<pid_t> pids_;
  std::unique_ptr<copse::net::BlockingClient> client_;
};

}  // namespace

/// --tls-compare: plaintext and TLS clusters (TCP only), runs interleaved.
int CompareTls(int runs, int daemons, const Json& dag) {
  std::printf("cluster_bench --tls-compare: job manager + %d daemons (2 slots, TCP only) on 127.0.0.1, %d interleaved runs\n",
              daemons, runs);
  Cluster plain(daemons, 2, /*tls=*/false, /*tcp_only=*/true);
  Cluster tls(daemons, 2, /*tls=*/true, /*tcp_only=*/true);
  RunJob(plain.client(), dag);  // warm-up
  RunJob(tls.client(), dag);
  std::vector<double> dag_plain, dag_tls, lat_plain, lat_tls;
  Json single = {{"name", "one"}, {"stages", {{{"name", "v"}, {"program", "noop"}}}}};
  for (int r = 0; r < runs; ++r) {
    dag_plain.push_back(RunJob(plain.client(), dag));
    dag_tls.push_back(RunJob(tls.client(), dag));
    for (int i = 0; i < 10; ++i) lat_plain.push_back(RunJob(plain.client(), single) * 1000);
    for (int i = 0; i < 10; ++i) lat_tls.push_back(RunJob(tls.client(), single) * 1000);
  }
  const double vps_plain = 10000 / Median(dag_plain), vps_tls = 10000 / Median(dag_tls);
  std::printf("  10,000-vertex noop DAG: plaintext %.0f vertices/s, TLS %.0f vertices/s (TLS / plaintext %.2f)\n", vps_plain,
              vps_tls, vps_tls / vps_plain);
  std::printf("  single vertex submit -> completed: plaintext median %.2f ms (p90 %.2f), TLS median %.2f ms (p90 %.2f)\n",
              Median(lat_plain), Percentile(lat_plain, 0.9), Median(lat_tls), Percentile(lat_tls, 0.9));
  return 0;
}

int main(int argc, char** argv) {
  int runs = 5, daemons = 2;
  bool tls_compare = false;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--tls-compare")) tls_compare = true;
    if (i + 1 >= argc) continue;
    if (!std::strcmp(argv[i], "--runs")) runs = std::atoi(argv[i + 1]);
    if (!std::strcmp(argv[i], "--daemons")) daemons = std::atoi(argv[i + 1]);
  }
  Json dag = copse::bench::NoopDag(100, 100);
  if (tls_compare) return CompareTls(runs, daemons, dag);
  std::printf("cluster_bench: job manager + %d daemons on 127.0.0.1, %d runs per setting\n", daemons, runs);
  std::printf("  10,000-vertex noop DAG (100 x 100, 2 inputs each), target >= 20,000 vertices/s:\n");
  for (int cpus : {1, 2, 4}) {
    Cluster cluster(daemons, cpus);
    RunJob(cluster.client(), dag);  // warm-up
    std::vector<double> secs;
    for (int r = 0; r < runs; ++r) secs.push_back(RunJob(cluster.client(), dag));
    double med = Median(secs);
    std::printf("    %d slot(s) per daemon: median %.3f s -> %.0f vertices/s\n", cpus, med, 10000 / med);
  }
  Cluster cluster(daemons, 2);
  Json single = {{"name", "one"}, {"stages", {{{"name", "v"}, {"program", "noop"}}}}};
  std::vector<double> lat;
  for (int i = 0; i < 50; ++i) lat.push_back(RunJob(cluster.client(), single) * 1000);
  std::printf("  single vertex submit -> completed: median %.2f ms, p90 %.2f ms over 50 jobs (target <= 2 ms)\n", Median(lat),
              Percentile(lat, 0.9));
  return 0;
}
