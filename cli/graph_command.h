#pragma once
// `copse graph data-parallel|pipeline|hybrid`: writes a training job file (ml/graph_gen.h) to
// standard output, or to --out FILE. Flags per INTERFACE.md plus --steps, --reducer, --limit,
// --data-dir, …; see docs/ml-graphs.md.
// Exit codes: 0 written, 1 bad combination of flags (message names the flag), 2 usage error.
#include <string>

#include <CLI/CLI.hpp>

#include "common/json_util.h"
#include "ml/graph_gen.h"

namespace copse::cli {

/// What the training flags set: the generator's options, --split's text and --out.
struct GraphFlags {
  ml::GraphOptions o;
  std::string split;
  std::string out;
};

/// The flags every training graph takes (--model, --batch, --steps, --lr, …, --out); `copse plan`
/// takes them too.
void AddTrainingFlags(CLI::App* cmd, GraphFlags& f);

/// Writes `job` one line per stage, edge and output to `out` (standard output when empty).
/// Returns the exit code: 1 when the file cannot be written (said on stderr, after `command`).
int WriteJobFile(const Json& job, const std::string& out, const char* command);

/// Registers the `graph` subcommand on `app`.
void AddGraphCommand(CLI::App& app);

}  // namespace copse::cli
