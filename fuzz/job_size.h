#pragma once
// The harnesses that load jobs (job files, journals) leave out jobs of more than kMaxReplicas
// replicas a stage. Jobs of millions of vertices are valid and load in seconds; left in, they
// would make single runs slow and large enough for libFuzzer to report them as timeouts or
// out-of-memory, while every other key is still fuzzed at its full range.
#include <cstdint>

#include "common/json_util.h"

namespace copse::fuzz {

inline constexpr double kMaxReplicas = 200;

/// Whether any "replicas" member anywhere in `doc` asks for more than kMaxReplicas.
inline bool TooLargeToFuzz(const Json& doc) {
  if (doc.is_object()) {
    for (const auto& [key, value] : doc.items()) {
      if (key == "replicas" && value.is_number() && value.get<double>() > kMaxReplicas) return true;
      if (TooLargeToFuzz(value)) return true;
    }
  } else if (doc.is_array()) {
    for (const auto& value : doc) {
      if (TooLargeToFuzz(value)) return true;
    }
  }
  return false;
}

}  // namespace copse::fuzz
