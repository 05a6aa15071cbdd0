#pragma once
// `copse plan`: measures a model where it will train (a profiling job, ml/profile_graph.h, run on
// an embedded local cluster like `copse run`'s, or a cost table measured earlier: --costs), weighs
// the data-parallel and pipeline layouts the planner knows (ml/planner.h), prints each with its
// predicted step time, bubble and memory per daemon, and writes the fastest that fits as a
// training job file whose summary then shows the prediction next to the measurement.
// Exit codes: 0 written, 1 profiling failed or no layout fits (the message says which daemon
// needs how much more), 2 usage error.
#include <CLI/CLI.hpp>

namespace copse::cli {

void AddPlanCommand(CLI::App& app);

}  // namespace copse::cli
