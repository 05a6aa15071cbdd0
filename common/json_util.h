#pragma once
// JSON helpers: parsing text into nlohmann::json without exceptions escaping, with the error
// located by line and column; JSON-pointer building.
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "common/status.h"

namespace copse {

using Json = nlohmann::json;

/// Parses `text`; on failure an InvalidArgument naming `source`, line and column.
Result<Json> ParseJson(std::string_view text, std::string_view source);

/// Reads and parses the file at `path`.
Result<Json> ReadJsonFile(const std::string& path);

/// `base` + "/" + escaped `token` (RFC 6901: "~" -> "~0", "/" -> "~1").
std::string PointerAppend(std::string_view base, std::string_view token);
std::string PointerAppend(std::string_view base, size_t index);

/// "object", "array", "string", "number", "boolean" or "null".
std::string JsonTypeName(const Json& j);

/// Reads a whole file into a string.
Result<std::string> ReadFile(const std::string& path);

}  // namespace copse
