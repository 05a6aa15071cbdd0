// `copse`: the command users run. The client verbs (submit, status, cancel, daemons, logs, jobs,
// trace, chaos) run here, in a binary that links neither the ML programs nor CUDA, so a
// client stays small (a few MB resident, where the full binary maps the CUDA libraries at
// start: 236 MB for `copse --help`), and hundreds can run at once beside a busy job manager.
// Every other verb — the servers, `run`, `train`, `graph`, `validate`, `programs` — is handed
// to `copse-node` beside this binary by exec, with the same arguments and process id.
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <string>

#include "cli/app_main.h"
#include "cli/commands.h"

namespace {

struct NodeVerb {
  const char* name;
  const char* help;
};

/// The verbs copse-node runs, with the help `copse --help` shows for them.
constexpr std::array<NodeVerb, 8> kNodeVerbs = {{
    {"validate", "Check a job file; print its summary or every error"},
    {"programs", "List the vertex programs this copse can run"},
    {"jm", "Run a job manager"},
    {"daemon", "Run a daemon that executes vertices"},
    {"run", "Run a job on an embedded local cluster (a job manager and N daemons)"},
    {"train", "Train a model in this process (the single-process reference): images, or gpt on text"},
    {"graph", "Write a training job file (data-parallel, pipeline, hybrid) to stdout"},
    {"plan", "Profile a model on the daemons and write the fastest data-parallel or pipeline layout as a job file"},
}};

bool IsNodeVerb(std::string_view verb) {
  for (const auto& v : kNodeVerbs) {
    if (verb == v.name) return true;
  }
  return false;
}

/// Replaces this process with copse-node, found beside this binary; returns only on failure.
int ExecNode(char** argv) {
  std::error_code ec;
  const auto self = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (ec) {
    std::cerr << "copse: cannot find this binary (/proc/self/exe): " << ec.message() << "\n";
    return 1;
  }
  const std::string node = (self.parent_path() / "copse-node").string();
  ::execv(node.c_str(), argv);
  std::cerr << "copse: cannot run " << node << ", which runs this command: " << std::strerror(errno) << "\n";
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  copse::cli::DieWithParentIfAsked();
  if (IsNodeVerb(copse::cli::VerbOf(argc, argv))) return ExecNode(argv);
  CLI::App app{"copse: a Dryad-style DAG job scheduler for ML workloads"};
  copse::cli::AddClientCommands(app);
  for (const auto& v : kNodeVerbs) {
    app.add_subcommand(v.name, v.help)->allow_extras();  // listed by --help; never parsed here
  }
  return copse::cli::RunApp(app, argc, argv);
}
