// Locality and recovery figures (issue 5).
//
//   recovery_bench [--reps R] [--kills K] [--skip locality,replace,fanin,run]
//
// Starts `copse jm` and `copse daemon` processes on 127.0.0.1 (tests/soak/supervised_cluster.h)
// and prints:
//  a. locality: 16 producers (`checksum`, 4 MiB each, `input_hosts` naming each daemon's `host`
//     label four times, shuffled) each feeding one consumer (a fixed random permutation; all
//     consumers start once every producer completed) on 4 daemons of 4 slots, under
//     `--placement locality` and `--placement load` (a cluster each): input bytes read locally
//     and remotely (job status `input_bytes`), % local, bytes moved between daemons, and how
//     many producers ran on their input host (medians of R runs);
//  b. kill -> re-place: 8 vertices sleeping 5 s on 2 daemons of 8 slots; the bench SIGKILLs
//     the daemon d1 by its pid and polls the job's event log until every vertex that ran there
//     is "placed on" another daemon; median and p90 over K kills;
//  c. a 2,001-vertex fan-in tree (1,800 leaves -> 180 -> 18 -> 2 -> root, each gathering 10 or
//     9) of 5 ms `checksum` vertices on 2 daemons of 2 slots: fault-free time and the time with
//     one daemon SIGKILLed at 1,000 completions (`kill_daemon_of` a leaf), both when the killed
//     daemon stays dead and when a supervisor restarts it (medians of R runs each).
//  d. the same fan-in tree and kill through `copse run --daemons 2 --cpus 2 -o json` (the
//     embedded cluster, which restarts a killed daemon itself), against `--no-restart-daemons`:
//     the job's elapsed_s fault-free and with the kill, runs interleaved, medians of R.
#include <sys/wait.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <set>

#include "tests/soak/supervised_cluster.h"

using copse::Json;
using copse::soak::Clock;
using copse::soak::DaemonConfig;
using copse::soak::SupervisedCluster;

namespace {

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(p * v.size()))];
}
double Median(std::vector<double> v) { return Percentile(std::move(v), 0.5); }

uint64_t Submit(SupervisedCluster& cluster, const Json& job) {
  auto reply = cluster.client().Call({{"op", "submit"}, {"job", job}, {"job_dir", cluster.dir().string()}});
  if (!reply.ok()) copse::soak::Die("submit: " + reply.status().ToString());
  return (*reply)["job"].get<uint64_t>();
}

/// Submit and wait; the final status with "seconds" (submit -> finished) added.
Json RunJob(SupervisedCluster& cluster, const Json& job) {
  auto t0 = Clock::now();
  uint64_t id = Submit(cluster, job);
  auto done = cluster.client().Call({{"op", "wait"}, {"job", id}}, std::chrono::minutes(5));
  if (!done.ok()) copse::soak::Die("job " + std::to_string(id) + " did not finish: " + done.status().ToString());
  Json st = (*done)["job"];
  st["seconds"] = std::chrono::duration<double>(Clock::now() - t0).count();
  st["id"] = id;
  return st;
}

std::vector<std::string> LogLines(SupervisedCluster& cluster, uint64_t id) {
  auto reply = cluster.client().Call({{"op", "logs"}, {"job", id}});
  if (!reply.ok()) copse::soak::Die("logs: " + reply.status().ToString());
  std::vector<std::string> out;
  for (const auto& l : (*reply)["lines"]) out.push_back(l.get<std::string>());
  return out;
}

std::string Mib(double bytes) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.1f MiB", bytes / (1024.0 * 1024.0));
  return buf;
}

// ---- a. locality ------------------------------------------------------------------------------

