#pragma once
// The pipeline bubble of a training run, measured from per-vertex execution spans of a
// `copse graph pipeline` job (vertices fwd<s>[r], bwd<s>[r]; r = step * M + micro-batch), next
// to the GPipe/1F1B theory (p-1)/(m+p-1). Used by `copse run`'s job summary (spans from the job
// manager's trace) and by bench/ml_graph_bench (spans the programs record themselves).
#include <map>
#include <optional>
#include <string>

namespace copse::ml {

struct Span {
  double start = 0, end = 0;  // any one unit
};

/// Per step after the first (warm-up) and per stage: 1 - (the stage's busy time in its forward
/// and backward vertices of the step) / (the step's span: first forward start to last backward
/// end over every stage); the mean over them. nullopt when not even one such step is complete.
std::optional<double> MeasuredBubble(const std::map<std::string, Span>& spans, int stages, int microbatches);

/// (p-1)/(m+p-1).
inline double TheoreticalBubble(int stages, int microbatches) {
  return static_cast<double>(stages - 1) / static_cast<double>(microbatches + stages - 1);
}

}  // namespace copse::ml
