#include "vertex/program_registry.h"

#include <algorithm>

#include <fmt/format.h>

#include "common/text_util.h"

namespace copse::vertex {

Status ProgramRegistry::Register(const std::string& name, ProgramFactory factory) {
  if (!factories_.emplace(name, std::move(factory)).second) {
    return Status::AlreadyExists("vertex program \"" + name + "\" is already registered");
  }
  return Status::OK();
}

Result<std::unique_ptr<VertexProgram>> ProgramRegistry::Create(const std::string& name) const {
  auto it = factories_.find(name);
  if (it == factories_.end()) {
    return Status::NotFound("no vertex program \"" + name + "\" on this daemon; known: " + Join(Names(), ", "));
  }
  return it->second();
}

std::vector<std::string> ProgramRegistry::Names() const {
  std::vector<std::string> names;
  for (const auto& [name, _] : factories_) names.push_back(name);
  return names;
}

ProgramRegistry& ProgramRegistry::Default() {
  static ProgramRegistry* registry = [] {
    auto* r = new ProgramRegistry();
    RegisterBuiltinPrograms(*r);
    return r;
  }();
  return *registry;
}

}  // namespace copse::vertex
