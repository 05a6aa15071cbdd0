#include "common/json_util.h"

#include <fstream>
#include <memory>
#include <set>
#include <sstream>
#include <vector>

#include "common/text_util.h"

namespace copse {

size_t JsonNestingExceeds(std::string_view text, size_t limit) {
  if (text.size() <= limit) return std::string_view::npos;  // too short to nest that deep: most messages
  size_t depth = 0;
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\') {
        ++i;  // the escaped character, a quote included
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > limit) return i;
    } else if ((c == ']' || c == '}') && depth > 0) {
      --depth;
    }
  }
  return std::string_view::npos;
}

namespace {

/// A parser callback that follows where in the document the parser is (a JSON pointer) and
/// names each key an object repeats. Keeps every value (returns true).
Json::parser_callback_t DuplicateKeyFinder(std::vector<std::string>* duplicates) {
  struct Level {
    bool object = false;
    std::set<std::string> keys;
    std::string key;   // the object's current key
    size_t index = 0;  // the array's current element
  };
  auto levels = std::make_shared<std::vector<Level>>();
  auto pointer = [levels](size_t depth) {
    std::string p;
    for (size_t i = 0; i < depth && i < levels->size(); ++i) {
      const Level& l = (*levels)[i];
      p = PointerAppend(p, l.object ? l.key : std::to_string(l.index));
    }
    return p;
  };
  auto element_done = [levels] {  // a value (or a container, now closed) filled the array's slot
    if (!levels->empty() && !levels->back().object) ++levels->back().index;
  };
  return [levels, pointer, element_done, duplicates](int, Json::parse_event_t event, Json& parsed) {
    switch (event) {
      case Json::parse_event_t::object_start:
      case Json::parse_event_t::array_start:
        levels->push_back(Level{event == Json::parse_event_t::object_start, {}, {}, 0});
        break;
      case Json::parse_event_t::object_end:
      case Json::parse_event_t::array_end:
        if (!levels->empty()) levels->pop_back();
        element_done();
        break;
      case Json::parse_event_t::key:
        if (!levels->empty() && parsed.is_string()) {
          Level& l = levels->back();
          l.key = parsed.get<std::string>();
          if (!l.keys.insert(l.key).second) duplicates->push_back(pointer(levels->size()));
        }
        break;
      case Json::parse_event_t::value:
        element_done();
        break;
    }
    return true;
  };
}

}  // namespace

Result<Json> ParseJson(std::string_view text, std::string_view source, std::vector<std::string>* duplicate_keys) {
  if (size_t at = JsonNestingExceeds(text, kMaxJsonDepth); at != std::string_view::npos) {
    LineColumn lc = LineColumnAt(text, at);
    return Status::InvalidArgument(std::string(source) + ":" + std::to_string(lc.line) + ":" + std::to_string(lc.column) +
                                   ": JSON nested deeper than " + std::to_string(kMaxJsonDepth) + " levels");
  }
  try {
    if (!duplicate_keys) return Json::parse(text.begin(), text.end());
    return Json::parse(text.begin(), text.end(), DuplicateKeyFinder(duplicate_keys));
  } catch (const Json::parse_error& e) {
    // nlohmann reports the byte *after* the offending token; point at the token itself.
    size_t offset = e.byte > 0 ? e.byte - 1 : 0;
    LineColumn lc = LineColumnAt(text, offset);
    std::string what = e.what();
    // Strip nlohmann's "[json.exception.parse_error.101] parse error at line 1, column 2: " prefix.
    if (auto colon = what.find(": "); colon != std::string::npos) what = what.substr(colon + 2);
    return Status::InvalidArgument(std::string(source) + ":" + std::to_string(lc.line) + ":" +
                                   std::to_string(lc.column) + ": malformed JSON: " + what);
  } catch (const Json::exception& e) {
    // A number beyond a double's range ("1e999") is out_of_range, not parse_error, and carries
    // no position: it must still be the sender's error, never an exception out of a server.
    std::string what = e.what();
    if (auto bracket = what.find("] "); bracket != std::string::npos) what = what.substr(bracket + 2);
    return Status::InvalidArgument(std::string(source) + ": malformed JSON: " + what);
  }
}

std::string DumpJson(const Json& j, int indent) { return j.dump(indent, ' ', false, Json::error_handler_t::replace); }

std::string StringMember(const Json& j, const char* key) {
  if (!j.is_object()) return {};
  auto it = j.find(key);
  return it != j.end() && it->is_string() ? it->get<std::string>() : std::string();
}

Result<std::string> ReadFile(const std::string& path, size_t max_bytes) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::NotFound("cannot open " + path);
  std::string text;
  char chunk[1 << 16];
  while (in.read(chunk, sizeof chunk) || in.gcount() > 0) {
    if (static_cast<size_t>(in.gcount()) > max_bytes - text.size()) {
      return Status::InvalidArgument(path + " is larger than " +
                                     (max_bytes >= (1 << 20) ? std::to_string(max_bytes >> 20) + " MiB" : std::to_string(max_bytes) + " bytes"));
    }
    text.append(chunk, static_cast<size_t>(in.gcount()));
  }
  if (in.bad()) return Status::IOError("error reading " + path);
  return text;
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
