#pragma once
// Helpers for job-graph tests: load inline JSON with a fixed program catalog.
#include <string>

#include <doctest/doctest.h>

#include "jobmanager/job_loader.h"

namespace copse::jm::testing {

inline ProgramCatalog TestCatalog() {
  return ProgramCatalog{{"noop", "checksum", "text.read_lines", "text.count_words", "text.merge_counts", "exec"}, true, nullptr};
}

inline JobLoad Load(const std::string& text) { return LoadJobText(text, "test.json", TestCatalog()); }

/// Loads `text`, which must be valid.
inline std::shared_ptr<const JobGraph> MustLoad(const std::string& text) {
  JobLoad load = Load(text);
  INFO(load.status().ToString());
  REQUIRE(load.ok());
  return load.graph;
}

/// True when some diagnostic has exactly `pointer` and a message containing `fragment`.
inline bool HasError(const JobLoad& load, const std::string& pointer, const std::string& fragment) {
  for (const auto& d : load.diags.items()) {
    if (d.pointer == pointer && d.message.find(fragment) != std::string::npos) return true;
  }
  return false;
}

#define CHECK_ERROR(load, pointer, fragment)                              \
  do {                                                                    \
    INFO("diagnostics: " << (load).status().ToString());                  \
    CHECK(::copse::jm::testing::HasError((load), (pointer), (fragment))); \
  } while (false)

}  // namespace copse::jm::testing
