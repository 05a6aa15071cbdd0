#pragma once
// The parallel-layout planner behind `copse plan`: from a measured CostTable
// (ml/layer_profile.h), the step time, bubble and memory per daemon of every layout it weighs —
// data-parallel with 1, 2, 4, ... workers, and pipelines of 2..daemons stages with GPipe, 1F1B
// or interleaved 1F1B (V model chunks a daemon) schedules over 1, 2, 4, ... micro-batches — and
// the fastest layout that fits. Pure
// computation: no clock, no I/O; deterministic for a given table.
//
// Step time of a pipeline: a replay of its schedule (ScheduleOrder, InterleavedOrder) with the
// measured costs: a stage's forward (every layer's forward at the micro-batch size) and backward
// (dL/dx only: the weight gradients of every micro-batch are one product in the stage's update,
// the generator's default) each start once the vertex before it on the daemon ended plus one
// vertex gap, and once the neighbour stage's vertex they read ended plus a hop across daemons
// and the boundary tensor's bytes at the link's rate. The update follows the stage's last
// backward. Three steps are replayed; the third's length is the step time, and its bubble is
// measured as MeasuredBubble (ml/pipeline_bubble.h) measures a run's.
//
// Stage boundaries: the split minimizing Σ stage time + (M-1) × the slowest stage's time (the
// pipeline's length for M micro-batches, the objective of Alpa's inter-operator pass), found by
// dynamic programming over layers (BestSplit); every split is replayed instead when there are
// few (kExhaustiveSplits), so small models get the split the replay itself finds fastest among
// those that fit in memory (the dynamic program does not weigh memory: its split may not fit).
//
// Tensor-parallel with R members (gpt models, the table's shards): one gang on one daemon (shm
// channels) per step, each member's shard forward and backward over the whole batch plus the
// optimizer over its shard, and the calibrated rest (its all-reduces).
//
// Data-parallel with D workers (the ps reducer): each worker's forward and full backward on
// batch/D, its gradients to the update, the optimizer step over their sum, the new parameters
// back to the workers. The job manager places workers where the parameters are while that
// daemon has slots (locality), so up to slots_per_daemon workers share the update's daemon and
// hand over in memory; the others' gradients cross to it one after another on its link.
//
// The first stage's (and a worker's) backward computes no dL/dx for the model's first layer with
// parameters, and none at all for the layers before it, as Sequential's backward does.
//
// Calibration (Calibrate): what real training vertices took beyond their layers' passes, from
// short runs of them: a scale on layer passes and an overhead per vertex (and per update).
//
// Memory per daemon, an estimate: for the parameters it updates, their values, gradients, the
// update's new copy and the optimizer state (1 tensor per parameter for SGD with momentum, 2 for
// Adam); plus what a step keeps: a pipeline stage every micro-batch's stash and dL/dy until its
// update (batched weight gradients), a data-parallel worker its batch/D's stash; the
// parameter server's daemon also holds the other workers' gradients, another daemon a copy of
// the parameters and its workers' gradients.
#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"
#include "ml/cost_table.h"

