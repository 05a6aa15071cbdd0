#pragma once
// The pipeline bubble of a training run, measured from per-vertex execution spans of a
// `copse graph pipeline` job (vertices fwd<s>[r], bwd<s>[r]; r = step * M + micro-batch; updates
// upd<s>[step]), next to the GPipe/1F1B theory (p-1)/(m+p-1). Used by `copse run`'s job summary
// (spans from the job manager's trace) and by bench/ml_graph_bench (spans the programs record
// themselves).
//
// The theory holds for stages of equal cost with nothing between dependent vertices. To tell
// apart what the schedule costs from what unequal stages cost, the same measure is also taken
// on the run replayed without gaps (WithoutGaps): what remains there is the stages' own
// imbalance, and the difference to the measured bubble is what dispatch and transfers added.
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace copse::ml {

struct Span {
  double start = 0, end = 0;  // any one unit
};

struct Bubble {
  double mean = 0;                 // over stages and steps: the bubble
  std::vector<double> stage_idle;  // each stage's idle share, over steps
};

/// Per step after the first (warm-up) and per stage: 1 - (the stage's busy time in its forward
/// and backward vertices of the step) / (the step's span: first forward start to last backward
/// end over every stage); averaged over steps per stage, and over both for the mean. nullopt
/// when not even one such step is complete.
std::optional<Bubble> MeasuredBubble(const std::map<std::string, Span>& spans, int stages, int microbatches);

/// The run as it would have gone had every vertex started the moment it could: when the vertex
/// before it on its stage (in the order the stage ran them) and its predecessor on another stage
/// (fwd<s-1>[r] for fwd<s>[r], bwd<s+1>[r] for bwd<s>[r]) had ended; each lasts as long as it
/// did, and each stage's first vertex keeps its start. Spans other than fwd/bwd/upd<s>[r] of
/// stages [0, stages) are left out, and so is any vertex whose predecessors are missing.
std::map<std::string, Span> WithoutGaps(const std::map<std::string, Span>& spans, int stages);

/// (p-1)/(m+p-1).
inline double TheoreticalBubble(int stages, int microbatches) {
  return static_cast<double>(stages - 1) / static_cast<double>(microbatches + stages - 1);
}

}  // namespace copse::ml
