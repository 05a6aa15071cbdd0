#pragma once
// The vertex programs this copse binary can run: the built-ins plus the ML programs. Used to
// validate job files before they are submitted.
#include "jobmanager/job_parser.h"
#include "vertex/program_registry.h"

namespace copse::cli {

/// The registry every process of this binary (daemon, local runner) executes programs from.
vertex::ProgramRegistry& Programs();
/// The names in Programs(), as the job loader's catalog.
jm::ProgramCatalog Catalog();

}  // namespace copse::cli
