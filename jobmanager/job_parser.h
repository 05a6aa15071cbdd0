#pragma once
// Parsing a job document into a JobSpec. Type errors, unknown keys (with a did-you-mean),
// missing keys and malformed names are reported as Diagnostics with their JSON pointers; the
// cross-references (edges naming stages, faults naming vertices, patterns, cycles) are checked
// when the spec is expanded (job_graph.h).
#include <functional>
#include <set>
#include <string>
#include <string_view>

#include "jobmanager/diagnostics.h"
#include "jobmanager/job_spec.h"

namespace copse::jm {

/// The vertex programs a job may name. An empty catalog with `check == false` accepts any.
struct ProgramCatalog {
  std::set<std::string> names;
  bool check = true;
  /// When set: what is wrong with a stage's params for its (known) program, as
  /// InvalidArgument; the job manager, which cannot link the programs, leaves it unset.
  std::function<Status(const std::string& program, const Json& params)> check_params;
  static ProgramCatalog AcceptAny() { return {{}, false, nullptr}; }
};

/// Parses `doc` into a spec; problems go to `diags`. The returned spec is only meaningful when
/// `diags` stayed empty, but holds as much as could be understood either way.
JobSpec ParseJobSpec(const Json& doc, const ProgramCatalog& catalog, Diagnostics& diags);

}  // namespace copse::jm