void Locality(int reps) {
  const int daemons = 4, width = 16;
  const int64_t bytes = 4 << 20;
  // Producer i reads from host hosts[i]: each of h0..h3 four times, in a fixed random order (not
  // i mod 4, which a load-only policy filling idle daemons round-robin would match by chance).
  std::vector<int> host_of(width);
  for (int i = 0; i < width; ++i) host_of[i] = i % daemons;
  std::shuffle(host_of.begin(), host_of.end(), std::mt19937(11));
  Json hosts = Json::array();
  for (int i = 0; i < width; ++i) hosts.push_back("h" + std::to_string(host_of[i]));
  Json job = {{"name", "locality"},
              {"stages",
               {{{"name", "p"},
                 {"program", "checksum"},
                 {"replicas", width},
                 {"input_hosts", hosts},
                 {"params", {{"bytes", bytes}, {"sleep_ms", 20}}}},
                {{"name", "c"}, {"program", "checksum"}, {"replicas", width}, {"params", {{"sleep_ms", 20}}}}}},
              // The order edges hold every consumer back until all producers completed, so all 16
              // become ready at once on idle daemons: a locality-blind policy then spreads them
              // by load alone (without them, the consumer of p[i] would simply take the slot p[i]
              // just freed, and either policy would look local).
              {"edges", {{{"from", "p"}, {"to", "c"}, {"pattern", "all_to_all"}, {"channel", "order"}}}}};
  // p[i] feeds c[perm[i]] (a fixed random permutation, vertex-level edges after the order edges
  // so they take input port 0): with the identity, a load-only policy that fills idle daemons
  // in vertex order would put c[i] where p[i] ran by coincidence and look local.
  std::vector<int> perm(width);
  for (int i = 0; i < width; ++i) perm[i] = i;
  std::shuffle(perm.begin(), perm.end(), std::mt19937(5));
  for (int i = 0; i < width; ++i) {
    job["edges"].push_back(
        {{"from", "p[" + std::to_string(i) + "]"}, {"to", "c[" + std::to_string(perm[i]) + "]"}, {"channel", "memory"}});
  }
  std::printf(
      "a. locality: %d producers (checksum, 4 MiB each, input_hosts: each of h0..h3 four times) -> %d pointwise consumers, "
      "%d daemons (host=h0..h3) x 4 slots, medians of %d runs\n",
      width, width, daemons, reps);
  std::printf("   %-9s %12s %12s %9s %26s %22s %9s\n", "placement", "local", "remote", "% local", "bytes moved between daemons",
              "producers on own host", "time");
  for (const char* policy : {"locality", "load"}) {
    std::vector<DaemonConfig> configs;
    for (int d = 0; d < daemons; ++d) configs.push_back({"d" + std::to_string(d), 4, {"host=h" + std::to_string(d)}});
    SupervisedCluster cluster(configs, {"--placement", policy}, false);
    std::vector<double> local, remote, pct, on_host, secs;
    for (int r = 0; r < reps; ++r) {
      Json st = RunJob(cluster, job);
      if (st["state"] != "completed") copse::soak::Die("locality job failed: " + st.dump());
      double l = st["input_bytes"]["local"].get<double>(), m = st["input_bytes"]["remote"].get<double>();
      local.push_back(l);
      remote.push_back(m);
      pct.push_back(l + m > 0 ? 100.0 * l / (l + m) : 0);
      secs.push_back(st["seconds"].get<double>());
      // "   0.012s p[5] version 1 placed on d1": producer i's input host h(host_of[i]) is daemon d(host_of[i]).
      int hits = 0;
      for (const auto& line : LogLines(cluster, st["id"].get<uint64_t>())) {
        auto at = line.find(" p[");
        auto on = line.find(" placed on d");
        if (at == std::string::npos || on == std::string::npos) continue;
        int replica = std::atoi(line.c_str() + at + 3);
        int daemon = std::atoi(line.c_str() + on + 12);
        hits += replica >= 0 && replica < width && host_of[replica] == daemon;
      }
      on_host.push_back(hits);
    }
    char onh[32];
    std::snprintf(onh, sizeof(onh), "%.0f / %d", Median(on_host), width);
    std::printf("   %-9s %12s %12s %8.1f%% %26s %22s %7.3f s\n", policy, Mib(Median(local)).c_str(), Mib(Median(remote)).c_str(),
                Median(pct), Mib(Median(remote)).c_str(), onh, Median(secs));
    std::fflush(stdout);
  }
}

