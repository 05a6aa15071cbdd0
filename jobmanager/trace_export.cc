#include "jobmanager/trace_export.h"

#include <algorithm>
#include <map>
#include <numeric>

#include <fmt/format.h>

namespace copse::jm {

void FormatTraceEvents(const TraceSnapshot& snapshot, size_t batch, const std::function<bool(std::string_view events)>& sink) {
  const JobGraph* g = snapshot.graph.get();
  const std::pair<std::string, std::string> unknown{"?", "?"};
  auto names_of = [&](uint32_t v) -> std::pair<std::string_view, std::string_view> {
    if (g) {
      const VertexNode& node = g->vertex(VertexId(v));
      return {node.name, g->spec().stages[node.stage].name};
    }
    auto it = snapshot.names.find(v);
    const auto& names = it != snapshot.names.end() ? it->second : unknown;
    return {names.first, names.second};
  };
  std::vector<uint32_t> order(snapshot.spans.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](uint32_t a, uint32_t b) { return snapshot.spans[a].start_ms < snapshot.spans[b].start_ms; });
  std::map<uint32_t, std::vector<double>> lanes;  // per daemon: when each lane frees up
  std::string text;
  size_t in_batch = 0;
  auto add = [&](const Json& event) {
    if (in_batch) text += ',';
    text += DumpJson(event);
    if (++in_batch < batch) return true;
    const bool more = sink(text);
    text.clear();
    in_batch = 0;
    return more;
  };
  for (uint32_t i : order) {
    const auto& s = snapshot.spans[i];
    const double end = s.end_ms >= 0 ? s.end_ms : snapshot.now_ms;
    auto& free_at = lanes[s.daemon];
    size_t lane = 0;
    while (lane < free_at.size() && free_at[lane] > s.start_ms) ++lane;
    if (lane == free_at.size()) free_at.push_back(0);
    free_at[lane] = end;
    const auto [name, stage] = names_of(s.vertex);
    if (!add({{"name", name},
              {"cat", stage},
              {"ph", "X"},
              {"ts", s.start_ms * 1000},
              {"dur", (end - s.start_ms) * 1000},
              {"pid", s.daemon},
              {"tid", lane},
              {"args", {{"version", s.version}, {"outcome", s.end_ms >= 0 ? s.outcome : "running"}}}})) {
      return;
    }
  }
  for (const auto& [daemon, free_at] : lanes) {
    // A daemon that registered again (after a cut, or restarted) is a new process under its
    // old name: its registrations are told apart.
    const auto& [name, registration] =
        daemon < snapshot.daemons.size() ? snapshot.daemons[daemon] : std::pair<std::string, size_t>{"?", 0};
    if (!add({{"name", "process_name"},
              {"ph", "M"},
              {"pid", daemon},
              {"args", {{"name", "daemon " + name + (registration ? fmt::format(" (registration {})", registration) : "")}}}})) {
      return;
    }
  }
  if (in_batch) sink(text);
}

Json TraceTrailer(const TraceSnapshot& snapshot) {
  return {{"displayTimeUnit", "ms"}, {"otherData", {{"job", snapshot.job}, {"name", snapshot.name}, {"state", snapshot.state}}}};
}

Json TraceJson(const TraceSnapshot& snapshot) {
  std::string events = "[";
  FormatTraceEvents(snapshot, 4096, [&](std::string_view batch) {
    if (events.size() > 1) events += ',';
    events += batch;
    return true;
  });
  events += ']';
  Json trace = TraceTrailer(snapshot);
  trace["traceEvents"] = Json::parse(events);
  return trace;
}

}  // namespace copse::jm
