// Randomized soak (issue 5): many runs of a random checksum DAG under random daemon kills and
// vertex failures, each checked against the digest its graph must produce.
//
//   soak_bench [--runs 50] [--vertices 200] [--seed S] [--daemons 3] [--cpus 2] [--keep]
//
// One `copse jm` and D `copse daemon` processes on 127.0.0.1, supervised: a daemon a fault
// SIGKILLed is started again with the same name (tests/soak/supervised_cluster.h). For run r
// (seeded by S + r): a random DAG of `--vertices` checksum vertices in all (fan-in 1-3 from any
// earlier vertex, memory or file channels, sleep_ms 2-10, one sink gathering every vertex
// without consumers, output digest.txt), run once without faults and once with random faults:
// in 3 runs of 4 a `kill_daemon_of` a random vertex at a random completion count (at most one
// daemon per run, so D-1 stay alive), and 0-3 `fail` faults on random vertices with attempts [1]
// or [1, 2] (max_attempts 4). Both runs' sink output must equal the digest recomputed here from
// the expanded graph (jm::LoadJobJson + vertex::ChecksumHasher). Prints runs, runs correct,
// faults by kind, recoveries by reason, and the extra time of the faulted run over its
// fault-free twin (median and p90, seconds and %). Exit 1 if any job failed, hung, or produced
// a different output.
#include <algorithm>
#include <cstring>
#include <map>
#include <random>

#include "cli/job_watch.h"
#include "cli/program_catalog.h"
#include "jobmanager/job_loader.h"
#include "tests/soak/supervised_cluster.h"
#include "vertex/programs/checksum.h"

using copse::Json;
using copse::soak::Clock;

namespace {

Json RandomDag(int vertices, uint32_t seed) {
  std::mt19937 rng(seed);
  Json job = {{"name", "soak-" + std::to_string(seed)},
              {"stages", Json::array()},
              {"edges", Json::array()},
              {"defaults", {{"max_attempts", 4}}}};
  const int n = vertices - 1;  // plus the sink
  std::vector<bool> has_consumer(n, false);
  for (int i = 0; i < n; ++i) {
    job["stages"].push_back({{"name", "v" + std::to_string(i)},
                             {"program", "checksum"},
                             {"params", {{"i", i}, {"sleep_ms", 2 + static_cast<int>(rng() % 9)}}}});
    int fan_in = i == 0 ? 0 : 1 + static_cast<int>(rng() % 3);
    for (int k = 0; k < fan_in; ++k) {
      int from = static_cast<int>(rng() % i);
      has_consumer[from] = true;
      job["edges"].push_back(
          {{"from", "v" + std::to_string(from)}, {"to", "v" + std::to_string(i)}, {"channel", rng() % 2 ? "memory" : "file"}});
    }
  }
  job["stages"].push_back({{"name", "sink"}, {"program", "checksum"}});
  for (int i = 0; i < n; ++i) {
    if (!has_consumer[i]) job["edges"].push_back({{"from", "v" + std::to_string(i)}, {"to", "sink"}});
  }
  job["outputs"] = {{{"from", "sink"}, {"path", "digest.txt"}}};
  // Faults, from their own stream so the graph does not depend on them.
  std::mt19937 frng(seed * 2654435761u + 1);
  job["faults"] = Json::array();
  if (frng() % 4 != 0) {
    int victim = static_cast<int>(frng() % n);
    int at = 10 + static_cast<int>(frng() % (vertices - 30));
    job["faults"].push_back({{"kill_daemon_of", "v" + std::to_string(victim)}, {"when", {{"completed", at}}}});
  }
  int fails = static_cast<int>(frng() % 4);
  std::vector<int> failed;
  while (static_cast<int>(failed.size()) < fails) {
    int v = static_cast<int>(frng() % n);
    if (std::find(failed.begin(), failed.end(), v) != failed.end()) continue;
    failed.push_back(v);
    Json attempts = frng() % 2 ? Json::array({1, 2}) : Json::array({1});
    job["faults"].push_back({{"fail", "v" + std::to_string(v)}, {"attempts", attempts}});
  }
  return job;
}

/// The digest line the sink of a graph of checksum vertices (no params.bytes) must output,
/// recomputed vertex by vertex in topological order (as tests/integration/cluster_test.cc).
std::string ExpectedSinkDigest(const Json& job) {
  auto load = copse::jm::LoadJobJson(job, "expected", copse::cli::Catalog());
  if (!load.ok()) copse::soak::Die("the generated job does not load");
  const auto& g = *load.graph;
  std::map<uint32_t, std::string> out;
  std::string sink;
  for (copse::VertexId v : g.topological_order()) {
    const auto& node = g.vertex(v);
    copse::vertex::ChecksumHasher h(node.name, *node.params);
    for (copse::ChannelId ch : node.inputs) {
      h.AddMessage(out.at(g.channel(ch).from.value()));
      h.EndPort();
    }
    out[v.value()] = copse::vertex::DigestLine(h.Digest());
    if (node.name == "sink" || node.name == "sink[0]") sink = out[v.value()];
  }
  return sink;
}

struct Outcome {
  bool completed = false;
  bool hung = false;
  bool correct = false;
  double seconds = 0;
  Json status;
  std::string problem;
};

Outcome RunAndCheck(copse::soak::SupervisedCluster& cluster, const Json& job, const std::string& expected, int run,
                    const char* label) {
  Outcome o;
  auto& client = cluster.client();
  auto t0 = Clock::now();
  auto reply = client.Call({{"op", "submit"}, {"job", job}, {"job_dir", cluster.dir().string()}});
  if (!reply.ok()) copse::soak::Die("submit: " + reply.status().ToString());
  uint64_t id = (*reply)["job"].get<uint64_t>();
  auto done = client.Call({{"op", "wait"}, {"job", id}}, std::chrono::minutes(3));
  o.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  if (!done.ok()) {
    // A hang: report it and stop the soak (the connection is out of step now).
    cluster.set_keep(true);
    o.hung = true;
    o.problem = "job " + std::to_string(id) + " did not finish within 3 minutes (" + done.status().ToString() +
                "); job file: " + job.dump();
    return o;
  }
  o.status = (*done)["job"];
  o.completed = o.status["state"] == "completed";
  if (!o.completed) {
    o.problem = "job " + std::to_string(id) + " " + o.status["state"].get<std::string>() + ": " + o.status.value("failure", "");
    return o;
  }
  auto out_dir = cluster.dir() / ("out-" + std::to_string(id));
  auto written = copse::cli::FetchOutputs(client, id, out_dir, cluster.secret());
  if (!written.ok()) {
    o.problem = "fetching the outputs of job " + std::to_string(id) + ": " + written.status().ToString();
    return o;
  }
  std::string got = copse::ReadFile((out_dir / "digest.txt").string()).ValueOr("<missing>");
  std::error_code ec;
  std::filesystem::remove_all(out_dir, ec);
  o.correct = got == expected;
  if (!o.correct)
    o.problem = "job " + std::to_string(id) + " wrote " + got.substr(0, 16) + ", expected " + expected.substr(0, 16);
  return o;
}

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(p * v.size()))];
}

}  // namespace

