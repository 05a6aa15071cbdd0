// The gradient log's encoding (ml/programs/gradient_log.h): entries share the tensors they were
// made of, and a malformed log is DataLoss, never a crash or a silently shorter sum. That a
// replayed log gives the accumulated gradients bit for bit is tested end to end in
// ml_graph_test.cc (a pipeline with the model cache off).
#include <limits>

#include <doctest/doctest.h>

#include "ml/programs/gradient_log.h"
#include "ml/programs/support.h"

namespace copse::ml::programs {
namespace {

Tensor Filled(const Shape& shape, float v) {
  Tensor t = Tensor::Empty(shape);
  for (int64_t i = 0; i < t.numel(); ++i) t.data()[i] = v + static_cast<float>(i);
  return t;
}

TEST_CASE("GradientLog.EntriesShareTheTensorsTheyWereMadeOf") {
  const NamedTensors stash0 = {{"s0.0", Filled({2, 3}, 1)}, {"s0.shape", Filled({1}, -1)}};
  const Tensor dy0 = Filled({2, 4}, 10);
  NamedTensors log1;
  REQUIRE(AppendGradientLog({}, stash0, &dy0, log1).ok());
  CHECK(IsGradientLog(log1));
  REQUIRE(GradientLogEntries(log1).ok());
  CHECK(*GradientLogEntries(log1) == 1);

  // The last stage's stash brings its own dy and a "__loss", which the log leaves out.
  const NamedTensors stash1 = {{"s0.0", Filled({2, 3}, 5)}, {"dy", Filled({2, 4}, 20)}, {"__loss", Filled({2}, 0)}};
  NamedTensors log2;
  REQUIRE(AppendGradientLog(log1, stash1, nullptr, log2).ok());
  REQUIRE(GradientLogEntries(log2).ok());
  CHECK(*GradientLogEntries(log2) == 2);

  const NamedTensors e0 = GradientLogEntry(log2, 0), e1 = GradientLogEntry(log2, 1);
  CHECK(e0.size() == 3);  // s0.0, s0.shape, dy
  CHECK(e1.size() == 2);  // s0.0, dy
  REQUIRE(FindTensor(e0, "s0.0"));
  REQUIRE(FindTensor(e0, "dy"));
  REQUIRE(FindTensor(e1, "dy"));
  CHECK(FindTensor(e0, "s0.0")->data() == stash0[0].second.data());  // shared, not copied
  CHECK(FindTensor(e0, "dy")->data() == dy0.data());
  CHECK(FindTensor(e1, "dy")->data() == stash1[1].second.data());
  CHECK(FindTensor(e1, "__loss") == nullptr);
  CHECK(GradientLogEntry(log2, 2).empty());
}

TEST_CASE("GradientLog.AnEntryWithoutDyIsRefused") {
  NamedTensors log;
  const Status st = AppendGradientLog({}, {{"x", Filled({1, 2}, 0)}}, nullptr, log);
  CHECK(st.code() == StatusCode::kInvalidArgument);
}

TEST_CASE("GradientLog.AMalformedLogIsDataLoss") {
  const Tensor dy = Filled({1, 2}, 0);
  NamedTensors good;
  REQUIRE(AppendGradientLog({}, {{"x", Filled({1, 2}, 0)}}, &dy, good).ok());

  SUBCASE("no entry count") {
    NamedTensors bad;
    for (const auto& kv : good)
      if (kv.first != "__log/entries") bad.push_back(kv);
    CHECK_FALSE(IsGradientLog(bad));
    CHECK(GradientLogEntries(bad).status().code() == StatusCode::kDataLoss);
  }
  for (const float count : {0.0f, -1.0f, 2.5f, std::numeric_limits<float>::quiet_NaN(), 3e9f}) {
    CAPTURE(count);
    NamedTensors bad = good;
    for (auto& [name, t] : bad)
      if (name == "__log/entries") t = Tensor::FromVector({1}, {count});
    CHECK(GradientLogEntries(bad).status().code() == StatusCode::kDataLoss);
  }
  SUBCASE("a count beyond its entries") {
    NamedTensors bad = good;
    for (auto& [name, t] : bad)
      if (name == "__log/entries") t = Tensor::FromVector({1}, {2.0f});
    const auto r = GradientLogEntries(bad);
    CHECK(r.status().code() == StatusCode::kDataLoss);
    CHECK(r.status().message().find("entry 1") != std::string::npos);
  }
  SUBCASE("appending to a malformed log") {
    NamedTensors bad = good, out;
    for (auto& [name, t] : bad)
      if (name == "__log/entries") t = Tensor::FromVector({1}, {0.0f});
    CHECK(AppendGradientLog(bad, {{"x", Filled({1, 2}, 0)}}, &dy, out).code() == StatusCode::kDataLoss);
  }
}

}  // namespace
}  // namespace copse::ml::programs
