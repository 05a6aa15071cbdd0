#pragma once
// Metrics in the Prometheus text exposition format (version 0.0.4), which Prometheus, Grafana
// Agent and VictoriaMetrics scrape from `/metrics`. Nothing here is Prometheus-specific beyond
// the text: a Histogram counts observations into fixed buckets, and a MetricsWriter writes
// families of samples (# HELP, # TYPE, then `name{label="value"} number` lines).
//
// No Debian package offers a Prometheus client for C++, and the format is a few lines of text;
// the tests read what this writes with an independent parser (Python's prometheus_client).
#include <cstdint>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace copse::metrics {

using Labels = std::vector<std::pair<std::string, std::string>>;

/// Observations counted into buckets with fixed upper bounds (the `le` labels), their sum and
/// count. Thread-safe.
class Histogram {
 public:
  explicit Histogram(std::vector<double> upper_bounds);
  /// Bounds from `first` multiplying by `factor`, `count` of them (Prometheus' ExponentialBuckets).
  static std::vector<double> Exponential(double first, double factor, int count);
  void Observe(double value);
  struct Counts {
    std::vector<double> bounds;
    std::vector<uint64_t> cumulative;  // per bound, observations <= it
    uint64_t count = 0;
    double sum = 0;
  };
  Counts Read() const;

 private:
  mutable std::mutex mu_;
  std::vector<double> bounds_;
  std::vector<uint64_t> counts_;  // per bucket (not cumulative); the last is +Inf's
  double sum_ = 0;
};

/// Builds one exposition. Each family is introduced once (Family), then its samples follow.
class MetricsWriter {
 public:
  /// `type`: "counter", "gauge" or "histogram". Names are [a-zA-Z_:][a-zA-Z0-9_:]*.
  void Family(std::string_view name, std::string_view type, std::string_view help);
  void Sample(std::string_view name, double value, const Labels& labels = {});
  /// A family of one sample.
  void Counter(std::string_view name, std::string_view help, double value);
  void Gauge(std::string_view name, std::string_view help, double value);
  /// A histogram family's samples (`name`_bucket, _sum, _count); Family first.
  void HistogramSamples(std::string_view name, const Histogram& histogram, const Labels& labels = {});
  std::string Take() { return std::move(text_); }

  /// The content type to serve the text with.
  static constexpr const char* kContentType = "text/plain; version=0.0.4; charset=utf-8";

 private:
  void Labelled(std::string_view name, const Labels& labels, std::string_view extra_key, std::string_view extra_value);
  std::string text_;
};

}  // namespace copse::metrics