namespace copse::ml {

struct PlanRequest {
  int64_t batch = 128;       // global batch per step
  int daemons = 2;           // daemons the job may use
  int slots_per_daemon = 2;  // compute vertices a daemon runs at once (its cpus / --threads)
  // Compute vertices that can run at once without sharing a core, over all daemons (0: as many
  // as they have slots). A local cluster's daemons share this machine's cores: more workers
  // than that run as much slower.
  int cores = 0;
  int64_t memory_per_daemon = 0;  // bytes a daemon offers (0: unbounded)
  std::vector<std::string> schedules = {"gpipe", "1f1b", "interleaved"};
  int virtual_stages = 2;  // model chunks per daemon of the interleaved candidates
  int max_microbatches = 32;
};

struct Layout {
  std::string kind;              // data-parallel | pipeline | tensor-parallel
  int degree = 1;                // workers (data-parallel) or stages (pipeline)
  int microbatches = 1;          // pipeline
  std::string schedule;          // pipeline: gpipe | 1f1b | interleaved
  std::vector<int> split;        // pipeline: stage boundaries [0, b1, ..., layers], degree x V stages
  int virtual_stages = 1;        // interleaved: model chunks per daemon (V)
  std::string Describe() const;  // "pipeline 2 1f1b M=8 split 0,4,7"
};

struct Prediction {
  double step_s = 0;                  // one training step
  double bubble = 0;                  // pipelines: MeasuredBubble of the replayed step
  std::vector<int64_t> memory_bytes;  // per daemon (stage or worker)
  bool fits = true;
  std::string why_not;  // when !fits: which daemon (stage) needs how much more than it has
};

struct Candidate {
  Layout layout;
  Prediction prediction;
};

struct Plan {
  std::vector<Candidate> candidates;  // every layout weighed, fastest first (those that fit first)
  int best = -1;                      // index of the fastest that fits; -1 when none fits
};

/// Every layout of `request` weighed on `table`. InvalidArgument when the request is malformed
/// (batch < 1, daemons < 1) or the table was not measured at any size the layouts need.
Result<Plan> MakePlan(const CostTable& table, const PlanRequest& request);

/// The predicted step of `layout` (its split given) on `table`.
Result<Prediction> Predict(const CostTable& table, const Layout& layout, const PlanRequest& request);

/// The split of the table's layers into `stages` minimizing Σ t_s + (microbatches - 1) × max t_s,
/// t_s a stage's forward + backward of one micro-batch of `microbatch_size` plus its boundary's
/// transfers; by dynamic programming over layers, O(stages × layers² × log layers) plus one
/// O(stages × layers²) pass per cap tried above the smallest feasible one. Stages hold at least
/// one layer. Empty when there is no such split (stages outside [1, layers], a size the table
/// lacks, a stage time that is not finite).
std::vector<int> BestSplit(const CostTable& table, int stages, int microbatches, int64_t microbatch_size);
/// That objective for one split (for tests and brute force).
double SplitObjective(const CostTable& table, const std::vector<int>& split, int microbatches, int64_t microbatch_size);

/// What the planner expects one vertex to take, without calibration: a pipeline stage's forward,
/// backward and update (layers [begin, end) at micro-batch size `mb`, M a step), and a
/// data-parallel gradient vertex over those layers (forward and full backward).
struct VertexTimes {
  double forward = 0, backward = 0, update = 0, gradient = 0;
};
VertexTimes StageVertexTimes(const CostTable& table, int begin, int end, int64_t mb, int microbatches);

/// One member's step of a tensor-parallel group of `ranks` over `batch`, without calibration: its
/// shard's forward and backward and the optimizer over its shard. InvalidArgument when the table
/// has no shards of `ranks` measured at `batch`.
Result<double> TensorParallelMemberStep(const CostTable& table, int ranks, int64_t batch);

/// One vertex of a calibration run: what the cost table predicted for it and how long it ran.
struct VertexSample {
  enum Kind { kStage, kStageUpdate, kGradient, kServerUpdate, kTensorParallel } kind;  // fwd/bwd, upd, grad, ps, tp
  double predicted = 0, measured = 0;
  int64_t microbatch = 0;  // the micro-batch size it computed on (pipeline vertices)
};
/// Calibrates the table on `samples`: pipeline forwards and backwards timed at two or more
/// micro-batch sizes are fitted by least squares as vertex_scale × predicted + vertex_overhead
/// (else scale 1 and their median excess); gradient vertices and tensor-parallel members, layer
/// passes too, get the median excess over scale × predicted; updates the median excess over
/// predicted. Never below 0; a data-parallel kind without samples takes its pipeline
/// counterpart's, tensor-parallel 0. Sets table.calibrated. InvalidArgument when `samples` has no
/// compute vertex or no update.
Status Calibrate(CostTable& table, const std::vector<VertexSample>& samples);

/// Above this many splits, a pipeline's split is BestSplit's instead of the best of all replayed.
inline constexpr int64_t kExhaustiveSplits = 2000;

}  // namespace copse::ml
