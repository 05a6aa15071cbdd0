// The `copse` command: one binary for the job manager, the daemons and every client verb.
#include <sys/prctl.h>

#include <algorithm>
#include <csignal>
#include <cstdlib>
#include <iostream>
#include <new>
#include <string_view>

#include "cli/commands.h"
#include "cli/graph_command.h"
#include "cli/train_command.h"
#include "common/logging.h"

namespace copse::cli {
int& ExitCode() {
  static int code = 0;
  return code;
}
}  // namespace copse::cli

int main(int argc, char** argv) {
  // Tests and benchmarks that start copse processes set this, so a crashed test never leaves
  // a job manager or daemon behind (the same guarantee `copse run` gives its children).
  if (std::getenv("COPSE_DIE_WITH_PARENT")) prctl(PR_SET_PDEATHSIG, SIGKILL);
  CLI::App app{"copse: a Dryad-style DAG job scheduler for ML workloads"};
  app.require_subcommand(1);
  std::string log_level;
  app.add_option("--log-level", log_level, "trace, debug, info, warn, error, off (default: $COPSE_LOG or warn)");
  app.parse_complete_callback([&] {
    if (!log_level.empty() && !copse::SetLogLevel(log_level)) {
      throw CLI::ValidationError("--log-level", "unknown level \"" + log_level + "\"");
    }
  });
  copse::cli::AddValidateCommand(app);
  copse::cli::AddProgramsCommand(app);
  copse::cli::AddJmCommand(app);
  copse::cli::AddDaemonCommand(app);
  copse::cli::AddClientCommands(app);
  copse::cli::AddRunCommand(app);
  copse::cli::AddTrainCommand(app);
  copse::cli::AddGraphCommand(app);
  // An unknown verb is named here (CLI11 would say only that a subcommand is required): the
  // first word that is not a global option (--log-level takes a value) is the verb.
  int first = 1;
  while (first < argc && std::string_view(argv[first]).rfind("--log-level", 0) == 0) {
    first += std::string_view(argv[first]) == "--log-level" ? 2 : 1;
  }
  const auto verbs = app.get_subcommands([](CLI::App*) { return true; });
  if (first < argc && argv[first][0] != '-' &&
      std::none_of(verbs.begin(), verbs.end(), [&](CLI::App* verb) { return verb->check_name(argv[first]); })) {
    std::cerr << "copse: unknown command \"" << argv[first] << "\" (copse --help lists them)\n";
    return 2;
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    int rc = app.exit(e);
    return rc == 0 ? 0 : 2;  // usage errors exit 2 (INTERFACE.md)
  } catch (const std::bad_alloc&) {
    // A job file within every limit may still need more memory than this machine has.
    std::cerr << "copse: out of memory\n";
    return 1;
  }
  return copse::cli::ExitCode();
}
