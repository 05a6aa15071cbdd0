#include "cli/program_catalog.h"

namespace copse::cli {

vertex::ProgramRegistry& Programs() { return vertex::ProgramRegistry::Default(); }

jm::ProgramCatalog Catalog() {
  jm::ProgramCatalog catalog;
  for (auto& name : Programs().Names()) catalog.names.insert(std::move(name));
  return catalog;
}

}  // namespace copse::cli
