#include "jobmanager/diagnostics.h"

namespace copse::jm {

Status Diagnostics::ToStatus(std::string_view source) const {
  if (items_.empty()) return Status::OK();
  std::string msg = std::string(source) + ": " + std::to_string(items_.size()) + (items_.size() == 1 ? " error" : " errors");
  for (const auto& d : items_) msg += "\n  " + d.ToString();
  return Status::InvalidArgument(std::move(msg));
}

Json Diagnostics::ToJson() const {
  Json arr = Json::array();
  for (const auto& d : items_) arr.push_back({{"pointer", d.pointer}, {"message", d.message}});
  return arr;
}

}  // namespace copse::jm
