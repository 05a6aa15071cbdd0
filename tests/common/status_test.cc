#include <doctest/doctest.h>

#include "common/json_util.h"
#include "common/status.h"
#include "common/text_util.h"

namespace copse {
namespace {

Result<int> Half(int x) {
  if (x % 2) return Status::InvalidArgument("odd: " + std::to_string(x));
  return x / 2;
}

Result<int> Quarter(int x) {
  COPSE_ASSIGN_OR_RETURN(int h, Half(x));
  return Half(h);
}

TEST_CASE("Status.OkAndErrorsCarryCodeAndMessage") {
  CHECK(Status::OK().ok());
  Status s = Status::NotFound("no such vertex").WithContext("job 3");
  CHECK_FALSE(s.ok());
  CHECK(s.code() == StatusCode::kNotFound);
  CHECK(s.ToString() == "NotFound: job 3: no such vertex");
}

TEST_CASE("Result.AssignOrReturnPropagatesTheFirstError") {
  CHECK(Quarter(8).value() == 2);
  auto r = Quarter(6);
  REQUIRE_FALSE(r.ok());
  CHECK(r.status().message() == "odd: 3");
}

TEST_CASE("TextUtil.DidYouMeanFindsCloseWordsOnly") {
  CHECK(DidYouMean("replcas", {"replicas", "program", "params"}) == "replicas");
  CHECK(DidYouMean("zzzzzz", {"replicas", "program"}).empty());
  CHECK(EditDistance("kitten", "sitting") == 3);
}

TEST_CASE("TextUtil.Utf8IsCheckedAsProtocolBuffersDo") {
  for (std::string_view good : {"", "plain", "caf\xc3\xa9", "\xe2\x82\xac", "\xf0\x9f\x98\x80"}) CHECK(IsValidUtf8(good));
  for (std::string_view bad : {"\xff", "\xc3", "a\xe2\x82", "\xc0\xaf" /* overlong */, "\xed\xa0\x80" /* surrogate */,
                               "\xf4\x90\x80\x80" /* past U+10FFFF */, "\x80"}) {
    CAPTURE(bad);
    CHECK_FALSE(IsValidUtf8(bad));
  }
}

TEST_CASE("Json.ParseErrorNamesLineAndColumn") {
  auto r = ParseJson("{\n  \"a\": 1,\n  \"b\": ]\n}", "job.json");
  REQUIRE_FALSE(r.ok());
  CHECK(r.status().message().rfind("job.json:3:8: malformed JSON", 0) == 0);
  CHECK(PointerAppend("/stages", "a/b~c") == "/stages/a~1b~0c");
}

TEST_CASE("Json.DuplicateKeysAreNamedByTheirPointers") {
  std::vector<std::string> duplicates;
  auto r =
      ParseJson(R"({"a": [1, {"x": 1}, [2, {"k/y": 1, "k/y": 2}]], "a": 3, "b": {"c": {}, "c": {}}})", "job.json", &duplicates);
  REQUIRE(r.ok());
  CHECK((*r)["a"] == 3);  // JSON keeps the last
  CHECK(duplicates == std::vector<std::string>{"/a/2/1/k~1y", "/a", "/b/c"});
  duplicates.clear();
  REQUIRE(ParseJson(R"({"a": [{"x": 1}, {"x": 2}], "b": {"x": 3}})", "job.json", &duplicates).ok());
  CHECK(duplicates.empty());  // one key in many objects is no duplicate
}

TEST_CASE("Json.ANumberBeyondADoubleIsAnErrorNotAnException") {
  // out_of_range, not parse_error, inside nlohmann: one such frame aborted the job manager.
  auto r = ParseJson(R"({"op":"auth","x":1e999})", "message");
  REQUIRE_FALSE(r.ok());
  CHECK(r.status().message() == "message: malformed JSON: number overflow parsing '1e999'");
  // Every other parse in the tree passes allow_exceptions = false, which must cover it too.
  CHECK(Json::parse(R"({"x":1e999})", nullptr, false).is_discarded());
}

}  // namespace
}  // namespace copse
