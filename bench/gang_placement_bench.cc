// What placing one gang costs the job manager's thread (`PlaceGang`, called on a scheduling
// pass while a gang is ready and capacity has freed since its last try): microseconds per call,
// median of 7 runs of many calls, for gangs that fit at once or only after backtracking, and
// ones that cannot fit (settled, or given up on at the search's budget), on clusters of 16 to
// 1,024 daemons; and the locality policy's one choice, which every placement makes.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "cli/program_catalog.h"
#include "jobmanager/gang_placement.h"
#include "jobmanager/job_loader.h"

namespace jm = copse::jm;
using copse::DaemonId;

namespace {

double MedianMicros(const std::function<void()>& call, int calls) {
  std::vector<double> runs;
  for (int run = 0; run < 7; ++run) {
    auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < calls; ++i) call();
    runs.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / calls);
  }
  std::sort(runs.begin(), runs.end());
  return runs[runs.size() / 2];
}

jm::GangMember Member(int i, double cpus, int gpus) { return {"m" + std::to_string(i), {cpus, gpus, 0}, "", {}}; }

}  // namespace

int main() {
  auto load = jm::LoadJobText(R"({"stages": [{"name": "a", "program": "noop"}]})", "bench", copse::cli::Catalog());
  if (!load.ok()) return 1;
  jm::GangNeeds needs(*load.graph);
  jm::LocalityPolicy policy(std::chrono::seconds(3));
  std::printf("%-62s %8s %12s\n", "case", "daemons", "us per call");
  for (int n : {16, 128, 1024}) {
    auto gpu_daemons = [&](double free_cpus) {
      std::vector<jm::GangDaemon> out;
      for (int i = 0; i < n; ++i) {
        std::string_view host = i % 2 ? "host-a" : "host-b";
        out.push_back({DaemonId(static_cast<uint32_t>(i)), host, "rack", free_cpus, 1, 8, 1});
      }
      return out;
    };
    auto row = [&](const char* what, const jm::GangRequest& r, const std::vector<jm::GangDaemon>& ds, int calls) {
      auto p = jm::PlaceGang(r, ds, needs, policy);
      double us = MedianMicros([&] { (void)jm::PlaceGang(r, ds, needs, policy); }, calls);
      std::string label = std::string(what) + (p.placed()                                     ? " (placed)"
                                               : p.why_not.find("steps") != std::string::npos ? " (gave up)"
                                                                                              : " (settled)");
      std::printf("%-62s %8d %12.1f\n", label.c_str(), n, us);
    };
    const int many = n > 200 ? 3 : 20;
    {  // what a single vertex's placement asks of the policy, its input on two daemons
      auto ds = gpu_daemons(8);
      std::vector<jm::PlacementDaemon> view;
      for (const auto& d : ds) view.push_back({d.id, d.host, d.rack, d.free_cpus, true});
      jm::PlacementRequest r;
      r.input_bytes = {{DaemonId(0), 100}, {DaemonId(1), 50}};
      double us = MedianMicros([&] { (void)policy.Choose(r, view); }, 2000);
      std::printf("%-62s %8d %12.1f\n", "locality policy: one vertex's choice", n, us);
    }
    jm::GangRequest ranks;  // an 8-rank NCCL gang: one GPU each
    for (int i = 0; i < 8; ++i) ranks.members.push_back(Member(i, 1, 1));
    row("8 one-GPU members, fits at once", ranks, gpu_daemons(8), 2000);
    {  // only two daemons have GPUs free, and the greedy order picks the wrong one first
      auto ds = gpu_daemons(8);
      for (auto& d : ds) d.free_gpus = 0;
      ds[0].free_cpus = 4, ds[0].free_gpus = 2, ds[0].gpus = 2;
      ds[1].free_cpus = 1, ds[1].free_gpus = 2, ds[1].gpus = 2;
      jm::GangRequest swap;
      swap.members = {Member(0, 3, 1), Member(1, 1, 2)};
      row("2 members that fit only after backtracking", swap, ds, 2000);
    }
    jm::GangRequest too_many;  // one GPU more than the cluster has
    for (int i = 0; i <= n; ++i) too_many.members.push_back(Member(i, 0.5, 1));
    row("one GPU more than the cluster has free", too_many, gpu_daemons(1), many);
    {  // in all they fit, but a cpu-only member fits beside no GPU member
      auto ds = gpu_daemons(1);
      ds.push_back({DaemonId(static_cast<uint32_t>(n)), "", "", 0.5, 0, 0.5, 0});
      jm::GangRequest shape;
      for (int i = 0; i < n; ++i) shape.members.push_back(Member(i, 0.6, 1));
      shape.members.push_back(Member(n, 1, 0));
      row("no packing, alike daemons", shape, ds, many);
      for (int i = 0; i < n; i += 2) ds[i].free_cpus = 1.5;  // two kinds: the tree grows as 2^depth
      row("no packing, two kinds of daemon", shape, ds, many);
    }
  }
  return 0;
}
