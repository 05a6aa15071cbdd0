// The pipeline bubble measure behind `copse run`'s summary and bench/ml_graph_bench.
#include "ml/pipeline_bubble.h"

#include <doctest/doctest.h>

using copse::ml::MeasuredBubble;
using copse::ml::Span;

namespace {

/// Spans of a 2-stage, 2-micro-batch pipeline over `steps` steps in which stage 0 works
/// [0, 4) and stage 1 works [1, 3) of every 4-unit step (each vertex half of its stage's time).
std::map<std::string, Span> TwoStages(int steps) {
  std::map<std::string, Span> s;
  for (int t = 0; t < steps; ++t) {
    const double b = 4.0 * t;
    for (int m = 0; m < 2; ++m) {
      const std::string r = "[" + std::to_string(2 * t + m) + "]";
      s["fwd0" + r] = {b + 0.5 * m, b + 0.5 * m + 0.5};
      s["bwd0" + r] = {b + 3 + 0.5 * m, b + 3 + 0.5 * m + 0.5};
      s["fwd1" + r] = {b + 1 + 0.5 * m, b + 1 + 0.5 * m + 0.5};
      s["bwd1" + r] = {b + 2 + 0.5 * m, b + 2 + 0.5 * m + 0.5};
    }
  }
  return s;
}

}  // namespace

TEST_CASE("PipelineBubble.IdleShareOfEachStageOverEachStepAfterTheFirst") {
  // Stage 0 is busy 2 of 4 units, stage 1 2 of 4: a bubble of 50 %.
  CHECK(MeasuredBubble(TwoStages(3), 2, 2)->mean == doctest::Approx(0.5));
  // The first step is warm-up: one step alone measures nothing.
  CHECK(!MeasuredBubble(TwoStages(1), 2, 2).has_value());
  // An incomplete step (a missing vertex) ends the measure.
  auto spans = TwoStages(3);
  spans.erase("bwd1[5]");
  CHECK(MeasuredBubble(spans, 2, 2)->mean == doctest::Approx(0.5));
  CHECK(copse::ml::TheoreticalBubble(2, 8) == doctest::Approx(1.0 / 9));
}

TEST_CASE("PipelineBubble.EachStagesIdleShare") {
  // Stage 1 idles 1 of every 4 units, stage 0 3 of 4: the bubble is their mean.
  std::map<std::string, Span> s;
  for (int t = 0; t < 3; ++t) {
    const double b = 4.0 * t;
    const std::string r = "[" + std::to_string(t) + "]";
    s["fwd0" + r] = {b, b + 0.5};
    s["fwd1" + r] = {b + 0.5, b + 2};
    s["bwd1" + r] = {b + 2, b + 3.5};
    s["bwd0" + r] = {b + 3.5, b + 4};
  }
  auto b = MeasuredBubble(s, 2, 1);
  REQUIRE(b.has_value());
  REQUIRE(b->stage_idle.size() == 2);
  CHECK(b->stage_idle[0] == doctest::Approx(0.75));
  CHECK(b->stage_idle[1] == doctest::Approx(0.25));
  CHECK(b->mean == doctest::Approx(0.5));
}

TEST_CASE("PipelineBubble.WithoutGapsStartsEachVertexOnceItsPredecessorsEnded") {
  // One micro-batch a step, 1 unit per vertex and update, with 1 unit of dispatch before every
  // vertex: replayed, each starts the moment its stage's previous vertex or its cross-stage
  // predecessor ended.
  std::map<std::string, Span> s;
  double now = 0;
  auto next = [&](const std::string& name) {
    now += 1;  // the gap
    s[name] = {now, now + 1};
    now += 1;
  };
  for (int t = 0; t < 3; ++t) {
    const std::string r = "[" + std::to_string(t) + "]";
    next("fwd0" + r);
    next("fwd1" + r);
    next("bwd1" + r);
    next("bwd0" + r);
    s["upd1" + r] = {now - 1, now};  // alongside bwd0, as a stage's update runs
    next("upd0" + r);
  }
  const auto replay = copse::ml::WithoutGaps(s, 2);
  CHECK(replay.at("fwd0[0]").start == doctest::Approx(1));  // a stage's first vertex keeps its start
  CHECK(replay.at("fwd1[0]").start == doctest::Approx(2));
  CHECK(replay.at("bwd1[0]").start == doctest::Approx(3));
  CHECK(replay.at("bwd0[0]").start == doctest::Approx(4));
  CHECK(replay.at("upd0[0]").start == doctest::Approx(5));
  CHECK(replay.at("fwd0[1]").start == doctest::Approx(6));
  CHECK(replay.at("fwd1[1]").start == doctest::Approx(7));  // after fwd0[1], upd1[0] ended long before
  // Measured, both stages idle 5 of the 7 units from a step's first forward to its last backward;
  // replayed, 2 of 4.
  CHECK(MeasuredBubble(s, 2, 1)->mean == doctest::Approx(1 - 2.0 / 7));
  CHECK(MeasuredBubble(replay, 2, 1)->mean == doctest::Approx(0.5));
  // Vertices whose predecessor never ran are left out, with everything after them.
  s.erase("bwd1[1]");
  const auto partial = copse::ml::WithoutGaps(s, 2);
  CHECK(partial.count("fwd1[1]") == 1);
  CHECK(partial.count("bwd0[1]") == 0);
  CHECK(partial.count("fwd0[2]") == 0);
}
