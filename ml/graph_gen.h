#pragma once
// Graph generators: training runs written as ordinary copse job files (docs/ml-graphs.md).
// Nothing in the job manager knows about ML; these only emit stages, edges and outputs that
// use the ML vertex programs (ml/programs/register.h).
//
//   GraphOptions o;  o.kind = "pipeline";  o.stages = 2;  o.microbatches = 8;
//   Result<Json> job = GenerateTrainingGraph(o);   // then write job->dump(2) to a file
//
// The graph unrolls every step: data-parallel has per step W grad vertices, a reducer and an
// update; a pipeline has per step, stage and micro-batch one forward and one backward vertex
// plus one update per stage, with the schedule (GPipe or 1F1B) as `order` edges between one
// stage's vertices. Stateless; thread-safe.
#include <cstdint>
#include <string>
#include <vector>

#include "common/json_util.h"
#include "common/status.h"
#include "ml/dataset.h"

namespace copse::ml {

struct GraphOptions {
  std::string kind = "data-parallel";  // data-parallel | pipeline | hybrid | tensor-parallel
  std::string name;                    // job name (default from the kind)
  int workers = 2;                     // data-parallel replicas (pipelines, for hybrid)
  int stages = 2;                      // pipeline stages
  int microbatches = 4;                // per step and pipeline
  std::string schedule = "1f1b";       // gpipe | 1f1b | interleaved
  // interleaved (Megatron-LM's interleaved 1F1B): each of the `stages` daemons holds this many
  // model chunks (virtual stages): chunk k of daemon d is virtual stage k * stages + d, so the
  // graph has stages * virtual_stages stages, and the bubble shrinks by that factor.
  int virtual_stages = 2;
  bool recompute = false;  // backward recomputes the forward from the stage input
  // batched: a stage's backwards compute only dL/dx and its update computes the weight
  // gradients of every micro-batch in one product (where the stage's layers allow it and
  // activations are stashed); per-microbatch: each backward accumulates them.
  std::string weight_grads = "batched";
  std::string reducer = "tree";  // tree | ring | ps (data-parallel)
  int fanin = 2;                 // tree reducer fan-in
  // Data-parallel: step t's gradients are computed on the parameters of step t - staleness (the
  // output of update t - staleness - 1, or init), and applied to step t's (PipeDream-style
  // bounded staleness). 0: synchronous. Each step's inputs are fixed by the graph, so a re-run
  // gives the same bits; a worker's step no longer waits for the update just before it.
  int staleness = 0;
  bool loader_vertices = false;  // data-parallel: a shard-loader vertex per grad vertex
  std::vector<int> split;        // pipeline stage boundaries (layer indices), or balanced
  // Tensor parallelism: members of each gang (the tensor-parallel kind's step; each forward and
  // backward of a pipeline or hybrid, making those 3-D), joined by live channels.
  int tensor_parallel = 1;
  std::string tp_channel = "shm";  // shm (a gang on one daemon) | stream (across daemons)
  // Training.
  std::string model = "mlp";
  int epochs = 1;
  int batch = 128;
  std::string optimizer = "sgd";
  double lr = 0.05, momentum = 0.9, weight_decay = 0.0;
  // constant, or cosine: linear warmup over warmup_steps, then cosine decay to min_lr at the
  // last step (WarmupCosineLr, as copse train's --lr-schedule).
  std::string lr_schedule = "constant";
  int64_t warmup_steps = 0;
  double min_lr = 0.0;
  // Clip the gradients' global L2 norm to this before each step (0: never). Not for hybrid jobs
  // (the norm of several pipelines' summed gradients is not gathered) nor a pipeline's
  // tensor-parallel members; a pipeline's stages gather their norm in a step check.
  double clip_norm = 0.0;
  // fp32, or bf16: mixed precision (ml/dtype.h), and activations and their gradients cross
  // pipeline stage boundaries in bfloat16; or fp16, with dynamic loss scaling from
  // init_loss_scale (ml/loss_scaler.h), a pipeline's stages skipping together on a step check.
  std::string precision = "fp32";
  double init_loss_scale = 65536.0;
  // cpu, or cuda: every compute vertex (gradients, forwards, backwards, reducers, updates)
  // takes a GPU (resources.gpus 1) and keeps its model, activations and gradients on it.
  std::string device = "cpu";
  uint64_t seed = 1;
  std::string data_dir = kFashionMnistDir;
  int64_t limit = -1, test_limit = -1;
  int64_t steps = -1;        // stop after this many steps (all epochs when < 0)
  int threads = 1;           // resources.cpus of compute vertices (their CPU threads)
  int daemon_cpus = 2;       // init vertices take a whole daemon so stages land on distinct daemons
  int checkpoint_every = 0;  // a checkpoint vertex per stage every K steps (0: none)
  std::string checkpoint_dir = "checkpoints";
  // Pipelines: every K-th step's update chain (parameters, optimizer state) is a mirrored
  // channel, copied into a second daemon's memory by the job manager, so that a lost stage
  // resumes from its newest copy instead of re-running from init or the last file checkpoint
  // (0: none).
  int mirror_every = 0;
  // What `copse plan` predicted for this layout (ml/planner.h): carried into metrics.json's
  // config, so that the job summary shows it next to what the run measured. Null: no plan.
  Json plan;
};

/// The job file. InvalidArgument names the flag that is wrong.
Result<Json> GenerateTrainingGraph(const GraphOptions& options);

/// The stage whose vertex t ends step t of a job generated for `kind` with `reducer` and
/// `tensor_parallel` members: a pipeline's (or hybrid's) stage-0 update "upd0" ("upd0t0" with
/// tensor-parallel stages), a data-parallel job's "ps" or "update" ("update0" for ring and nccl,
/// where each worker steps its own copy), a tensor-parallel job's member "tp0".
std::string StepEndStage(const std::string& kind, const std::string& reducer, int tensor_parallel = 1);

/// Pipeline stage boundaries [0 = b0 < b1 < ... < bP = layers] minimizing the largest stage's
/// estimated cost (3 x parameters per layer, 2 x for the first one with parameters).
Result<std::vector<int>> BalancedSplit(const std::string& model, int stages);

/// The order in which stage `s` of `stages` runs its forward (F, m) and backward (B, m)
/// vertices of one step: GPipe = all F then all B; 1F1B = min(stages-s-1, M) warm-up forwards,
/// then alternately one forward and one backward, then the remaining backwards.
std::vector<std::pair<char, int>> ScheduleOrder(const std::string& schedule, int stage, int stages, int microbatches);

/// One forward ('F') or backward ('B') of micro-batch `microbatch` on model chunk `chunk`.
struct ChunkOp {
  char kind;
  int chunk, microbatch;
  friend bool operator==(const ChunkOp&, const ChunkOp&) = default;
};
/// Interleaved 1F1B (Megatron-LM's schedule with virtual stages): the order in which daemon
/// `device` of `devices` runs one step's forwards and backwards of its `chunks` model chunks
/// (chunk k is virtual stage k * devices + device). Micro-batches go through the chunks in
/// groups of `devices`: forwards chunk 0..chunks-1, backwards chunks-1..0. Warm-up:
/// (devices - device - 1) * 2 + (chunks - 1) * devices forwards (all of them when M equals
/// `devices`), then one forward and one backward alternately, then the remaining backwards.
/// `microbatches` must be a multiple of `devices`.
std::vector<ChunkOp> InterleavedOrder(int device, int devices, int chunks, int microbatches);

}  // namespace copse::ml
