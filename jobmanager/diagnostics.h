#pragma once
// Diagnostics: the list of every problem found in a job file, each with the JSON pointer of
// the offending value and what was expected. Validation collects all of them instead of
// stopping at the first, so a user fixes a file in one pass.
#include <string>
#include <vector>

#include "common/json_util.h"
#include "common/status.h"

namespace copse::jm {

struct Diagnostic {
  std::string pointer;  // "/edges/2/to"; "" for the document itself
  std::string message;  // what is wrong and what was expected
  std::string ToString() const { return (pointer.empty() ? std::string("(document)") : pointer) + ": " + message; }
};

class Diagnostics {
 public:
  void Error(std::string pointer, std::string message) { items_.push_back({std::move(pointer), std::move(message)}); }
  bool empty() const { return items_.empty(); }
  size_t size() const { return items_.size(); }
  const std::vector<Diagnostic>& items() const { return items_; }

  /// One InvalidArgument listing every diagnostic, one per line; OK when empty.
  Status ToStatus(std::string_view source) const;
  Json ToJson() const;

 private:
  std::vector<Diagnostic> items_;
};

}  // namespace copse::jm
