#pragma once
// What every copse binary's main() does around its CLI11 app: dying with its parent when asked
// (COPSE_DIE_WITH_PARENT), the global --log-level, naming an unknown verb, mapping usage errors
// to exit 2 and running out of memory to a message and exit 1 (INTERFACE.md's exit codes).
#include <string_view>

#include <CLI/CLI.hpp>

namespace copse::cli {

/// Call first in main(): tests and benchmarks that start copse processes set
/// COPSE_DIE_WITH_PARENT, so a crashed test never leaves a server behind (the guarantee
/// `copse run` gives its children). Survives exec.
void DieWithParentIfAsked();

/// The verb argv names: its first word that is not the global --log-level option (or its
/// value); empty when there is none.
std::string_view VerbOf(int argc, char** argv);

/// Adds the global --log-level to `app`, whose verbs are added, parses argv and runs the verb;
/// returns the process's exit code.
int RunApp(CLI::App& app, int argc, char** argv);

}  // namespace copse::cli
