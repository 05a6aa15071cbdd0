#pragma once
// Each `copse` verb lives in its own file and adds itself to the CLI11 app through one of
// these functions. Callbacks set the process exit code through ExitCode().
#include <CLI/CLI.hpp>

namespace copse::cli {

void AddValidateCommand(CLI::App& app);
void AddProgramsCommand(CLI::App& app);
void AddJmCommand(CLI::App& app);
void AddDaemonCommand(CLI::App& app);
void AddClientCommands(CLI::App& app);
void AddRunCommand(CLI::App& app);

/// The exit code a command's callback sets: 0 success, 1 the job or the input failed,
/// 2 usage error (main() maps CLI11's parse errors to 2).
int& ExitCode();

}  // namespace copse::cli
