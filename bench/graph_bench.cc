// Validating and expanding a generated 100,000-vertex job graph (issue: foundation).
//
//   graph_bench [--vertices N] [--runs R]
//
// The graph: 100 stages of N/100 replicas; stage i feeds stage i+1 pointwise (file) and, every
// 10th stage, gathers into a one-vertex checkpoint stage that broadcasts back (memory), so
// all four patterns and several channel kinds are exercised. Prints the median of R runs of
// parse+validate+expand, measured from JSON text to JobGraph, and the separate phases.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "bench/noop_dag.h"
#include "cli/program_catalog.h"
#include "jobmanager/job_loader.h"

using copse::Json;
using Clock = std::chrono::steady_clock;

namespace {

Json MakeJob(int vertices) {
  const int layers = 100;
  const int width = std::max(1, vertices / layers);
  Json job = {{"version", 1}, {"name", "bench"}, {"stages", Json::array()}, {"edges", Json::array()}};
  for (int l = 0; l < layers; ++l) {
    job["stages"].push_back({{"name", "layer" + std::to_string(l)},
                             {"program", "checksum"},
                             {"replicas", width},
                             {"params", {{"shard", "part-{replica}"}, {"layer", l}}}});
    if (l > 0) {
      job["edges"].push_back({{"from", "layer" + std::to_string(l - 1)}, {"to", "layer" + std::to_string(l)}});
    }
    if (l % 10 == 5 && l + 1 < layers) {
      std::string ck = "ckpt" + std::to_string(l);
      job["stages"].push_back({{"name", ck}, {"program", "checksum"}});
      job["edges"].push_back({{"from", "layer" + std::to_string(l)}, {"to", ck}, {"pattern", "gather"}});
      job["edges"].push_back(
          {{"from", ck}, {"to", "layer" + std::to_string(l + 1)}, {"pattern", "broadcast"}, {"channel", "memory"}});
    }
  }
  return job;
}

double Ms(Clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

/// Times text -> JobGraph `runs` times and prints the medians.
int Measure(const char* label, const std::string& text, int runs) {
  auto catalog = copse::cli::Catalog();
  std::vector<double> total, parse, expand;
  size_t n_vertices = 0, n_channels = 0;
  for (int r = 0; r < runs; ++r) {
    auto t0 = Clock::now();
    auto doc = copse::ParseJson(text, "bench");
    auto t1 = Clock::now();
    auto load = copse::jm::LoadJobJson(*doc, "bench", catalog);
    auto t2 = Clock::now();
    if (!load.ok()) {
      std::fprintf(stderr, "%s\n", load.status().ToString().c_str());
      return 1;
    }
    n_vertices = load.graph->vertices().size();
    n_channels = load.graph->channels().size();
    parse.push_back(Ms(t1 - t0));
    expand.push_back(Ms(t2 - t1));
    total.push_back(Ms(t2 - t0));
  }
  std::printf("%s: %zu vertices, %zu channels, %zu bytes of JSON, %d runs\n", label, n_vertices, n_channels, text.size(), runs);
  std::printf("  parse JSON                 median %8.1f ms\n", Median(parse));
  std::printf("  validate + expand          median %8.1f ms\n", Median(expand));
  std::printf("  total (target < 1000 ms)   median %8.1f ms  (%.0f vertices/s)\n", Median(total),
              n_vertices / (Median(total) / 1000.0));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  int vertices = 100000, runs = 7;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--vertices")) vertices = std::atoi(argv[i + 1]);
    if (!std::strcmp(argv[i], "--runs")) runs = std::atoi(argv[i + 1]);
  }
  int rc = Measure("stage edges (all four patterns)", MakeJob(vertices).dump(), runs);
  rc |= Measure("vertex-level edges (2 inputs per vertex)", copse::bench::NoopDag(100, std::max(2, vertices / 100)).dump(), runs);
  return rc;
}