int Main(int argc, char** argv) {
  int runs = 50, vertices = 200, daemons = 3, cpus = 2;
  uint32_t seed = 1;
  bool keep = false;
  for (int i = 1; i < argc; ++i) {
    auto next = [&] {
      if (i + 1 >= argc) copse::soak::Die(std::string(argv[i]) + " needs a value");
      return argv[++i];
    };
    if (!std::strcmp(argv[i], "--runs"))
      runs = std::atoi(next());
    else if (!std::strcmp(argv[i], "--vertices"))
      vertices = std::atoi(next());
    else if (!std::strcmp(argv[i], "--seed"))
      seed = static_cast<uint32_t>(std::strtoul(next(), nullptr, 10));
    else if (!std::strcmp(argv[i], "--daemons"))
      daemons = std::atoi(next());
    else if (!std::strcmp(argv[i], "--cpus"))
      cpus = std::atoi(next());
    else if (!std::strcmp(argv[i], "--keep"))
      keep = true;
    else
      copse::soak::Die(
          std::string("usage: soak_bench [--runs 50] [--vertices 200] [--seed S] [--daemons 3] [--cpus 2] [--keep]"));
  }
  if (daemons < 2 || vertices < 40 || runs < 1) copse::soak::Die("need --daemons >= 2, --vertices >= 40, --runs >= 1");

  std::vector<copse::soak::DaemonConfig> configs;
  for (int d = 0; d < daemons; ++d) configs.push_back({"d" + std::to_string(d), cpus, {}});
  copse::soak::SupervisedCluster cluster(configs);
  cluster.set_keep(keep);
  std::printf(
      "soak_bench: %d runs of a random %d-vertex checksum DAG, seed %u, job manager + %d supervised daemons "
      "(%d slots each) on 127.0.0.1\n",
      runs, vertices, seed, daemons, cpus);
  std::fflush(stdout);

  auto t_start = Clock::now();
  int correct = 0, faulted_runs = 0;
  std::map<std::string, int> faults_by_kind, recoveries_by_reason, planned_by_kind;
  std::vector<double> extra_s, extra_pct, extra_kill_pct;
  std::vector<std::string> problems;
  for (int r = 0; r < runs; ++r) {
    Json job = RandomDag(vertices, seed + static_cast<uint32_t>(r));
    std::string expected = ExpectedSinkDigest(job);
    for (const auto& f : job["faults"]) planned_by_kind[f.contains("fail") ? "fail" : "kill_daemon_of"]++;
    Json clean = job;
    clean.erase("faults");
    // Every run starts with all daemons back (the supervisor restarts a killed one).
    if (!cluster.WaitForAlive(daemons)) problems.push_back("run " + std::to_string(r) + ": daemons did not come back");
    Outcome base = RunAndCheck(cluster, clean, expected, r, "fault-free");
    if (!cluster.WaitForAlive(daemons)) problems.push_back("run " + std::to_string(r) + ": daemons did not come back");
    Outcome hit = base.hung ? base : RunAndCheck(cluster, job, expected, r, "faulted");
    bool ok = base.correct && hit.correct;
    correct += ok;
    if (!base.problem.empty()) problems.push_back("run " + std::to_string(r) + " fault-free: " + base.problem);
    if (!hit.problem.empty()) problems.push_back("run " + std::to_string(r) + " faulted: " + hit.problem);
    bool killed = false;
    for (const auto& f : hit.status["faults"]) {
      std::string kind = f.value("fault", "?");
      faults_by_kind[kind]++;
      killed = killed || kind.rfind("kill", 0) == 0;
    }
    for (const auto& rec : hit.status["recoveries"]) recoveries_by_reason[rec.value("reason", "?")]++;
    faulted_runs += !hit.status["faults"].empty();
    if (base.completed && hit.completed) {
      extra_s.push_back(hit.seconds - base.seconds);
      extra_pct.push_back(100.0 * (hit.seconds - base.seconds) / base.seconds);
      if (killed) extra_kill_pct.push_back(extra_pct.back());
    }
    std::printf("  run %2d: %s  fault-free %.3f s, faulted %.3f s (%zu faults, %zu recoveries)%s\n", r,
                ok ? "ok       " : "MISMATCH ", base.seconds, hit.seconds, hit.status["faults"].size(),
                hit.status["recoveries"].size(), killed ? ", daemon killed" : "");
    std::fflush(stdout);
    if (hit.hung) {
      runs = r + 1;
      break;
    }
  }
  double wall = std::chrono::duration<double>(Clock::now() - t_start).count();

  std::printf("\nsoak summary (%.1f s wall)\n", wall);
  std::printf("  runs: %d, runs correct (fault-free and faulted output == expected digest): %d\n", runs, correct);
  std::printf("  runs with at least one fault fired: %d\n", faulted_runs);
  std::printf("  faults injected (fired, by kind):");
  for (const auto& [k, n] : faults_by_kind) std::printf(" %s %d", k.c_str(), n);
  std::printf("  [planned:");
  for (const auto& [k, n] : planned_by_kind) std::printf(" %s %d", k.c_str(), n);
  std::printf("]\n  recoveries (by reason):");
  for (const auto& [k, n] : recoveries_by_reason) std::printf(" %s %d", k.c_str(), n);
  std::printf("\n  daemon processes died: %d, restarted by the supervisor: %d\n", cluster.deaths(), cluster.respawns());
  std::printf("  extra time vs the fault-free twin: median %.3f s (%.1f %%), p90 %.3f s (%.1f %%)\n", Percentile(extra_s, 0.5),
              Percentile(extra_pct, 0.5), Percentile(extra_s, 0.9), Percentile(extra_pct, 0.9));
  if (!extra_kill_pct.empty()) {
    std::printf("  runs with a daemon killed (%zu): median extra %.1f %%, p90 %.1f %%\n", extra_kill_pct.size(),
                Percentile(extra_kill_pct, 0.5), Percentile(extra_kill_pct, 0.9));
  }
  for (const auto& p : problems) std::printf("  PROBLEM: %s\n", p.c_str());
  if (!problems.empty() || correct != runs) {
    cluster.set_keep(true);
    return 1;
  }
  return 0;
}

int main(int argc, char** argv) {
  try {
    return Main(argc, argv);
  } catch (const copse::soak::Failure& e) {
    std::fprintf(stderr, "soak_bench: %s\n", e.what());
    return 1;
  }
}
