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
  CHECK(*MeasuredBubble(TwoStages(3), 2, 2) == doctest::Approx(0.5));
  // The first step is warm-up: one step alone measures nothing.
  CHECK(!MeasuredBubble(TwoStages(1), 2, 2).has_value());
  // An incomplete step (a missing vertex) ends the measure.
  auto spans = TwoStages(3);
  spans.erase("bwd1[5]");
  CHECK(*MeasuredBubble(spans, 2, 2) == doctest::Approx(0.5));
  CHECK(copse::ml::TheoreticalBubble(2, 8) == doctest::Approx(1.0 / 9));
}
