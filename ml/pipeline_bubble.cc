#include "ml/pipeline_bubble.h"

#include <algorithm>
#include <charconv>
#include <limits>
#include <utility>

namespace copse::ml {

std::optional<Bubble> MeasuredBubble(const std::map<std::string, Span>& spans, int stages, int microbatches) {
  std::vector<double> idle(static_cast<size_t>(std::max(stages, 0)), 0.0);
  int steps = 0;
  for (int64_t step = 1;; ++step) {
    double lo = std::numeric_limits<double>::max(), hi = std::numeric_limits<double>::lowest();
    std::vector<double> busy(idle.size(), 0.0);
    bool complete = true;
    for (int s = 0; s < stages && complete; ++s) {
      for (const char* kind : {"fwd", "bwd"}) {
        for (int m = 0; m < microbatches && complete; ++m) {
          auto it = spans.find(kind + std::to_string(s) + "[" + std::to_string(step * microbatches + m) + "]");
          if (it == spans.end()) {
            complete = false;
            break;
          }
          lo = std::min(lo, it->second.start);
          hi = std::max(hi, it->second.end);
          busy[static_cast<size_t>(s)] += it->second.end - it->second.start;
        }
      }
    }
    if (!complete) break;
    if (hi <= lo) continue;
    for (size_t s = 0; s < idle.size(); ++s) idle[s] += 1.0 - busy[s] / (hi - lo);
    ++steps;
  }
  if (steps == 0 || idle.empty()) return std::nullopt;
  Bubble b;
  for (double& i : idle) {
    i /= steps;
    b.mean += i / static_cast<double>(idle.size());
  }
  b.stage_idle = std::move(idle);
  return b;
}

namespace {

struct PipelineVertex {
  char kind;  // 'f', 'b' or 'u'
  int stage;
  int64_t index;
};

/// "fwd3[12]" -> {'f', 3, 12}; nullopt for any other name.
std::optional<PipelineVertex> ParseName(const std::string& name) {
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

}  // namespace

std::map<std::string, Span> WithoutGaps(const std::map<std::string, Span>& spans, int stages) {
  // Each stage's vertices in the order it ran them.
  std::vector<std::vector<std::pair<double, std::string>>> order(static_cast<size_t>(std::max(stages, 0)));
  for (const auto& [name, span] : spans) {
    auto v = ParseName(name);
    if (v && v->stage >= 0 && v->stage < stages) order[static_cast<size_t>(v->stage)].emplace_back(span.start, name);
  }
  // Predecessors: the one before on the stage, and the one on the neighbouring stage.
  std::map<std::string, std::vector<std::string>> preds;
  std::map<std::string, std::vector<std::string>> succs;
  for (auto& stage : order) {
    std::sort(stage.begin(), stage.end());
    for (size_t i = 0; i < stage.size(); ++i) {
      const std::string& name = stage[i].second;
      auto& p = preds[name];
      if (i > 0) p.push_back(stage[i - 1].second);
      const PipelineVertex v = *ParseName(name);
      const std::string idx = "[" + std::to_string(v.index) + "]";
      if (v.kind == 'f' && v.stage > 0) p.push_back("fwd" + std::to_string(v.stage - 1) + idx);
      if (v.kind == 'b' && v.stage + 1 < stages) p.push_back("bwd" + std::to_string(v.stage + 1) + idx);
    }
  }
  // Kahn's order over those edges; a vertex whose predecessor never ran is left out, and so
  // is everything after it.
  std::map<std::string, size_t> waiting;
  std::vector<std::string> ready;
  for (const auto& [name, p] : preds) {
    size_t n = 0;
    bool known = true;
    for (const auto& q : p) {
      if (!preds.count(q)) known = false;
      succs[q].push_back(name);
      ++n;
    }
    if (!known) continue;
    waiting[name] = n;
    if (n == 0) ready.push_back(name);
  }
  std::map<std::string, Span> out;
  while (!ready.empty()) {
    const std::string name = std::move(ready.back());
    ready.pop_back();
    const Span& measured = spans.at(name);
    double start = preds[name].empty() ? measured.start : std::numeric_limits<double>::lowest();
    for (const auto& q : preds[name]) start = std::max(start, out.at(q).end);
    out[name] = {start, start + (measured.end - measured.start)};
    for (const auto& s : succs[name]) {
      auto it = waiting.find(s);
      if (it != waiting.end() && --it->second == 0) ready.push_back(s);
    }
  }
  return out;
}

}  // namespace copse::ml
