#pragma once
// ProgramRegistry: vertex programs by name. The daemon creates a fresh program object per
// execution; the CLI reads the names to validate job files. Register at startup, before any
// lookup; lookups are then safe from any thread.
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "vertex/program.h"

namespace copse::vertex {

using ProgramFactory = std::function<std::unique_ptr<VertexProgram>()>;

class ProgramRegistry {
 public:
  /// AlreadyExists when `name` is taken.
  Status Register(const std::string& name, ProgramFactory factory);
  /// A new instance of `name`; NotFound with the known names when unknown.
  Result<std::unique_ptr<VertexProgram>> Create(const std::string& name) const;
  bool Contains(const std::string& name) const { return factories_.count(name) > 0; }
  std::vector<std::string> Names() const;

  /// The process-wide registry with the built-in programs (and whatever startup code added).
  static ProgramRegistry& Default();

 private:
  std::map<std::string, ProgramFactory> factories_;
};

/// Registers noop, checksum, text.read_lines, text.count_words, text.merge_counts and exec.
void RegisterBuiltinPrograms(ProgramRegistry& registry);

}  // namespace copse::vertex