// ---- b. kill -> re-place latency ----------------------------------------------------------------

void KillToReplace(int kills) {
  std::vector<DaemonConfig> configs = {{"d0", 8, {}}, {"d1", 8, {}}};
  SupervisedCluster cluster(configs, {}, false);
  Json job = {{"name", "long"},
              {"stages", {{{"name", "s"}, {"program", "checksum"}, {"replicas", 8}, {"params", {{"sleep_ms", 5000}}}}}}};
  std::vector<double> ms;
  std::vector<double> detect_ms;
  for (int k = 0; k < kills; ++k) {
    if (!cluster.WaitForAlive(2)) copse::soak::Die("d1 did not come back");
    uint64_t id = Submit(cluster, job);
    // Wait until all 8 run, and note which vertices are on d1.
    std::set<std::string> on_d1;
    size_t placed_before = 0;
    auto deadline = Clock::now() + std::chrono::seconds(10);
    while (true) {
      auto lines = LogLines(cluster, id);
      on_d1.clear();
      placed_before = 0;
      for (const auto& l : lines) {
        auto on = l.find(" placed on ");
        if (on == std::string::npos) continue;
        ++placed_before;
        if (l.compare(on + 11, 2, "d1") == 0)
          on_d1.insert(l.substr(l.find(" s[") + 1, l.find(']', l.find(" s[")) - l.find(" s[")));
      }
      if (placed_before >= 8) break;
      if (Clock::now() > deadline) copse::soak::Die("the 8 vertices were not all placed");
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(200));  // they are running now
    if (on_d1.empty()) copse::soak::Die("nothing was placed on d1");
    auto t_kill = Clock::now();
    cluster.KillDaemon("d1");
    // Poll the event log until every vertex that was on d1 has a new "placed on d0".
    bool lost_seen = false;
    while (true) {
      auto lines = LogLines(cluster, id);
      auto now = Clock::now();
      std::set<std::string> replaced;
      for (size_t i = placed_before; i < lines.size(); ++i) {
        const auto& l = lines[i];
        if (!lost_seen && (l.find("lost") != std::string::npos || l.find("daemon_lost") != std::string::npos)) {
          lost_seen = true;
          detect_ms.push_back(std::chrono::duration<double, std::milli>(now - t_kill).count());
        }
        auto on = l.find(" placed on ");
        if (on == std::string::npos) continue;
        auto s = l.find(" s[");
        replaced.insert(l.substr(s + 1, l.find(']', s) - s));
      }
      bool all = std::all_of(on_d1.begin(), on_d1.end(), [&](const std::string& v) { return replaced.count(v); });
      if (all) {
        ms.push_back(std::chrono::duration<double, std::milli>(now - t_kill).count());
        break;
      }
      if (now - t_kill > std::chrono::seconds(10))
        copse::soak::Die("vertices of the killed daemon were not re-placed within 10 s");
    }
    (void)cluster.client().Call({{"op", "cancel"}, {"job", id}});
    (void)cluster.client().Call({{"op", "wait"}, {"job", id}}, std::chrono::seconds(30));
    cluster.RestartDaemon("d1");
  }
  std::printf(
      "b. SIGKILL of a daemon running 4 of 8 five-second vertices (2 daemons x 8 slots) -> all its vertices placed "
      "again on the other daemon, over %d kills (poll of the event log, ~0.2 ms resolution):\n",
      kills);
  std::printf("   median %.2f ms, p90 %.2f ms, max %.2f ms", Median(ms), Percentile(ms, 0.9), Percentile(ms, 1.0));
  if (!detect_ms.empty()) std::printf("  (loss visible in the log: median %.2f ms)", Median(detect_ms));
  std::printf("\n");
  std::fflush(stdout);
}

