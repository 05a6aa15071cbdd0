#pragma once
// The job-manager benchmarks' graph: `layers` stages of `width` noop vertices, each fed by two
// vertices of the previous layer (i and i+1 mod width) through vertex-level edges. Issue 3's
// throughput figure uses 100 x 100.
#include <string>

#include "common/json_util.h"

namespace copse::bench {

inline Json NoopDag(int layers, int width) {
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

}  // namespace copse::bench
