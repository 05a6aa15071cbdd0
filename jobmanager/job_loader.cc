#include "jobmanager/job_loader.h"

#include "common/wire.h"

namespace copse::jm {

JobLoad LoadJobJson(const Json& doc, std::string source, const ProgramCatalog& catalog) {
  JobLoad load;
  load.source = std::move(source);
  auto spec = std::make_shared<JobSpec>(ParseJobSpec(doc, catalog, load.diags));
  // Cross-reference checks still run after local errors, so one pass reports everything that
  // can be known; the graph is only kept when the whole file is clean.
  size_t parse_errors = load.diags.size();
  auto graph = JobGraph::Build(std::move(spec), load.diags);
  if (parse_errors == 0) load.graph = std::move(graph);
  return load;
}

JobLoad LoadJobText(std::string_view text, std::string source, const ProgramCatalog& catalog) {
  std::vector<std::string> duplicates;
  auto doc = ParseJson(text, source, &duplicates);
  if (!doc.ok()) {
    JobLoad load;
    load.source = std::move(source);
    load.diags.Error("", doc.status().message());
    return load;
  }
  JobLoad load = LoadJobJson(*doc, std::move(source), catalog);
  if (!duplicates.empty()) {
    // Reported with whatever else is wrong: the file's author meant one of the values.
    for (const std::string& pointer : duplicates) {
      load.diags.Error(pointer, "the key appears more than once in its object (JSON keeps only the last)");
    }
    load.graph = nullptr;
  }
  return load;
}

JobLoad LoadJobFile(const std::string& path, const ProgramCatalog& catalog) {
  // A job travels to the job manager as one control message: a bigger file could not be sent.
  auto text = ReadFile(path, wire::kMaxControlBytes);
  if (!text.ok()) {
    JobLoad load;
    load.source = path;
    load.diags.Error("", text.status().message());
    return load;
  }
  return LoadJobText(*text, path, catalog);
}

}  // namespace copse::jm
