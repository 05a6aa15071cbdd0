// `copse validate FILE [-o json] [--dot]`: load a job file, print its summary or every error.
#include <iostream>

#include "cli/commands.h"
#include "cli/program_catalog.h"
#include "jobmanager/job_loader.h"

namespace copse::cli {

void AddValidateCommand(CLI::App& app) {
  auto* cmd = app.add_subcommand("validate", "Check a job file; print its summary or every error");
  struct Opts {
    std::string file;
    std::string output = "text";
    bool dot = false;
  };
  auto opts = std::make_shared<Opts>();
  cmd->add_option("FILE", opts->file, "job file (JSON)")->required();
  cmd->add_option("-o,--format", opts->output, "text or json")->check(CLI::IsMember({"text", "json"}));
  cmd->add_flag("--dot", opts->dot, "print the expanded graph in Graphviz DOT instead");
  cmd->callback([opts] {
    jm::JobLoad load = jm::LoadJobFile(opts->file, Catalog());
    if (opts->output == "json") {
      Json out = load.ok() ? load.graph->Summary() : Json::object();
      out["valid"] = load.ok();
      out["file"] = opts->file;
      if (!load.ok()) out["errors"] = load.diags.ToJson();
      std::cout << DumpJson(out, 2) << "\n";  // an error may quote bytes that are not UTF-8
    } else if (!load.ok()) {
      std::cerr << load.status().message() << "\n";
    } else if (opts->dot) {
      std::cout << load.graph->ToDot();
    } else {
      Json s = load.graph->Summary();
      std::cout << opts->file << ": valid job \"" << s["name"].get<std::string>() << "\"\n"
                << "  stages:       " << s["stages"] << "\n"
                << "  vertices:     " << s["vertices"] << "\n"
                << "  channels:     " << s["channels"];
      std::string kinds;
      for (auto& [kind, n] : s["channels_by_kind"].items()) {
        kinds += (kinds.empty() ? "" : ", ") + std::to_string(n.get<size_t>()) + " " + kind;
      }
      if (!kinds.empty()) std::cout << " (" << kinds << ")";
      std::cout << "\n  gangs:        " << s["gangs"] << "\n"
                << "  longest path: " << s["longest_path"] << " vertices\n";
    }
    ExitCode() = load.ok() ? 0 : 1;
  });
}

void AddProgramsCommand(CLI::App& app) {
  auto* cmd = app.add_subcommand("programs", "List the vertex programs this copse can run");
  cmd->callback([] {
    for (const auto& name : Programs().Names()) std::cout << name << "\n";
  });
}

}  // namespace copse::cli
