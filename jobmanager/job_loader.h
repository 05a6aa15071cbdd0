#pragma once
// Loading a job: text -> JSON -> JobSpec -> JobGraph, collecting every diagnostic on the way.
// This is what `copse validate`, `copse submit` and the job manager's submit handler call.
#include <memory>
#include <string>
#include <string_view>

#include "jobmanager/diagnostics.h"
#include "jobmanager/job_graph.h"
#include "jobmanager/job_parser.h"

namespace copse::jm {

struct JobLoad {
  std::string source;                     // file name or "<submitted>"
  std::shared_ptr<const JobGraph> graph;  // null when diags is not empty
  Diagnostics diags;

  bool ok() const { return graph != nullptr; }
  /// InvalidArgument listing every diagnostic, or OK.
  Status status() const { return diags.ToStatus(source); }
};

JobLoad LoadJobJson(const Json& doc, std::string source, const ProgramCatalog& catalog);
JobLoad LoadJobText(std::string_view text, std::string source, const ProgramCatalog& catalog);
JobLoad LoadJobFile(const std::string& path, const ProgramCatalog& catalog);

}  // namespace copse::jm
