#include "vertex/program_registry.h"

#include <algorithm>

#include <fmt/format.h>

#include "common/text_util.h"

namespace copse::vertex {

std::filesystem::path VertexContext::ResolvePath(const std::string& path) const {
  std::filesystem::path p(path);
  return p.is_relative() && !job_dir.empty() ? job_dir / p : p;
}

Result<std::filesystem::path> VertexContext::MakeScratchDir() {
  std::error_code ec;
  std::filesystem::create_directories(scratch_dir, ec);
  if (ec) return Status::IOError(name + ": cannot create " + scratch_dir.string() + ": " + ec.message());
  scratch_created_ = true;
  return scratch_dir;
}

Status VertexContext::ChargeMemory(int64_t delta) {
  memory_charged_ = std::max<int64_t>(0, memory_charged_ + delta);
  if (memory_limit_bytes <= 0 || memory_charged_ <= memory_limit_bytes) return Status::OK();
  return Status::ResourceExhausted(fmt::format(
      "{} needs more than its {} of {} MB (it holds {} MB): declare more, or give it less to hold at once", name,
      memory_declared ? "resources.memory_mb" : "share of its daemon's memory (its stage declares no resources.memory_mb)",
      memory_limit_bytes >> 20, memory_charged_ >> 20));
}

Status VertexContext::CloseOutputs() {
  for (auto* out : outputs) COPSE_RETURN_NOT_OK(out->Close());
  return Status::OK();
}

Status VertexContext::WriteAll(const chan::Buffer& message) {
  for (auto* out : outputs) COPSE_RETURN_NOT_OK(out->Write(message));
  return Status::OK();
}

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
