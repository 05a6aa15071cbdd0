#include "common/metrics.h"

#include <doctest/doctest.h>

namespace copse::metrics {

TEST_CASE("Metrics.TheTextFormatEscapesLabelsAndHelpAndWritesHistogramsCumulatively") {
  MetricsWriter out;
  out.Counter("copse_things_total", "Things.\nSecond line with a \\ backslash", 3);
  out.Family("copse_labelled", "gauge", "Labelled.");
  out.Sample("copse_labelled", 0.25, {{"name", "a \"quoted\"\nname\\"}});
  Histogram h({0.1, 1, 10});
  for (double v : {0.05, 0.1, 0.5, 5.0, 50.0}) h.Observe(v);
  out.Family("copse_seconds", "histogram", "Seconds.");
  out.HistogramSamples("copse_seconds", h, {{"kind", "x"}});
  const std::string text = out.Take();
  CHECK(text.find("# HELP copse_things_total Things.\\nSecond line with a \\\\ backslash\n") != std::string::npos);
  CHECK(text.find("# TYPE copse_things_total counter\ncopse_things_total 3\n") != std::string::npos);
  CHECK(text.find("copse_labelled{name=\"a \\\"quoted\\\"\\nname\\\\\"} 0.25\n") != std::string::npos);
  // An observation equal to a bound counts in that bound's bucket (le: less or equal).
  CHECK(text.find("copse_seconds_bucket{kind=\"x\",le=\"0.1\"} 2\n") != std::string::npos);
  CHECK(text.find("copse_seconds_bucket{kind=\"x\",le=\"1\"} 3\n") != std::string::npos);
  CHECK(text.find("copse_seconds_bucket{kind=\"x\",le=\"10\"} 4\n") != std::string::npos);
  CHECK(text.find("copse_seconds_bucket{kind=\"x\",le=\"+Inf\"} 5\n") != std::string::npos);
  CHECK(text.find("copse_seconds_sum{kind=\"x\"} 55.65\n") != std::string::npos);
  CHECK(text.find("copse_seconds_count{kind=\"x\"} 5\n") != std::string::npos);
}

TEST_CASE("Metrics.ExponentialBuckets") {
  const auto b = Histogram::Exponential(1e-3, 10, 4);
  REQUIRE(b.size() == 4);
  CHECK(b[0] == doctest::Approx(1e-3));
  CHECK(b[3] == doctest::Approx(1.0));
}

}  // namespace copse::metrics
