// AppendJsonString prints a string as DumpJson does, without building a Json value.
#include "common/json_util.h"

#include <doctest/doctest.h>

namespace copse {
namespace {

TEST_CASE("JsonUtil.AppendJsonStringMatchesDumpJson") {
  const std::string cases[] = {"",
                               "plain text",
                               "quote \" backslash \\ newline \n tab \t return \r",
                               std::string("control \x01\x1f and nul ") + '\0' + " end",
                               "utf-8: caf\xc3\xa9",
                               "invalid utf-8: \xff\xfe",
                               "del \x7f, backspace \b, form feed \f"};
  for (const std::string& s : cases) {
    std::string out = "[";
    AppendJsonString(out, s);
    CHECK(out.substr(1) == DumpJson(Json(s)));
    out += "]";
    if (s.find('\xff') == std::string::npos) CHECK(Json::parse(out)[0] == s);
  }
}

}  // namespace
}  // namespace copse
