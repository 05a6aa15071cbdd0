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

TEST_CASE("JsonUtil.IntegersAreCheckedAgainstTheirTypesRange") {
  const Json j = Json::parse(R"({"small": 7, "negative": -2, "huge": 1e300, "fraction": 1.5, "big": 4294967296,
                                 "text": "7", "list": [1, 2, 3], "bad_list": [1, -1]})");
  CHECK(IntegerOr<int64_t>(j, "small", 0) == 7);
  CHECK(IntegerOr<int64_t>(j, "absent", 42) == 42);
  CHECK(IntegerOr<int64_t>(Json::array(), "small", 42) == 42);
  CHECK(IntegerOr<int32_t>(j, "negative", 0) == -2);
  CHECK_THROWS_AS(IntegerOr<uint64_t>(j, "negative", 0), std::invalid_argument);  // would wrap
  CHECK_THROWS_AS(IntegerOr<int64_t>(j, "huge", 0), std::invalid_argument);       // would be undefined
  CHECK_THROWS_AS(IntegerOr<int64_t>(j, "fraction", 0), std::invalid_argument);
  CHECK_THROWS_AS(IntegerOr<uint32_t>(j, "big", 0), std::invalid_argument);
  CHECK(IntegerOr<uint64_t>(j, "big", 0) == 4294967296u);
  CHECK_THROWS_AS(IntegerOr<int64_t>(j, "text", 0), std::invalid_argument);
  CHECK_THROWS_AS(IntegerAt<int64_t>(j, "absent"), std::invalid_argument);
  CHECK(IntegersAt<uint32_t>(j, "list") == std::vector<uint32_t>{1, 2, 3});
  CHECK_THROWS_AS(IntegersAt<uint32_t>(j, "bad_list"), std::invalid_argument);
  try {
    IntegerOr<int64_t>(j, "huge", 0);
  } catch (const std::invalid_argument& e) {
    CHECK(std::string(e.what()).find("\"huge\"") != std::string::npos);  // names the member
  }
}

}  // namespace
}  // namespace copse
