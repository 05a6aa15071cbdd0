#include "ml/programs/gradient_log.h"

#include <cmath>

#include "ml/programs/support.h"

namespace copse::ml::programs {
namespace {

constexpr char kEntries[] = "__log/entries";

std::string EntryPrefix(size_t i) { return "__log/" + std::to_string(i) + "/"; }

}  // namespace

bool IsGradientLog(const NamedTensors& set) { return FindTensor(set, kEntries) != nullptr; }

Result<size_t> GradientLogEntries(const NamedTensors& log) {
  const Tensor* count = FindTensor(log, kEntries);
  if (!count || count->numel() != 1) return Status::DataLoss("gradient log lacks its entry count");
  const float n = count->ToVector()[0];
  if (!(n >= 1 && n < 1e6f) || std::floor(n) != n) {
    return Status::DataLoss("gradient log has a malformed entry count (" + std::to_string(n) + ")");
  }
  const size_t entries = static_cast<size_t>(n);
  for (size_t i = 0; i < entries; ++i) {
    if (!FindTensor(log, EntryPrefix(i) + "dy")) {
      return Status::DataLoss("gradient log of " + std::to_string(entries) + " entries lacks entry " + std::to_string(i) +
                              "'s dy");
    }
  }
  return entries;
}

NamedTensors GradientLogEntry(const NamedTensors& log, size_t i) {
  const std::string prefix = EntryPrefix(i);
  NamedTensors entry;
  for (const auto& [name, t] : log) {
    if (name.compare(0, prefix.size(), prefix) == 0) entry.emplace_back(name.substr(prefix.size()), t);
  }
  return entry;
}

Status AppendGradientLog(const NamedTensors& previous, const NamedTensors& stash, const Tensor* dy, NamedTensors& out) {
  size_t entries = 0;
  if (!previous.empty()) {
    COPSE_ASSIGN_OR_RETURN(entries, GradientLogEntries(previous));
    for (const auto& [name, t] : previous) {
      if (name != kEntries && name.compare(0, 6, "__log/") == 0) out.emplace_back(name, t);
    }
  }
  const std::string prefix = EntryPrefix(entries);
  bool has_dy = false;
  for (const auto& [name, t] : stash) {
    if (name == "__loss") continue;
    has_dy = has_dy || name == "dy";
    out.emplace_back(prefix + name, t);
  }
  if (!has_dy) {
    if (!dy) return Status::InvalidArgument("a gradient log entry needs dy");
    out.emplace_back(prefix + "dy", *dy);
  }
  out.emplace_back(kEntries, Tensor::FromVector({1}, {static_cast<float>(entries + 1)}));
  return Status::OK();
}

}  // namespace copse::ml::programs
