#pragma once
// The pipeline bubble of a training run, measured from per-vertex execution spans of a
// `copse graph pipeline` job (vertices fwd<s>[r], bwd<s>[r]; r = step * M + micro-batch; updates
// upd<s>[step]), next to the GPipe/1F1B theory (p-1)/(m+p-1), or (p-1)/(v*m+p-1) for interleaved
// 1F1B with v model chunks a daemon (stage s on daemon s mod p). Used by `copse run`'s job summary
// (spans from the job manager's trace) and by bench/ml_graph_bench (spans the programs record
// themselves).
//
// The theory holds for stages of equal cost with nothing between dependent vertices. To tell
// apart what the schedule costs from what unequal stages cost, the same measure is also taken
// on the run replayed without gaps (WithoutGaps): what remains there is the stages' own
// imbalance, and the difference to the measured bubble is what dispatch and transfers added.
#include <cstdint>
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

/// Per step after the first (warm-up) and per daemon: 1 - (the daemon's busy time in its
/// stages' forward and backward vertices of the step) / (the step's span: first forward start
/// to last backward end over every stage); averaged over steps per daemon, and over both for
/// the mean. Stage s runs on daemon s mod `devices` (0: as many daemons as stages, one stage
/// each); `stage_idle` has one entry per daemon. nullopt when not even one such step is complete.
std::optional<Bubble> MeasuredBubble(const std::map<std::string, Span>& spans, int stages, int microbatches, int devices = 0);

/// The run as it would have gone had every vertex started the moment it could: when the vertex
/// before it on its daemon (in the order the daemon ran them; stage s on daemon s mod
/// `devices`, 0: one stage a daemon) and its predecessor on another stage (fwd<s-1>[r] for
/// fwd<s>[r], bwd<s+1>[r] for bwd<s>[r]) had ended; each lasts as long as it did, and each
/// daemon's first vertex keeps its start. Spans other than fwd/bwd/upd<s>[r] of stages
/// [0, stages) are left out, and so is any vertex whose predecessors are missing.
std::map<std::string, Span> WithoutGaps(const std::map<std::string, Span>& spans, int stages, int devices = 0);

/// A pipeline job's vertex by its name: "fwd3[12]" -> {'f', 3, 12} (forward, backward or update
/// 'u' of stage 3; index 12: step * M + micro-batch, or the step of an update).
struct PipelineVertex {
  char kind;  // 'f', 'b' or 'u'
  int stage;
  int64_t index;
};
/// nullopt for any other name.
std::optional<PipelineVertex> ParsePipelineVertex(const std::string& name);

/// (p-1)/(m+p-1) for p daemons and m micro-batches; with v model chunks a daemon (interleaved
/// 1F1B), (p-1)/(v*m+p-1): each warm-up and cool-down slot is a chunk's work, 1/v of a stage's.
inline double TheoreticalBubble(int stages, int microbatches, int chunks = 1) {
  return static_cast<double>(stages - 1) / static_cast<double>(chunks * microbatches + stages - 1);
}

}  // namespace copse::ml
