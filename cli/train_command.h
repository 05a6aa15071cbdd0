#pragma once
// `copse train`: single-process training on Fashion-MNIST with copse::ml (the reference that
// graph-based training is compared with). Flags and output per docs (INTERFACE.md):
//   copse train --model mlp|cnn --epochs N --batch B --lr X --momentum X --threads T --seed S
//               [--data-dir DIR] [--limit N] [--device cpu|cuda] [-o json]
// Exit codes: 0 trained, 1 training failed (message says why), 2 usage error (CLI11).
#include <CLI/CLI.hpp>

namespace copse::cli {

/// Registers the `train` subcommand on `app`; its callback does the work and exits.
void AddTrainCommand(CLI::App& app);

}  // namespace copse::cli
