#include "ml/pipeline_bubble.h"

#include <algorithm>
#include <limits>
#include <vector>

namespace copse::ml {

std::optional<double> MeasuredBubble(const std::map<std::string, Span>& spans, int stages, int microbatches) {
  double sum = 0;
  int n = 0;
  for (int64_t step = 1;; ++step) {
    double lo = std::numeric_limits<double>::max(), hi = std::numeric_limits<double>::lowest();
    std::vector<double> busy(static_cast<size_t>(stages), 0.0);
    for (int s = 0; s < stages; ++s) {
      for (const char* kind : {"fwd", "bwd"}) {
        for (int m = 0; m < microbatches; ++m) {
          auto it = spans.find(kind + std::to_string(s) + "[" + std::to_string(step * microbatches + m) + "]");
          if (it == spans.end()) return n > 0 ? std::optional<double>(sum / n) : std::nullopt;
          lo = std::min(lo, it->second.start);
          hi = std::max(hi, it->second.end);
          busy[static_cast<size_t>(s)] += it->second.end - it->second.start;
        }
      }
    }
    if (hi <= lo) continue;
    for (double b : busy) sum += 1.0 - b / (hi - lo);
    n += stages;
  }
}

}  // namespace copse::ml