// ---- c. 2,001-vertex fan-in tree ------------------------------------------------------------------

Json FanInTree() {
  Json job = {{"name", "fan-in"}, {"stages", Json::array()}, {"edges", Json::array()}};
  const std::vector<int> levels = {1800, 180, 18, 2, 1};
  for (size_t l = 0; l < levels.size(); ++l) {
    std::string name = l == 0 ? "leaf" : "g" + std::to_string(l);
    job["stages"].push_back({{"name", name}, {"program", "checksum"}, {"replicas", levels[l]}, {"params", {{"sleep_ms", 5}}}});
    if (l == 0) continue;
    std::string prev = l == 1 ? "leaf" : "g" + std::to_string(l - 1);
    int per = levels[l - 1] / levels[l];
    for (int i = 0; i < levels[l - 1]; ++i) {
      job["edges"].push_back({{"from", prev + "[" + std::to_string(i) + "]"},
                              {"to", name + "[" + std::to_string(std::min(i / per, levels[l] - 1)) + "]"}});
    }
  }
  job["outputs"] = {{{"from", "g4"}, {"path", "digest.txt"}}};
  return job;
}

void FanIn(int reps) {
  Json clean = FanInTree();
  Json faulted = clean;
  faulted["faults"] = {{{"kill_daemon_of", "leaf[0]"}, {"when", {{"completed", 1000}}}}};
  std::printf(
      "c. fan-in tree of 2,001 checksum vertices of 5 ms (1,800 leaves -> 180 -> 18 -> 2 -> 1), 2 daemons x 2 slots, "
      "one daemon SIGKILLed at 1,000 completions (kill_daemon_of leaf[0]); medians of %d runs\n",
      reps);
  for (bool restart : {false, true}) {
    std::vector<DaemonConfig> configs = {{"d0", 2, {}}, {"d1", 2, {}}};
    SupervisedCluster cluster(configs, {}, restart);
    RunJob(cluster, clean);  // warm-up
    std::vector<double> base, hit;
    size_t recoveries = 0, regenerated = 0;
    for (int r = 0; r < reps; ++r) {
      if (!cluster.WaitForAlive(2)) copse::soak::Die("daemons did not come back");
      Json a = RunJob(cluster, clean);
      if (a["state"] != "completed") copse::soak::Die("fault-free fan-in failed: " + a.dump());
      base.push_back(a["seconds"].get<double>());
      Json b = RunJob(cluster, faulted);
      if (b["state"] != "completed") copse::soak::Die("faulted fan-in failed: " + b.value("failure", b.dump()));
      hit.push_back(b["seconds"].get<double>());
      recoveries += b["recoveries"].size();
      for (const auto& rec : b["recoveries"]) regenerated += rec.value("reason", "") == "output_lost";
      if (!restart) {
        // The killed daemon stays dead for the rest of the job; bring it back for the next run.
        std::string victim = b["faults"].empty() ? "" : b["faults"][0].value("daemon", "");
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
        cluster.RestartDaemon(victim);
      }
    }
    double mb = Median(base), mh = Median(hit);
    std::printf(
        "   %-44s fault-free %.3f s, with the kill %.3f s: extra %.3f s = %+.1f %%  (recoveries per run %.0f, of which "
        "output_lost %.0f)\n",
        restart ? "killed daemon restarted by a supervisor:" : "killed daemon stays dead (1 daemon left):", mb, mh, mh - mb,
        100.0 * (mh - mb) / mb, static_cast<double>(recoveries) / reps, static_cast<double>(regenerated) / reps);
    std::fflush(stdout);
  }
  std::printf("   (Dask distributed loses 42 %% in this scenario)\n");
}

// ---- d. the fan-in kill through `copse run` ----------------------------------------------------

