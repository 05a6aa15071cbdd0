#pragma once
// JSON helpers: parsing text into nlohmann::json without exceptions escaping, with the error
// located by line and column; JSON-pointer building.
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"

namespace copse {

using Json = nlohmann::json;

/// Deepest nesting of arrays and objects ParseJson accepts. Copying and printing a document
/// recurse once per level, so an unbounded depth (a 200 KB job file can nest 100,000 deep)
/// would overflow a server's stack; real documents nest a few levels.
inline constexpr size_t kMaxJsonDepth = 512;

/// Parses `text`; on failure an InvalidArgument naming `source`, line and column. Nesting
/// deeper than kMaxJsonDepth is such a failure. With `duplicate_keys`, the JSON pointer of
/// every key an object repeats goes there ("/stages/0/name"): JSON keeps only the last of
/// them, so a document a person wrote (a job file) loses the others silently otherwise.
Result<Json> ParseJson(std::string_view text, std::string_view source, std::vector<std::string>* duplicate_keys = nullptr);

/// Byte offset in `text` where nesting first goes deeper than `limit` (brackets inside strings
/// do not count), or npos. Linear and allocation-free: run before parsing untrusted text.
size_t JsonNestingExceeds(std::string_view text, size_t limit);

/// `j` as compact text (or indented by `indent`). Strings built from raw bytes (a program's
/// stderr, a parse error quoting what it read) may hold invalid UTF-8, on which nlohmann's
/// dump() throws; here such bytes become U+FFFD, so sending or journaling never throws.
std::string DumpJson(const Json& j, int indent = -1);

/// Appends `s` as a JSON string (quoted, escaped) to `out`, as DumpJson would print it, without
/// building a Json value: for records written on a hot path.
void AppendJsonString(std::string& out, std::string_view s);

/// `j[key]` when `j` is an object holding a string there, else "": for reading a peer's
/// fields before knowing the message is well formed.
std::string StringMember(const Json& j, const char* key);

/// Reads and parses the file at `path`.
Result<Json> ReadJsonFile(const std::string& path);

/// `base` + "/" + escaped `token` (RFC 6901: "~" -> "~0", "/" -> "~1").
std::string PointerAppend(std::string_view base, std::string_view token);
std::string PointerAppend(std::string_view base, size_t index);

/// "object", "array", "string", "number", "boolean" or "null".
std::string JsonTypeName(const Json& j);

/// Reads a whole file into a string; more than `max_bytes` is an error (a device like
/// /dev/zero, or a file far bigger than its reader could use, is never read to the end).
Result<std::string> ReadFile(const std::string& path, size_t max_bytes = SIZE_MAX);

}  // namespace copse
