#include "common/metrics.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

namespace copse::metrics {
namespace {

/// Label values escape backslash, double quote and newline; HELP text backslash and newline.
std::string Escape(std::string_view text, bool quotes) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    if (c == '\\')
      out += "\\\\";
    else if (c == '\n')
      out += "\\n";
    else if (c == '"' && quotes)
      out += "\\\"";
    else
      out += c;
  }
  return out;
}

std::string Number(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  if (v == std::floor(v) && std::fabs(v) < 1e15) return fmt::format("{}", static_cast<int64_t>(v));
  return fmt::format("{}", v);  // shortest round-trip form
}

}  // namespace

Histogram::Histogram(std::vector<double> upper_bounds) : bounds_(std::move(upper_bounds)), counts_(bounds_.size() + 1, 0) {
  std::sort(bounds_.begin(), bounds_.end());
}

std::vector<double> Histogram::Exponential(double first, double factor, int count) {
  std::vector<double> bounds;
  for (int i = 0; i < count; ++i, first *= factor) bounds.push_back(first);
  return bounds;
}

void Histogram::Observe(double value) {
  const size_t bucket = std::lower_bound(bounds_.begin(), bounds_.end(), value) - bounds_.begin();
  std::lock_guard lock(mu_);
  ++counts_[bucket];
  sum_ += value;
}

Histogram::Counts Histogram::Read() const {
  std::lock_guard lock(mu_);
  Counts out{bounds_, {}, 0, sum_};
  for (size_t i = 0; i < bounds_.size(); ++i) out.cumulative.push_back(out.count += counts_[i]);
  out.count += counts_.back();
  return out;
}

void MetricsWriter::Family(std::string_view name, std::string_view type, std::string_view help) {
  text_ += fmt::format("# HELP {} {}\n# TYPE {} {}\n", name, Escape(help, false), name, type);
}

void MetricsWriter::Labelled(std::string_view name, const Labels& labels, std::string_view extra_key,
                             std::string_view extra_value) {
  text_ += name;
  if (labels.empty() && extra_key.empty()) return;
  text_ += '{';
  bool first = true;
  auto add = [&](std::string_view k, std::string_view v) {
    if (!first) text_ += ',';
    first = false;
    text_ += fmt::format("{}=\"{}\"", k, Escape(v, true));
  };
  for (const auto& [k, v] : labels) add(k, v);
  if (!extra_key.empty()) add(extra_key, extra_value);
  text_ += '}';
}

void MetricsWriter::Sample(std::string_view name, double value, const Labels& labels) {
  Labelled(name, labels, "", "");
  text_ += ' ' + Number(value) + '\n';
}

void MetricsWriter::Counter(std::string_view name, std::string_view help, double value) {
  Family(name, "counter", help);
  Sample(name, value);
}

void MetricsWriter::Gauge(std::string_view name, std::string_view help, double value) {
  Family(name, "gauge", help);
  Sample(name, value);
}

void MetricsWriter::HistogramSamples(std::string_view name, const Histogram& histogram, const Labels& labels) {
  const Histogram::Counts c = histogram.Read();
  const std::string bucket = std::string(name) + "_bucket";
  for (size_t i = 0; i < c.bounds.size(); ++i) {
    Labelled(bucket, labels, "le", Number(c.bounds[i]));
    text_ += ' ' + Number(static_cast<double>(c.cumulative[i])) + '\n';
  }
  Labelled(bucket, labels, "le", "+Inf");
  text_ += ' ' + Number(static_cast<double>(c.count)) + '\n';
  Sample(std::string(name) + "_sum", c.sum, labels);
  Sample(std::string(name) + "_count", static_cast<double>(c.count), labels);
}

}  // namespace copse::metrics
