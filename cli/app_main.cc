#include "cli/app_main.h"

#include <sys/prctl.h>

#include <algorithm>
#include <csignal>
#include <cstdlib>
#include <functional>
#include <iostream>
#include <new>
#include <string>

#include "cli/commands.h"
#include "common/logging.h"

namespace copse::cli {

int& ExitCode() {
  static int code = 0;
  return code;
}

void DieWithParentIfAsked() {
  if (std::getenv("COPSE_DIE_WITH_PARENT")) prctl(PR_SET_PDEATHSIG, SIGKILL);
}

std::string_view VerbOf(int argc, char** argv) {
  int first = 1;
  while (first < argc && std::string_view(argv[first]).rfind("--log-level", 0) == 0) {
    first += std::string_view(argv[first]) == "--log-level" ? 2 : 1;
  }
  if (first >= argc || argv[first][0] == '-') return {};
  return argv[first];
}

int RunApp(CLI::App& app, int argc, char** argv) {
  app.require_subcommand(1);
  app.set_version_flag("--version", std::string("copse ") + COPSE_VERSION);
  std::string log_level;
  app.add_option("--log-level", log_level, "trace, debug, info, warn, error, off (default: $COPSE_LOG or warn)");
  // Global options may follow the verb too (`copse jm --log-level info`).
  std::function<void(CLI::App&)> fall_through = [&](CLI::App& parent) {
    for (CLI::App* verb : parent.get_subcommands([](CLI::App*) { return true; })) {
      verb->fallthrough();
      fall_through(*verb);  // `copse chaos kill d0 --log-level info`
    }
  };
  fall_through(app);
  app.parse_complete_callback([&] {
    if (!log_level.empty() && !copse::SetLogLevel(log_level)) {
      throw CLI::ValidationError("--log-level", "unknown level \"" + log_level + "\"");
    }
  });
  // An unknown verb is named here (CLI11 would say only that a subcommand is required).
  const std::string_view verb = VerbOf(argc, argv);
  const auto verbs = app.get_subcommands([](CLI::App*) { return true; });
  if (!verb.empty() && std::none_of(verbs.begin(), verbs.end(), [&](CLI::App* v) { return v->check_name(std::string(verb)); })) {
    std::cerr << "copse: unknown command \"" << verb << "\" (copse --help lists them)\n";
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
  return ExitCode();
}

}  // namespace copse::cli
