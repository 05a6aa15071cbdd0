#include "cli/program_catalog.h"

#include <mutex>

#include "ml/programs/register.h"

namespace copse::cli {

vertex::ProgramRegistry& Programs() {
  static std::once_flag ml_once;
  std::call_once(ml_once, [] { ml::RegisterMlPrograms(vertex::ProgramRegistry::Default()); });
  return vertex::ProgramRegistry::Default();
}

jm::ProgramCatalog Catalog() {
  jm::ProgramCatalog catalog;
  for (auto& name : Programs().Names()) catalog.names.insert(std::move(name));
  catalog.check_params = [](const std::string& program, const Json& params) -> Status {
    COPSE_ASSIGN_OR_RETURN(auto instance, Programs().Create(program));
    return instance->CheckParams(params);
  };
  return catalog;
}

}  // namespace copse::cli
