#include "common/json_util.h"

#include <algorithm>
#include <cstdio>
#include <fstream>
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

/// A SAX pass that follows where in the document the parser is (a JSON pointer) and names each
/// key an object repeats. Separate from building the document: nlohmann's parser with a
/// callback rescans the parent container after every object, quadratic in a file's size.
class DuplicateKeyFinder final : public nlohmann::json_sax<Json> {
 public:
  explicit DuplicateKeyFinder(std::vector<std::string>* duplicates) : duplicates_(duplicates) {}

  bool null() override { return Value(); }
  bool boolean(bool) override { return Value(); }
  bool number_integer(number_integer_t) override { return Value(); }
  bool number_unsigned(number_unsigned_t) override { return Value(); }
  bool number_float(number_float_t, const string_t&) override { return Value(); }
  bool string(string_t&) override { return Value(); }
  bool binary(binary_t&) override { return Value(); }
  bool start_object(std::size_t) override { return Open(true); }
  bool start_array(std::size_t) override { return Open(false); }
  bool end_object() override { return Close(); }
  bool end_array() override { return Close(); }
  bool key(string_t& key) override {
    Level& l = levels_.back();
    l.key = key;
    if (!l.keys.insert(key).second) {
      std::string p;
      for (const Level& each : levels_) p = PointerAppend(p, each.object ? each.key : std::to_string(each.index));
      duplicates_->push_back(std::move(p));
    }
    return true;
  }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception&) override { return false; }

 private:
  struct Level {
    bool object = false;
    std::set<std::string> keys;
    std::string key;   // the object's current key
    size_t index = 0;  // the array's current element
  };
  bool Open(bool object) {
    levels_.push_back(Level{object, {}, {}, 0});
    return true;
  }
  bool Close() {
    levels_.pop_back();
    return Value();  // the container, now closed, filled its parent's slot
  }
  bool Value() {
    if (!levels_.empty() && !levels_.back().object) ++levels_.back().index;
    return true;
  }
  std::vector<std::string>* duplicates_;
  std::vector<Level> levels_;
};

}  // namespace

Result<Json> ParseJson(std::string_view text, std::string_view source, std::vector<std::string>* duplicate_keys) {
  if (size_t at = JsonNestingExceeds(text, kMaxJsonDepth); at != std::string_view::npos) {
    LineColumn lc = LineColumnAt(text, at);
    return Status::InvalidArgument(std::string(source) + ":" + std::to_string(lc.line) + ":" + std::to_string(lc.column) +
                                   ": JSON nested deeper than " + std::to_string(kMaxJsonDepth) + " levels");
  }
  try {
    Json doc = Json::parse(text.begin(), text.end());
    if (duplicate_keys) {
      DuplicateKeyFinder finder(duplicate_keys);
      Json::sax_parse(text.begin(), text.end(), &finder);  // well-formed: the parse above said so
    }
    return doc;
  } catch (const Json::parse_error& e) {
    // nlohmann reports the byte *after* the offending token; point at the token itself.
    size_t offset = e.byte > 0 ? e.byte - 1 : 0;
    LineColumn lc = LineColumnAt(text, offset);
    std::string what = e.what();
    // Strip nlohmann's "[json.exception.parse_error.101] parse error at line 1, column 2: " prefix.
    if (auto colon = what.find(": "); colon != std::string::npos) what = what.substr(colon + 2);
    return Status::InvalidArgument(std::string(source) + ":" + std::to_string(lc.line) + ":" + std::to_string(lc.column) +
                                   ": malformed JSON: " + what);
  } catch (const Json::exception& e) {
    // A number beyond a double's range ("1e999") is out_of_range, not parse_error, and carries
    // no position: it must still be the sender's error, never an exception out of a server.
    std::string what = e.what();
    if (auto bracket = what.find("] "); bracket != std::string::npos) what = what.substr(bracket + 2);
    return Status::InvalidArgument(std::string(source) + ": malformed JSON: " + what);
  }
}

std::string DumpJson(const Json& j, int indent) { return j.dump(indent, ' ', false, Json::error_handler_t::replace); }

void AppendJsonString(std::string& out, std::string_view s) {
  if (std::any_of(s.begin(), s.end(), [](char c) { return static_cast<unsigned char>(c) >= 0x80; })) {
    out += DumpJson(Json(std::string(s)));  // UTF-8 to check, and invalid bytes to replace
    return;
  }
  out += '"';
  size_t run = 0;  // start of the characters not yet appended, which need no escaping
  for (size_t i = 0; i < s.size(); ++i) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c >= 0x20 && c != '"' && c != '\\') continue;
    out.append(s.data() + run, i - run);
    run = i + 1;
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      case '\r': out += "\\r"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default: {
        char escaped[8];
        std::snprintf(escaped, sizeof escaped, "\\u%04x", c);
        out += escaped;
      }
    }
  }
  out.append(s.data() + run, s.size() - run);
  out += '"';
}

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
      return Status::InvalidArgument(
          path + " is larger than " +
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
