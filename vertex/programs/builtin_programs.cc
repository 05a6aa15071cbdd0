#include "vertex/program_registry.h"

namespace copse::vertex {

void RegisterChecksumPrograms(ProgramRegistry& registry);
void RegisterTextPrograms(ProgramRegistry& registry);
void RegisterExecProgram(ProgramRegistry& registry);

void RegisterBuiltinPrograms(ProgramRegistry& registry) {
  RegisterChecksumPrograms(registry);
  RegisterTextPrograms(registry);
  RegisterExecProgram(registry);
}

}  // namespace copse::vertex
