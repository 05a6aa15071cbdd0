#include "ml/pipeline_bubble.h"

#include <algorithm>
#include <charconv>
#include <limits>
#include <utility>

namespace copse::ml {

namespace {

/// The busy time of each daemon in its stages' forward and backward vertices of `step`, and the
/// step's span (first forward start to last backward end); nullopt when one of them is missing.
struct StepTimes {
  std::vector<double> busy;
  double span = 0;
};

std::optional<StepTimes> TimesOfStep(const std::map<std::string, Span>& spans, int64_t step, int stages, int microbatches,
                                     int devices) {
  StepTimes t{std::vector<double>(static_cast<size_t>(devices), 0.0), 0};
  double lo = std::numeric_limits<double>::max(), hi = std::numeric_limits<double>::lowest();
  for (int s = 0; s < stages; ++s) {
    for (const char* kind : {"fwd", "bwd"}) {
      for (int m = 0; m < microbatches; ++m) {
        auto it = spans.find(kind + std::to_string(s) + "[" + std::to_string(step * microbatches + m) + "]");
        if (it == spans.end()) return std::nullopt;
        lo = std::min(lo, it->second.start);
        hi = std::max(hi, it->second.end);
        t.busy[static_cast<size_t>(s % devices)] += it->second.end - it->second.start;
      }
    }
  }
  t.span = hi - lo;
  return t;
}

}  // namespace

std::optional<Bubble> MeasuredBubble(const std::map<std::string, Span>& spans, int stages, int microbatches, int devices) {
  if (stages < 1) return std::nullopt;
  if (devices <= 0 || devices > stages) devices = stages;
  std::vector<double> idle(static_cast<size_t>(devices), 0.0);
  int steps = 0;
  for (int64_t step = 1;; ++step) {
    auto t = TimesOfStep(spans, step, stages, microbatches, devices);
    if (!t) break;
    if (t->span <= 0) continue;
    for (size_t s = 0; s < idle.size(); ++s) idle[s] += 1.0 - t->busy[s] / t->span;
    ++steps;
  }
  if (steps == 0) return std::nullopt;
  Bubble b;
  for (double& i : idle) {
    i /= steps;
    b.mean += i / static_cast<double>(idle.size());
  }
  b.stage_idle = std::move(idle);
  return b;
}

std::optional<PipelineVertex> ParsePipelineVertex(const std::string& name) {
  if (name.size() < 6 || name.back() != ']') return std::nullopt;
  const std::string kind = name.substr(0, 3);
  if (kind != "fwd" && kind != "bwd" && kind != "upd") return std::nullopt;
  const size_t open = name.find('[');
  if (open == std::string::npos || open == 3) return std::nullopt;
  PipelineVertex v{kind[0], 0, 0};
  const char* end = name.data() + name.size() - 1;
  auto [p1, e1] = std::from_chars(name.data() + 3, name.data() + open, v.stage);
  auto [p2, e2] = std::from_chars(name.data() + open + 1, end, v.index);
  if (e1 != std::errc() || p1 != name.data() + open || e2 != std::errc() || p2 != end) return std::nullopt;
  return v;
}

std::map<std::string, Span> WithoutGaps(const std::map<std::string, Span>& spans, int stages, int devices) {
  if (devices <= 0 || devices > stages) devices = stages;
  // Each daemon's vertices in the order it ran them.
  struct Ran {
    double start;
    PipelineVertex v;
    const std::string* name;
  };
  std::vector<std::vector<Ran>> order(static_cast<size_t>(std::max(devices, 0)));
  for (const auto& [name, span] : spans) {
    auto v = ParsePipelineVertex(name);
    if (!v || v->stage < 0 || v->stage >= stages) continue;
    order[static_cast<size_t>(v->stage % devices)].push_back({span.start, *v, &name});
  }
  // Predecessors: the one before on the daemon, and the one on the neighbouring stage.
  std::map<std::string, std::vector<std::string>> preds, succs;
  for (auto& stage : order) {
    std::sort(stage.begin(), stage.end(), [](const Ran& a, const Ran& b) { return a.start < b.start; });
    for (size_t i = 0; i < stage.size(); ++i) {
      const PipelineVertex& v = stage[i].v;
      auto& p = preds[*stage[i].name];
      if (i > 0) p.push_back(*stage[i - 1].name);
      const std::string idx = "[" + std::to_string(v.index) + "]";
      if (v.kind == 'f' && v.stage > 0) p.push_back("fwd" + std::to_string(v.stage - 1) + idx);
      if (v.kind == 'b' && v.stage + 1 < stages) p.push_back("bwd" + std::to_string(v.stage + 1) + idx);
      for (const auto& q : p) succs[q].push_back(*stage[i].name);
    }
  }
  // Kahn's order over those edges; a vertex whose predecessor never ran is left out, and so
  // is everything after it.
  std::map<std::string, size_t> waiting;
  std::vector<std::string> ready;
  for (const auto& [name, p] : preds) {
    if (std::any_of(p.begin(), p.end(), [&](const std::string& q) { return !preds.count(q); })) continue;
    waiting[name] = p.size();
    if (p.empty()) ready.push_back(name);
  }
  std::map<std::string, Span> out;
  while (!ready.empty()) {
    const std::string name = std::move(ready.back());
    ready.pop_back();
    const Span& measured = spans.at(name);
    const auto& p = preds.at(name);
    double start = p.empty() ? measured.start : std::numeric_limits<double>::lowest();
    for (const auto& q : p) start = std::max(start, out.at(q).end);
    out[name] = {start, start + (measured.end - measured.start)};
    for (const auto& s : succs[name]) {
      auto it = waiting.find(s);
      if (it != waiting.end() && --it->second == 0) ready.push_back(s);
    }
  }
  return out;
}

}  // namespace copse::ml
