#include "common/json_util.h"

#include <fstream>
#include <sstream>

#include "common/text_util.h"

namespace copse {

Result<Json> ParseJson(std::string_view text, std::string_view source) {
  try {
    return Json::parse(text.begin(), text.end());
  } catch (const Json::parse_error& e) {
    // nlohmann reports the byte *after* the offending token; point at the token itself.
    size_t offset = e.byte > 0 ? e.byte - 1 : 0;
    LineColumn lc = LineColumnAt(text, offset);
    std::string what = e.what();
    // Strip nlohmann's "[json.exception.parse_error.101] parse error at line 1, column 2: " prefix.
    if (auto colon = what.find(": "); colon != std::string::npos) what = what.substr(colon + 2);
    return Status::InvalidArgument(std::string(source) + ":" + std::to_string(lc.line) + ":" +
                                   std::to_string(lc.column) + ": malformed JSON: " + what);
  }
}

Result<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::NotFound("cannot open " + path);
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) return Status::IOError("error reading " + path);
  return ss.str();
}

Result<Json> ReadJsonFile(const std::string& path) {
  COPSE_ASSIGN_OR_RETURN(std::string text, ReadFile(path));
  return ParseJson(text, path);
}

std::string PointerAppend(std::string_view base, std::string_view token) {
  std::string t = ReplaceAll(std::string(token), "~", "~0");
  t = ReplaceAll(std::move(t), "/", "~1");
  std::string out(base);
  out += '/';
  out += t;
  return out;
}

std::string PointerAppend(std::string_view base, size_t index) {
  std::string out(base);
  out += '/';
  out += std::to_string(index);
  return out;
}

std::string JsonTypeName(const Json& j) {
  switch (j.type()) {
    case Json::value_t::object: return "object";
    case Json::value_t::array: return "array";
    case Json::value_t::string: return "string";
    case Json::value_t::boolean: return "boolean";
    case Json::value_t::null: return "null";
    case Json::value_t::number_integer:
    case Json::value_t::number_unsigned:
    case Json::value_t::number_float: return "number";
    default: return "value";
  }
}

}  // namespace copse