/// Runs `copse run FILE -o json` plus `extra` and returns its summary.
Json CopseRun(const std::string& file, const std::vector<std::string>& extra, const std::string& dir) {
  std::vector<std::string> args = {"run", file, "--daemons", "2", "--cpus", "2", "-o", "json", "--output", dir + "/out"};
  args.insert(args.end(), extra.begin(), extra.end());
  const std::string out = dir + "/run.json";
  std::filesystem::remove(out);
  std::string command = std::string(COPSE_BINARY_DIR) + "/cli/copse";
  for (const auto& a : args) command += " '" + a + "'";
  command += " > '" + out + "' 2>> '" + dir + "/run.log'";
  const int rc = std::system(command.c_str());
  auto text = copse::ReadFile(out);
  if (rc != 0 || !text.ok()) copse::soak::Die("copse run failed (" + std::to_string(rc) + "); see " + dir + "/run.log");
  return Json::parse(*text);
}

void FanInThroughRun(int reps) {
  char tmpl[] = "/tmp/copse-recovery-run-XXXXXX";
  if (!mkdtemp(tmpl)) copse::soak::Die("mkdtemp");
  const std::string dir = tmpl;
  Json clean = FanInTree();
  Json faulted = clean;
  faulted["faults"] = {{{"kill_daemon_of", "leaf[0]"}, {"when", {{"completed", 1000}}}}};
  std::ofstream(dir + "/clean.json") << clean.dump();
  std::ofstream(dir + "/faulted.json") << faulted.dump();
  std::printf(
      "d. the fan-in tree and kill of c. through `copse run --daemons 2 --cpus 2` (its own supervision), interleaved, "
      "medians of %d runs (job elapsed_s)\n",
      reps);
  std::fflush(stdout);
  struct Mode {
    const char* name;
    std::vector<std::string> flags;
    std::vector<double> base, hit;
    double recoveries = 0, restarts = 0;
  };
  std::vector<Mode> modes(2);
  modes[0].name = "copse run (restarts the killed daemon):";
  modes[1].name = "copse run --no-restart-daemons:";
  modes[1].flags = {"--no-restart-daemons"};
  CopseRun(dir + "/clean.json", {}, dir);  // warm-up: page cache, binary
  for (int r = 0; r < reps; ++r) {
    for (auto& m : modes) {
      Json a = CopseRun(dir + "/clean.json", m.flags, dir);
      Json b = CopseRun(dir + "/faulted.json", m.flags, dir);
      if (a["state"] != "completed" || b["state"] != "completed") copse::soak::Die("a fan-in run failed; see " + dir);
      m.base.push_back(a["elapsed_s"].get<double>());
      m.hit.push_back(b["elapsed_s"].get<double>());
      m.recoveries += b["recoveries"].size();
      m.restarts += b.value("daemon_restarts", 0);
    }
  }
  for (const auto& m : modes) {
    const double mb = Median(m.base), mh = Median(m.hit);
    std::printf(
        "   %-44s fault-free %.3f s, with the kill %.3f s: extra %.3f s = %+.1f %%  (recoveries per run %.0f, daemon "
        "restarts per run %.1f)\n",
        m.name, mb, mh, mh - mb, 100.0 * (mh - mb) / mb, m.recoveries / reps, m.restarts / reps);
  }
  std::fflush(stdout);
  std::filesystem::remove_all(dir);
}

}  // namespace

int main(int argc, char** argv) {
  int reps = 3, kills = 10;
  std::string skip;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--reps"))
      reps = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--kills"))
      kills = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--skip"))
      skip = argv[i + 1];
  }
  std::printf("recovery_bench: copse jm + daemons on 127.0.0.1\n");
  try {
    if (skip.find("locality") == std::string::npos) Locality(reps);
    if (skip.find("replace") == std::string::npos) KillToReplace(kills);
    if (skip.find("fanin") == std::string::npos) FanIn(reps);
    if (skip.find("run") == std::string::npos) FanInThroughRun(reps);
  } catch (const copse::soak::Failure& e) {
    std::fprintf(stderr, "recovery_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
