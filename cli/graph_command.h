#pragma once
// `copse graph data-parallel|pipeline|hybrid`: writes a training job file (ml/graph_gen.h) to
// standard output, or to --out FILE. Flags per INTERFACE.md plus --steps, --reducer, --limit,
// --data-dir, …; see docs/ml-graphs.md.
// Exit codes: 0 written, 1 bad combination of flags (message names the flag), 2 usage error.
#include <CLI/CLI.hpp>

namespace copse::cli {

/// Registers the `graph` subcommand on `app`.
void AddGraphCommand(CLI::App& app);

}  // namespace copse::cli
