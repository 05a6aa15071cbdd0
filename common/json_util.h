#pragma once
// JSON helpers: parsing text into nlohmann::json without exceptions escaping, with the error
// located by line and column; JSON-pointer building.
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>
#include <type_traits>
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

/// `j[key]` as the integer type T; `fallback` when `j` is not an object or has no `key`.
/// std::invalid_argument naming `key` when it holds anything but an integer in T's range: a
/// peer's or a file's number is checked here, because nlohmann's get<T>() and value() convert
/// a float beyond T's range (1e300) with undefined behaviour and wrap a negative into an
/// unsigned T.
template <class T>
T IntegerOr(const Json& j, const char* key, T fallback);
/// The same for a member that must be there (std::invalid_argument when it is not).
template <class T>
T IntegerAt(const Json& j, const char* key);
/// `j[key]` as an array of integers of type T, each checked as IntegerAt checks one.
template <class T>
std::vector<T> IntegersAt(const Json& j, const char* key);

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

namespace json_detail {
/// `value` as T, or std::invalid_argument naming `what` (see IntegerOr).
template <class T>
T CheckedInteger(const Json& value, const std::string& what) {
  static_assert(std::is_integral_v<T>);
  bool fits = false;
  if (value.is_number_unsigned()) {
    fits = value.get<uint64_t>() <= static_cast<uint64_t>(std::numeric_limits<T>::max());
  } else if (value.is_number_integer()) {  // stored signed (a negative, or built in C++ from an int)
    const int64_t x = value.get<int64_t>();
    fits = std::is_signed_v<T> ? x >= static_cast<int64_t>(std::numeric_limits<T>::min()) &&
                                     x <= static_cast<int64_t>(std::numeric_limits<T>::max())
                               : x >= 0 && static_cast<uint64_t>(x) <= static_cast<uint64_t>(std::numeric_limits<T>::max());
  }
  if (!fits) {
    throw std::invalid_argument(what + ": expected a whole number from " + std::to_string(std::numeric_limits<T>::min()) +
                                " to " + std::to_string(std::numeric_limits<T>::max()) + ", got " + DumpJson(value));
  }
  return value.is_number_unsigned() ? static_cast<T>(value.get<uint64_t>()) : static_cast<T>(value.get<int64_t>());
}
}  // namespace json_detail

template <class T>
T IntegerOr(const Json& j, const char* key, T fallback) {
  if (!j.is_object()) return fallback;
  auto it = j.find(key);
  return it == j.end() ? fallback : json_detail::CheckedInteger<T>(*it, std::string("\"") + key + "\"");
}

template <class T>
T IntegerAt(const Json& j, const char* key) {
  if (!j.is_object() || !j.contains(key)) throw std::invalid_argument(std::string("\"") + key + "\": missing");
  return json_detail::CheckedInteger<T>(j[key], std::string("\"") + key + "\"");
}

template <class T>
std::vector<T> IntegersAt(const Json& j, const char* key) {
  if (!j.is_object() || !j.contains(key) || !j[key].is_array())
    throw std::invalid_argument(std::string("\"") + key + "\": expected an array of whole numbers");
  std::vector<T> out;
  out.reserve(j[key].size());
  for (const Json& v : j[key]) out.push_back(json_detail::CheckedInteger<T>(v, std::string("an element of \"") + key + "\""));
  return out;
}

}  // namespace copse
