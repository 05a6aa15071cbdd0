#include "ml/graph_gen.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <set>

#include "ml/loss_scaler.h"
#include "ml/models.h"
#include "ml/text_corpus.h"
#include "ml/transformer.h"
#include "ml/programs/support.h"  // the limits the programs check: jobs written here must pass them

namespace copse::ml {
namespace {

std::string V(const std::string& stage, int64_t replica) { return stage + "[" + std::to_string(replica) + "]"; }

/// Collects stages and edges; output port numbers are handed out per vertex in call order
/// unless given.
class JobBuilder {
 public:
  /// `durable_dir`: where the job keeps its durable channels' copies (relative to the job file).
  explicit JobBuilder(std::string durable_dir) : durable_dir_(std::move(durable_dir)) {}
  /// `retain`: output ports kept until the job ends, so recovery of a lost daemon re-runs only
  /// the lost stage's work from its neighbours' retained outputs.
  void Stage(const std::string& name, const std::string& program, int64_t replicas, Json params, double cpus,
             const std::string& affinity = "", std::vector<int> retain = {}) {
    Json st = {{"name", name},
               {"program", program},
               {"replicas", replicas},
               {"params", std::move(params)},
               {"resources", {{"cpus", cpus}}}};
    if (!affinity.empty()) st["affinity"] = affinity;
    if (!retain.empty()) st["retain"] = retain;
    stages_.push_back(std::move(st));
  }
  /// A live channel (`stream`, `shm`) between two members of a gang.
  void LiveEdge(const std::string& from, int from_port, const std::string& to, int to_port, const std::string& channel) {
    edges_.push_back({{"from", from}, {"to", to}, {"from_port", from_port}, {"to_port", to_port}, {"channel", channel}});
  }
  /// Gives the last stage added `gpus` GPUs per vertex.
  void Gpus(int gpus) { stages_.back()["resources"]["gpus"] = gpus; }
  /// With --device cuda, the last stage added (a compute stage: its vertices hold a model, a
  /// batch or gradients) takes a GPU per vertex of at least `gpu_memory_mb` and computes on it
  /// (params.device).
  void ComputeOn(const std::string& device, int64_t gpu_memory_mb) {
    if (device == "cpu") return;
    Gpus(1);
    stages_.back()["resources"]["gpu_memory_mb"] = gpu_memory_mb;
    stages_.back()["params"]["device"] = device;
  }
  /// An `nccl` edge: joins `from` and `to` into one gang's NCCL group.
  void NcclEdge(const std::string& from, int from_port, const std::string& to, int to_port) {
    edges_.push_back({{"from", from}, {"to", to}, {"from_port", from_port}, {"to_port", to_port}, {"channel", "nccl"}});
  }
  /// A data edge from `from` (output `from_port`, or the next free one when < 0) to input
  /// `to_port` of `to`. Output 0 of a Durable vertex is read by all its consumers.
  void Edge(const std::string& from, int from_port, const std::string& to, int to_port) {
    const bool durable = durable_.count(from) && from_port <= 0, mirrored = mirrored_.count(from) && from_port <= 0;
    if (durable || mirrored) from_port = 0;
    if (from_port < 0) from_port = next_out_[from]++;
    edges_.push_back({{"from", from},
                      {"to", to},
                      {"from_port", from_port},
                      {"to_port", to_port},
                      {"channel", durable    ? "durable"
                                  : mirrored ? "mirrored"
                                             : "memory"}});
    data_pairs_.insert({from, to});
  }
  /// Output 0 of `v` becomes a durable channel (a copy under durable_dir that outlives its
  /// daemon, where recovery stops), and every later edge from `v` without a port reads it.
  void Durable(const std::string& v) { durable_.insert(v); }
  /// The same with a mirrored channel: the copy lives in another daemon's memory.
  void Mirrored(const std::string& v) { mirrored_.insert(v); }
  /// Reserves output ports [0, n) of `v` (their edges come later with explicit ports).
  void Reserve(const std::string& v, int n) { next_out_[v] = std::max(next_out_[v], n); }
  int NextPort(const std::string& v) { return next_out_[v]++; }
  /// `to` starts after `from` completed, unless a data edge already says so.
  void Order(const std::string& from, const std::string& to) {
    if (data_pairs_.count({from, to})) return;
    edges_.push_back({{"from", from}, {"to", to}, {"channel", "order"}});
  }
  Json Finish(const std::string& name, const std::string& description, Json outputs) {
    Json job = {{"version", 1},
                {"name", name},
                {"description", description},
                {"defaults", {{"channel", "memory"}, {"max_attempts", 4}}},
                {"stages", stages_},
                {"edges", edges_},
                {"outputs", std::move(outputs)}};
    if (!durable_.empty()) job["durable_dir"] = durable_dir_;
    return job;
  }

 private:
  std::string durable_dir_;
  std::set<std::string> durable_, mirrored_;
  Json stages_ = Json::array(), edges_ = Json::array();
  std::map<std::string, int> next_out_;
  std::set<std::pair<std::string, std::string>> data_pairs_;
};

/// With --device cuda, what a stage's compute vertices need of their GPU's memory
/// (resources.gpu_memory_mb), estimated from the model itself: per layer its parameters and what
/// one example's forward stashes (measured by running one, on the CPU, in the job's precision).
/// For layers [begin, end) holding `rows` examples' activations at once:
///   512 MB (CUDA's context, cuBLAS's workspace, the allocator's slack)
///   + parameters x 4 bytes x (value, gradient, optimizer slots) x 2 (a step's new tensors are
///     made while the old ones are still read) + their bfloat16 copies in bf16
///   + stash bytes per example x rows x 2 (the gradients beside them).
/// The scheduler places by it and refuses a stage no daemon's GPU can hold (docs/ml-graphs.md).
class GpuMemoryModel {
 public:
  static Result<GpuMemoryModel> Of(const GraphOptions& o) {
    GpuMemoryModel m;
    COPSE_ASSIGN_OR_RETURN(Sequential model, BuildModel(o.model, o.seed));
    COPSE_ASSIGN_OR_RETURN(Precision precision, ParsePrecision(o.precision));
    Shape example = {1, 1, 28, 28};
    if (IsLanguageModel(o.model)) {
      COPSE_ASSIGN_OR_RETURN(GptSpec spec, ParseGptSpec(o.model));
      example = {1, spec.context};
    }
    Stash stash;
    ForwardContext fc;
    fc.precision = precision;
    COPSE_RETURN_NOT_OK(model.Forward(Tensor::Zeros(example), fc, &stash).status());
    for (size_t i = 0; i < model.size(); ++i) {
      int64_t params = 0, stashed = 0;
      for (const Parameter& p : model.layer(i).parameters()) params += p.value.numel();
      for (const Tensor& t : stash.layers[i].tensors) stashed += t.defined() ? static_cast<int64_t>(t.bytes()) : 0;
      m.params_.push_back(params);
      m.stash_bytes_.push_back(stashed);
    }
    m.slots_ = o.optimizer == "sgd" ? (o.momentum > 0 ? 1 : 0) : 2;
    m.bf16_ = precision == Precision::kBFloat16;
    return m;
  }

  int layers() const { return static_cast<int>(params_.size()); }

  int64_t Mb(int begin, int end, int64_t rows) const {
    int64_t params = 0, stash = 0;
    for (int i = std::max(begin, 0); i < std::min(end, layers()); ++i)  // none for a CPU job's empty model
      params += params_[static_cast<size_t>(i)], stash += stash_bytes_[static_cast<size_t>(i)];
    const int64_t bytes = (int64_t{512} << 20) + params * 4 * (2 + slots_) * 2 + (bf16_ ? params * 2 : 0) + stash * rows * 2;
    return (bytes + (int64_t{1} << 20) - 1) >> 20;
  }

 private:
  std::vector<int64_t> params_, stash_bytes_;
  int slots_ = 0;
  bool bf16_ = false;
};

/// The model's GPU memory estimate when the job computes on GPUs (else unused).
Result<GpuMemoryModel> GpuMemoryOf(const GraphOptions& o) {
  if (o.device == "cpu") return GpuMemoryModel();
  return GpuMemoryModel::Of(o);
}

/// What a generated job may expand to: a fifth of the job manager's 50,000,000-vertex limit,
/// since each vertex also carries its params and channels.
constexpr int64_t kMaxGraphVertices = 10'000'000;

Status Check(const GraphOptions& o) {
  auto bad = [](const std::string& flag, const std::string& want) {
    return Status::InvalidArgument(flag + ": expected " + want);
  };
  if (o.kind != "data-parallel" && o.kind != "pipeline" && o.kind != "hybrid" && o.kind != "tensor-parallel")
    return bad("kind", "data-parallel, pipeline, hybrid or tensor-parallel");
  if (o.kind == "tensor-parallel" && o.tensor_parallel < 2) return bad("--tensor-parallel", "2..16 for a tensor-parallel job");
  if (o.tensor_parallel > 1) {
    if (o.tensor_parallel > 16) return bad("--tensor-parallel", "1..16");
    if (o.kind == "data-parallel") return bad("--tensor-parallel", "1 for data-parallel (hybrid --stages 1 combines them)");
    if (o.tp_channel != "shm" && o.tp_channel != "stream") return bad("--tp-channel", "shm or stream");
    COPSE_RETURN_NOT_OK(BuildModelShardLayers(o.model, 0, o.tensor_parallel).status());
  }
  if (o.workers < 1 || o.workers > 64) return bad("--workers", "1..64");
  if (o.stages < 1 || o.stages > 64) return bad("--stages", "1..64");
  if (o.microbatches < 1 || o.microbatches > 256) return bad("--microbatches", "1..256");
  if (o.schedule != "gpipe" && o.schedule != "1f1b" && o.schedule != "interleaved")
    return bad("--schedule", "gpipe, 1f1b or interleaved");
  if (o.schedule == "interleaved" && o.kind != "data-parallel" && o.kind != "tensor-parallel") {
    if (o.virtual_stages < 2 || o.virtual_stages > 16) return bad("--virtual-stages", "2..16 with --schedule interleaved");
    if (o.stages < 2) return bad("--schedule interleaved", "--stages >= 2");
    if (o.microbatches % o.stages != 0)
      return bad("--microbatches", "a multiple of --stages (" + std::to_string(o.stages) + ") with --schedule interleaved");
    if (o.tensor_parallel > 1) return bad("--schedule interleaved", "--tensor-parallel 1");
  }
  if (o.weight_grads != "batched" && o.weight_grads != "per-microbatch")
    return bad("--weight-grads", "batched or per-microbatch");
  if (o.reducer != "tree" && o.reducer != "ring" && o.reducer != "ps" && o.reducer != "nccl")
    return bad("--reducer", "tree, ring, ps or nccl");
  if ((o.reducer == "ring" || o.reducer == "nccl") && o.workers < 2) return bad("--reducer " + o.reducer, "--workers >= 2");
  if (o.reducer == "nccl" && o.kind != "data-parallel") return bad("--reducer nccl", "data-parallel");
  if (o.fanin < 2) return bad("--fanin", ">= 2");
  if (o.staleness < 0 || o.staleness > 64) return bad("--staleness", "0..64");
  if (o.staleness > 0 && o.kind != "data-parallel") return bad("--staleness", "0 for " + o.kind + " jobs (data-parallel only)");
  if (o.staleness > 0 && o.precision == "fp16")
    return bad("--staleness", "0 with --precision fp16 (a stale gradient's loss scale is not the update's)");
  if (o.device != "cpu" && o.device != "cuda") return bad("--device", "cpu or cuda");
  if (o.epochs < 1) return bad("--epochs", ">= 1");
  if (o.batch < 1 || o.batch > programs::kMaxBatch) return bad("--batch", "1.." + std::to_string(programs::kMaxBatch));
  if (o.kind != "tensor-parallel") {
    // Every worker's every micro-batch needs an image (an empty one has nothing to train on).
    const int64_t parts = int64_t{o.kind == "pipeline" ? 1 : o.workers} * (o.kind == "data-parallel" ? 1 : o.microbatches);
    if (o.batch < parts) {
      return bad("--batch", ">= " + std::to_string(parts) + " (an image for each of the " + std::to_string(parts) +
                                " workers x micro-batches)");
    }
  }
  if (!(o.weight_decay >= 0) || !std::isfinite(o.weight_decay)) return bad("--weight-decay", "a finite number >= 0");
  if (o.optimizer != "sgd" && o.optimizer != "adam" && o.optimizer != "adamw") return bad("--optimizer", "sgd, adam or adamw");
  if (!(o.lr > 0) || !std::isfinite(o.lr)) return bad("--lr", "a finite number > 0");
  if (o.lr_schedule != "constant" && o.lr_schedule != "cosine") return bad("--lr-schedule", "constant or cosine");
  if (o.warmup_steps < 0) return bad("--warmup-steps", ">= 0");
  if (!(o.min_lr >= 0 && o.min_lr <= o.lr)) return bad("--min-lr", "a number in [0, --lr]");
  if (!(o.clip_norm >= 0) || !std::isfinite(o.clip_norm)) return bad("--clip-norm", "a finite number >= 0");
  if (o.clip_norm > 0 && o.kind == "hybrid")
    return bad("--clip-norm", "0 for hybrid jobs (the norm of several pipelines' summed gradients is not gathered)");
  if (o.clip_norm > 0 && o.kind == "pipeline" && o.tensor_parallel > 1)
    return bad("--clip-norm", "0 for a pipeline of tensor-parallel stages (its step check spans one member per stage)");
  if (!(o.momentum >= 0 && o.momentum < 1)) return bad("--momentum", "[0, 1)");
  if (auto p = ParsePrecision(o.precision); !p.ok()) return p.status().WithContext("--precision");
  if (o.precision == "fp16" && o.kind != "data-parallel" && o.kind != "tensor-parallel" && o.tensor_parallel > 1)
    return bad("--precision fp16",
               "--tensor-parallel 1 in a pipeline (its stages' step check spans one member per stage, not the shards)");
  if (!(o.init_loss_scale > 0) || !std::isfinite(o.init_loss_scale)) return bad("--init-loss-scale", "a finite number > 0");
  if (o.init_loss_scale != LossScale::kInitial && o.precision != "fp16")
    return bad("--init-loss-scale", "the default with --precision " + o.precision + " (it is fp16's)");
  if (o.limit == 0) return bad("--limit", "> 0 (or absent)");
  if (o.steps == 0) return bad("--steps", "> 0 (or absent)");
  if (o.threads < 1) return bad("--threads", ">= 1");
  if (o.checkpoint_every < 0) return bad("--checkpoint-every", ">= 0");
  if (o.mirror_every < 0) return bad("--mirror-every", ">= 0");
  if (o.mirror_every > 0 && o.kind != "pipeline" && o.kind != "hybrid")
    return bad("--mirror-every", "0 for " + o.kind + " jobs (pipeline and hybrid only)");
  return Status::OK();
}

Json CommonParams(const GraphOptions& o) {
  Json p = {{"model", o.model},         {"seed", o.seed}, {"data_dir", o.data_dir}, {"batch", o.batch},
            {"optimizer", o.optimizer}, {"lr", o.lr},     {"momentum", o.momentum}, {"weight_decay", o.weight_decay}};
  if (o.limit > 0) p["limit"] = o.limit;
  if (o.test_limit > 0) p["test_limit"] = o.test_limit;
  if (o.clip_norm > 0) p["clip_norm"] = o.clip_norm;
  if (o.precision != "fp32") p["precision"] = o.precision;
  if (o.init_loss_scale != LossScale::kInitial) p["loss_scale"] = o.init_loss_scale;
  if (o.lr_schedule != "constant") {
    p["lr_schedule"] = o.lr_schedule;
    p["warmup_steps"] = o.warmup_steps;
    p["min_lr"] = o.min_lr;
  }
  return p;
}

Json With(Json base, const Json& extra) {
  for (auto it = extra.begin(); it != extra.end(); ++it) base[it.key()] = it.value();
  return base;
}

Result<int64_t> TrainSize(const GraphOptions& o) {
  if (IsLanguageModel(o.model)) {  // text windows
    COPSE_ASSIGN_OR_RETURN(GptSpec spec, ParseGptSpec(o.model));
    COPSE_ASSIGN_OR_RETURN(Dataset train, LoadTextSplit(o.data_dir, Split::kTrain, spec.context, o.limit));
    // eval reads the validation windows after the last step: a text too short for them is
    // refused now, not after the whole job has trained.
    COPSE_RETURN_NOT_OK(LoadTextSplit(o.data_dir, Split::kTest, spec.context, o.test_limit).status());
    return train.size();
  }
  DatasetOptions d;
  d.limit = o.limit;
  COPSE_ASSIGN_OR_RETURN(Dataset train, LoadFashionMnist(o.data_dir, Split::kTrain, d));
  return train.size();
}

/// Whether a pipeline's stages check each step's gradients together (see Pipeline).
bool StepChecked(const GraphOptions& o) { return o.precision == "fp16" || o.clip_norm > 0; }

/// Whether step t (0-based) is checkpointed: every K-th and the last.
bool IsCheckpointStep(const GraphOptions& o, int64_t t, int64_t steps) {
  return o.checkpoint_every > 0 && ((t + 1) % o.checkpoint_every == 0 || t + 1 == steps);
}

/// The update of a checkpoint step writes its chain to a durable channel (output 0) that the
/// next step's vertices, the checkpoint vertex and eval all read: a lost stage resumes from it
/// instead of re-running its history from init. Called before any edge leaves the update.
void MarkCheckpoint(JobBuilder& b, const GraphOptions& o, const std::string& update, int64_t t, int64_t steps) {
  if (IsCheckpointStep(o, t, steps)) {
    b.Durable(update);
  } else if (o.mirror_every > 0 && (t + 1) % o.mirror_every == 0) {  // a copy in a second daemon's memory
    b.Mirrored(update);
  }
}

Json Config(const GraphOptions& o, int64_t steps) {
  Json c = {{"kind", o.kind}, {"model", o.model}, {"batch", o.batch}, {"steps", steps}, {"epochs", o.epochs}};
  if (o.tensor_parallel > 1) {
    c["tensor_parallel"] = o.tensor_parallel;
    c["tp_channel"] = o.tp_channel;
  }
  if (!o.plan.is_null()) c["plan"] = o.plan;
  if (o.kind == "tensor-parallel") return c;
  if (o.kind != "pipeline") c["workers"] = o.workers;
  if (o.kind == "data-parallel") c["reducer"] = o.reducer;
  if (o.staleness > 0) c["staleness"] = o.staleness;
  if (o.mirror_every > 0) c["mirror_every"] = o.mirror_every;
  if (o.device != "cpu") c["device"] = o.device;
  if (o.kind != "data-parallel") {
    c["stages"] = o.stages;
    c["microbatches"] = o.microbatches;
    c["schedule"] = o.schedule;
    if (o.schedule == "interleaved") c["virtual_stages"] = o.virtual_stages;
    c["recompute"] = o.recompute;
    c["weight_grads"] = StepChecked(o) ? "per-microbatch" : o.weight_grads;
  }
  return c;
}

Json UpdateParams(const Json& common, int begin, int end, int64_t steps) {
  return With(common, {{"begin", begin}, {"end", end}, {"steps", steps}});
}

/// A data-parallel update is on the critical path with nothing beside it on its daemon (the
/// next step's gradient vertices wait for its parameters, chained on its slots): it takes the
/// whole daemon for its memory-bound loops. A pipeline stage's update is not alone on its host
/// when stages share one: it overlaps the other stages' last backwards and updates, so it runs
/// on --threads like the stage's other vertices (1F1B M=8 with two daemons on two cores: a
/// two-thread update contended with the other stage's, 1.07x slower in five A/B pairs).
double DataParallelUpdateCpus(const GraphOptions& o) { return std::max<double>(o.threads, o.daemon_cpus); }
double PipelineUpdateCpus(const GraphOptions& o) { return o.threads; }

/// Per-stage checkpoint vertices: replica i writes the durable chain of the i-th checkpoint
/// step's update to a file of its own.
void AddCheckpoints(JobBuilder& b, const GraphOptions& o, const std::string& update_stage, const std::string& name,
                    int64_t steps) {
  std::vector<int64_t> ckpts;
  for (int64_t t = 0; t < steps; ++t)
    if (IsCheckpointStep(o, t, steps)) ckpts.push_back(t);
  if (ckpts.empty()) return;
  b.Stage(name, "ml.checkpoint", static_cast<int64_t>(ckpts.size()), {{"path", o.checkpoint_dir + "/" + name + "-{replica}.bin"}},
          0.1);
  for (size_t i = 0; i < ckpts.size(); ++i) {
    MarkCheckpoint(b, o, V(update_stage, ckpts[i]), ckpts[i], steps);
    b.Edge(V(update_stage, ckpts[i]), 0, V(name, static_cast<int64_t>(i)), 0);
  }
}

// ---- data-parallel ------------------------------------------------------------------------

/// A data-parallel job's update stage (one per worker, numbered, when `replicated`).
std::string UpdatePrefix(const std::string& reducer) { return reducer == "ps" ? "ps" : "update"; }
bool Replicated(const std::string& reducer) { return reducer == "ring" || reducer == "nccl"; }

/// Member r's stage of a tensor-parallel job.
std::string MemberStage(int r) { return "tp" + std::to_string(r); }

Result<Json> DataParallel(const GraphOptions& o, int64_t steps, int64_t train_images) {
  JobBuilder b(o.checkpoint_dir + "/durable");
  const Json common = CommonParams(o);
  const int W = o.workers;
  const bool ring = o.reducer == "ring", nccl = o.reducer == "nccl";
  const bool replicated = Replicated(o.reducer);  // every worker steps its own copy of the parameters
  const std::string upd_prefix = UpdatePrefix(o.reducer);
  COPSE_ASSIGN_OR_RETURN(const GpuMemoryModel gpu, GpuMemoryOf(o));
  // Workers sharing a GPU hold their activations at once: the whole batch's, at most.
  const int64_t gpu_mb = gpu.Mb(0, gpu.layers(), o.batch);
  b.Stage("init", "ml.init", 1, With(common, {{"clock", true}, {"chain_ports", replicated ? W : 1}}), o.daemon_cpus);
  for (int w = 0; w < W; ++w) {
    Json gp = With(common, {{"workers", W}, {"worker", w}, {"loader", o.loader_vertices}});
    if (o.loader_vertices)
      b.Stage("load" + std::to_string(w), "ml.load", steps, With(common, {{"workers", W}, {"worker", w}}), 0.1);
    b.Stage("grad" + std::to_string(w), "ml.grad", steps, gp, o.threads, replicated ? "w" + std::to_string(w) : "");
    b.ComputeOn(o.device, gpu_mb);
  }
  // Updates: one per step ("params" affinity), or with a ring or NCCL one per worker and step.
  const int U = replicated ? W : 1;
  auto upd = [&](int w) { return replicated ? upd_prefix + std::to_string(w) : upd_prefix; };
  for (int w = 0; w < U; ++w) {
    b.Stage(upd(w), o.reducer == "ps" ? "ml.ps" : "ml.update", steps, UpdateParams(common, 0, -1, steps),
            DataParallelUpdateCpus(o), replicated ? "w" + std::to_string(w) : "params");
    b.ComputeOn(o.device, gpu_mb);
  }
  // Reducers.
  const int rounds = 2 * (W - 1);
  std::vector<std::vector<int>> levels;  // tree: nodes per level, as counts of children
  int tree_nodes = 0;
  if (o.reducer == "tree") {
    int n = W;
    do {
      const int nodes = (n + o.fanin - 1) / o.fanin;
      levels.push_back({n, nodes});
      tree_nodes += nodes;
      n = nodes;
    } while (n > 1);
    b.Stage("reduce", "ml.reduce", steps * tree_nodes, Json::object(), 0.5);
    b.ComputeOn(o.device, gpu_mb);  // sums the workers' gradients where they are
  } else if (ring) {
    for (int w = 0; w < W; ++w)
      b.Stage("ring" + std::to_string(w), "ml.ring_reduce", steps * rounds, {{"workers", W}, {"worker", w}}, 0.5,
              "w" + std::to_string(w));
  } else if (nccl) {  // per step a gang of W all-reduce vertices, one GPU each
    for (int w = 0; w < W; ++w) {
      b.Stage("allreduce" + std::to_string(w), "ml.allreduce", steps, Json::object(), 0.5, "w" + std::to_string(w));
      b.Gpus(1);
    }
  }
  for (int64_t t = 0; t < steps; ++t) {
    for (int w = 0; w < U; ++w) {  // the chain: init's outputs 0..U-1, or output 0 of the last update
      const std::string prev = t == 0 ? "init" : V(upd(w), t - 1);
      if (t > 0) MarkCheckpoint(b, o, prev, t - 1, steps);
      b.Edge(prev, t == 0 ? w : 0, V(upd(w), t), 0);
      if (t > 0) b.Reserve(prev, 1);
    }
    if (t == 0) b.Reserve("init", U);
    for (int w = 0; w < W; ++w) {
      const std::string g = V("grad" + std::to_string(w), t);
      const int64_t from = t - o.staleness;  // the step whose parameters it computes on
      const std::string src = from <= 0 ? "init" : V(upd(replicated ? w : 0), from - 1);
      b.Edge(src, -1, g, 0);
      if (o.loader_vertices) b.Edge(V("load" + std::to_string(w), t), 0, g, 1);
    }
    if (o.reducer == "ps") {
      for (int w = 0; w < W; ++w) b.Edge(V("grad" + std::to_string(w), t), 0, V(upd(0), t), 1 + w);
    } else if (o.reducer == "tree") {
      std::vector<std::string> inputs;
      for (int w = 0; w < W; ++w) inputs.push_back(V("grad" + std::to_string(w), t));
      int64_t node = t * tree_nodes;
      for (const auto& level : levels) {
        std::vector<std::string> next;
        for (int i = 0; i < level[1]; ++i) {
          const std::string r = V("reduce", node++);
          for (int c = i * o.fanin, port = 0; c < std::min(level[0], (i + 1) * o.fanin); ++c, ++port)
            b.Edge(inputs[static_cast<size_t>(c)], 0, r, port);
          next.push_back(r);
        }
        inputs = std::move(next);
      }
      b.Edge(inputs[0], 0, V(upd(0), t), 1);
    } else if (nccl) {  // rank 0's nccl channels to the others make the step's gang
      for (int w = 0; w < W; ++w) {
        const std::string r = V("allreduce" + std::to_string(w), t);
        b.Edge(V("grad" + std::to_string(w), t), 0, r, 0);
        b.Edge(r, 0, V(upd(w), t), 1);
        if (w > 0) b.NcclEdge(V("allreduce0", t), 1, r, 1);
      }
    } else {  // ring: round k of worker w reads its own buffer and its left neighbour's send
      for (int k = 0; k < rounds; ++k) {
        for (int w = 0; w < W; ++w) {
          const int left = (w + W - 1) % W;
          const std::string r = V("ring" + std::to_string(w), t * rounds + k);
          if (k == 0) {
            b.Edge(V("grad" + std::to_string(w), t), -1, r, 0);
            b.Edge(V("grad" + std::to_string(left), t), -1, r, 1);
          } else {
            b.Edge(V("ring" + std::to_string(w), t * rounds + k - 1), 0, r, 0);
            b.Edge(V("ring" + std::to_string(left), t * rounds + k - 1), 1, r, 1);
          }
        }
      }
      for (int w = 0; w < W; ++w) b.Edge(V("ring" + std::to_string(w), t * rounds + rounds - 1), 0, V(upd(w), t), 1);
    }
  }
  for (int w = 0; w < U; ++w) AddCheckpoints(b, o, upd(w), "ckpt" + (replicated ? std::to_string(w) : std::string()), steps);
  b.Stage("eval", "ml.eval", 1, With(common, {{"clock", true}, {"train_images", train_images}, {"config", Config(o, steps)}}),
          o.threads);
  b.Edge("init", b.NextPort("init"), "eval", 0);
  b.Edge(V(upd(0), steps - 1), 0, "eval", 1);
  const std::string name = o.name.empty() ? "dp" + std::to_string(W) + "-" + o.reducer : o.name;
  Json outputs = Json::array(
      {{{"from", "eval"}, {"port", 0}, {"path", "metrics.json"}}, {{"from", "eval"}, {"port", 1}, {"path", "params.bin"}}});
  return b.Finish(name,
                  "data-parallel training of " + o.model + " on " + std::to_string(W) + " workers (" + o.reducer +
                      " reducer), generated by copse graph",
                  std::move(outputs));
}

// ---- tensor-parallel -----------------------------------------------------------------------

/// Per step a gang of R ml.tp_step vertices, one per member ("tp0".."tp{R-1}", one replica per
/// step), joined every one to every other by live channels; each member's chain runs from its
/// init through its steps to eval, which joins the shards.
Result<Json> TensorParallel(const GraphOptions& o, int64_t steps, int64_t train_images) {
  JobBuilder b(o.checkpoint_dir + "/durable");
  const Json common = CommonParams(o);
  const int R = o.tensor_parallel;
  COPSE_ASSIGN_OR_RETURN(const GpuMemoryModel gpu, GpuMemoryOf(o));
  auto member = MemberStage;
  auto init = [](int r) { return "init" + std::to_string(r); };
  for (int r = 0; r < R; ++r) {
    const Json tp = {{"tensor_parallel", R}, {"tp_rank", r}};
    b.Stage(init(r), "ml.init", 1, With(With(common, tp), {{"clock", r == 0}}), 1);
    b.Stage(member(r), "ml.tp_step", steps, With(With(common, tp), {{"steps", steps}}), o.threads);
    b.ComputeOn(o.device, gpu.Mb(0, gpu.layers(), o.batch));  // a whole model's worth: a shard needs less
  }
  for (int64_t t = 0; t < steps; ++t) {
    for (int r = 0; r < R; ++r) {
      const std::string v = V(member(r), t);
      b.Edge(t == 0 ? init(r) : V(member(r), t - 1), 0, v, 0);
      // Output k (1-based) of member r and input k of member q join them, k counting the
      // other members in rank order.
      for (int q = 0; q < R; ++q) {
        if (q == r) continue;
        b.LiveEdge(v, 1 + (q < r ? q : q - 1), V(member(q), t), 1 + (r < q ? r : r - 1), o.tp_channel);
      }
    }
  }
  b.Stage("eval", "ml.eval", 1,
          With(common, {{"clock", true}, {"train_images", train_images}, {"tensor_parallel", R}, {"config", Config(o, steps)}}),
          o.threads);
  b.Edge(init(0), 1, "eval", 0);
  for (int r = 0; r < R; ++r) b.Edge(V(member(r), steps - 1), 0, "eval", 1 + r);
  const std::string name = o.name.empty() ? "tp" + std::to_string(R) + "-" + o.tp_channel : o.name;
  Json outputs = Json::array(
      {{{"from", "eval"}, {"port", 0}, {"path", "metrics.json"}}, {{"from", "eval"}, {"port", 1}, {"path", "params.bin"}}});
  return b.Finish(name,
                  "tensor-parallel training of " + o.model + " on " + std::to_string(R) + " members joined by " + o.tp_channel +
                      " channels, generated by copse graph",
                  std::move(outputs));
}

// ---- pipeline (and data-parallel pipelines) -----------------------------------------------

Result<Json> Pipeline(const GraphOptions& o, int64_t steps, int64_t train_images) {
  JobBuilder b(o.checkpoint_dir + "/durable");
  const Json common = CommonParams(o);
  // Interleaved: D daemons hold P = D x virtual_stages stages (model chunks), stage s on daemon
  // s mod D; every other schedule has one stage per daemon.
  const bool interleaved = o.schedule == "interleaved";
  const int D = o.stages, P = o.stages * (interleaved ? o.virtual_stages : 1);
  const int M = o.microbatches, W = o.kind == "hybrid" ? o.workers : 1;
  // With tensor parallelism (R > 1) every vertex below is R members, one per rank, and each
  // forward and backward's members form a gang joined by live channels (ml.tp_step's layout:
  // the last R - 1 inputs and outputs); each member's params, stash, activations and gradients
  // flow only between vertices of its own rank.
  const int R = o.tensor_parallel;
  // fp16's overflow check and --clip-norm's norm span every stage: each step's last backwards
  // gather a step check from the last stage down to stage 0, whose backward sends it to every
  // update (ml.backward's params.step_check). It needs each stage's gradients summed by then,
  // so weight gradients are computed per micro-batch, not batched into the update.
  const bool step_check = StepChecked(o);
  std::vector<int> split = o.split;
  if (split.empty()) {
    COPSE_ASSIGN_OR_RETURN(split, BalancedSplit(o.model, P));
  }
  COPSE_ASSIGN_OR_RETURN(Sequential full, BuildModelLayers(o.model));
  COPSE_ASSIGN_OR_RETURN(const GpuMemoryModel gpu, GpuMemoryOf(o));
  if (static_cast<int>(split.size()) != P + 1 || split.front() != 0 || split.back() != static_cast<int>(full.size()) ||
      !std::is_sorted(split.begin(), split.end()) || std::adjacent_find(split.begin(), split.end()) != split.end())
    return Status::InvalidArgument("--split: expected " + std::to_string(P - 1) + " increasing inner boundaries between 0 and " +
                                   std::to_string(full.size()));
  auto rank = [&](int r) { return R > 1 ? "t" + std::to_string(r) : std::string(); };
  auto suffix = [&](int s, int w, int r) { return std::to_string(s) + (W > 1 ? "w" + std::to_string(w) : "") + rank(r); };
  auto F = [&](int s, int w, int r) { return "fwd" + suffix(s, w, r); };
  auto B = [&](int s, int w, int r) { return "bwd" + suffix(s, w, r); };
  auto Uname = [&](int s, int r) { return "upd" + std::to_string(s) + rank(r); };
  auto Iname = [&](int s, int r) { return "init" + std::to_string(s) + rank(r); };
  for (int s = 0; s < P; ++s) {
    const Json layers = {{"begin", split[s]}, {"end", split[s + 1]}};
    // What crosses to a neighbour stage is retained (the activation, port 1 of a forward; dL/dx,
    // port 1 of a backward): a lost stage re-runs its own history from its neighbours' outputs
    // instead of walking back through every stage to init. Outputs that stay within a stage are
    // released as usual — they would die with the stage's daemon anyway.
    const std::vector<int> crossing = {1};
    // Batched weight gradients need the stashed layer inputs and layers that can defer theirs
    // (a tensor-parallel block cannot).
    const bool batched = o.weight_grads == "batched" && !o.recompute && R == 1 && !step_check &&
                         full.Slice(split[s], split[s + 1]).DefersWeightGradients();
    // A pipeline keeps its M micro-batches' stashes until the step's last backward.
    const int64_t gpu_mb = gpu.Mb(split[s], split[s + 1], (o.batch + W - 1) / W);
    for (int r = 0; r < R; ++r) {
      // shm gangs share a daemon: a stage's members share its affinity group; stream gangs may
      // spread, one group per rank.
      const std::string group = "stage" + std::to_string(s % D) + (o.tp_channel == "stream" ? rank(r) : std::string());
      const Json tp = R > 1 ? Json{{"tensor_parallel", R}, {"tp_rank", r}} : Json::object();
      b.Stage(Iname(s, r), "ml.init", 1, With(With(With(common, layers), tp), {{"clock", s == 0 && r == 0}}), o.daemon_cpus,
              group + (W > 1 ? "w0" : ""));
      for (int w = 0; w < W; ++w) {
        const Json pos = {{"stage", s},   {"stages", P}, {"microbatches", M},
                          {"workers", W}, {"worker", w}, {"recompute", o.recompute}};
        // Stage 0's last backward of a step sends the step check to every update (ports 1..P).
        std::vector<int> bwd_retain = s > 0 ? crossing : std::vector<int>{};
        if (s == 0 && step_check)
          for (int k = 1; k <= P; ++k) bwd_retain.push_back(k);
        b.Stage(F(s, w, r), "ml.forward", steps * M, With(With(With(common, layers), tp), pos), o.threads,
                group + (W > 1 ? "w" + std::to_string(w) : ""), s + 1 < P ? crossing : std::vector<int>{});
        b.ComputeOn(o.device, gpu_mb);
        Json bwd = With(With(With(With(common, layers), tp), pos), {{"weight_grads", batched ? "batched" : "per-microbatch"}});
        if (step_check) bwd["step_check"] = true;
        b.Stage(B(s, w, r), "ml.backward", steps * M, std::move(bwd), o.threads, group + (W > 1 ? "w" + std::to_string(w) : ""),
                bwd_retain);
        b.ComputeOn(o.device, gpu_mb);
      }
      Json upd = With(With(UpdateParams(common, split[s], split[s + 1], steps), tp),
                      {{"weight_grads", batched ? "batched" : "per-microbatch"}});
      if (step_check) upd["step_checks"] = W;  // its last W inputs, one from each pipeline
      b.Stage(Uname(s, r), "ml.update", steps, std::move(upd), PipelineUpdateCpus(o), group + (W > 1 ? "w0" : ""));
      b.ComputeOn(o.device, gpu_mb);
    }
  }
  for (int64_t t = 0; t < steps; ++t) {
    for (int s = 0; s < P; ++s) {
      for (int r = 0; r < R; ++r) {
        const std::string src = t == 0 ? Iname(s, r) : V(Uname(s, r), t - 1);
        if (t > 0) MarkCheckpoint(b, o, src, t - 1, steps);
        b.Reserve(src, 1);
        b.Edge(src, 0, V(Uname(s, r), t), 0);  // the chain
        for (int w = 0; w < W; ++w) {
          for (int m = 0; m < M; ++m) {
            const int64_t i = t * M + m;
            const std::string f = V(F(s, w, r), i), bw = V(B(s, w, r), i);
            b.Edge(src, -1, f, 0);
            b.Edge(src, -1, bw, 0);
            if (s > 0) b.Edge(V(F(s - 1, w, r), i), 1, f, 1);
            b.Edge(f, 0, bw, 1);
            if (s < P - 1) b.Edge(V(B(s + 1, w, r), i), 1, bw, 2);
            if (m > 0) b.Edge(V(B(s, w, r), i - 1), 0, bw, s < P - 1 ? 3 : 2);
            // The gangs: member r's live channels come after its data ports.
            const int f_in = s > 0 ? 2 : 1, f_out = s < P - 1 ? 2 : 1;
            const int b_in = 2 + (s < P - 1 ? 1 : 0) + (m > 0 ? 1 : 0), b_out = s > 0 ? 2 : 1;
            for (int q = 0; q < R; ++q) {
              if (q == r) continue;
              const int out_k = q < r ? q : q - 1, in_k = r < q ? r : r - 1;  // q among r's peers, r among q's
              b.LiveEdge(f, f_out + out_k, V(F(s, w, q), i), f_in + in_k, o.tp_channel);
              b.LiveEdge(bw, b_out + out_k, V(B(s, w, q), i), b_in + in_k, o.tp_channel);
            }
          }
          b.Edge(V(B(s, w, r), t * M + M - 1), 0, V(Uname(s, r), t), 1 + w);
          if (step_check && s == 0)  // pipeline w's step check to every stage's update
            for (int u = 0; u < P; ++u) b.Edge(V(B(0, w, r), t * M + M - 1), 1 + u, V(Uname(u, r), t), 1 + W + w);
          // The schedule: one stage's vertices of this step in a chain of ordering edges
          // (interleaved: one daemon's, over its chunks, below).
          if (interleaved) continue;
          const auto order = ScheduleOrder(o.schedule, s, P, M);
          for (size_t k = 1; k < order.size(); ++k) {
            auto name = [&](std::pair<char, int> x) { return V(x.first == 'F' ? F(s, w, r) : B(s, w, r), t * M + x.second); };
            b.Order(name(order[k - 1]), name(order[k]));
          }
        }
      }
    }
    if (!interleaved) continue;
    for (int d = 0; d < D; ++d) {
      const auto order = InterleavedOrder(d, D, o.virtual_stages, M);
      for (int w = 0; w < W; ++w) {
        auto name = [&](const ChunkOp& x) {
          const int s = x.chunk * D + d;
          return V(x.kind == 'F' ? F(s, w, 0) : B(s, w, 0), t * M + x.microbatch);
        };
        for (size_t k = 1; k < order.size(); ++k) b.Order(name(order[k - 1]), name(order[k]));
      }
    }
  }
  for (int s = 0; s < P; ++s)
    for (int r = 0; r < R; ++r) AddCheckpoints(b, o, Uname(s, r), "ckpt" + std::to_string(s) + rank(r), steps);
  Json eval_params = With(common, {{"clock", true}, {"train_images", train_images}, {"config", Config(o, steps)}});
  if (R > 1) eval_params["tensor_parallel"] = R;
  b.Stage("eval", "ml.eval", 1, eval_params, o.threads);
  b.Edge(Iname(0, 0), b.NextPort(Iname(0, 0)), "eval", 0);
  for (int s = 0; s < P; ++s)
    for (int r = 0; r < R; ++r) b.Edge(V(Uname(s, r), steps - 1), 0, "eval", 1 + s * R + r);
  const std::string name = o.name.empty() ? (W > 1 ? "dp" + std::to_string(W) + "-" : std::string()) + "pipeline" +
                                                std::to_string(D) + (R > 1 ? "-tp" + std::to_string(R) : std::string()) + "-" +
                                                o.schedule + (interleaved ? "-v" + std::to_string(o.virtual_stages) : "") + "-m" +
                                                std::to_string(M) + (o.recompute ? "-recompute" : "")
                                          : o.name;
  Json outputs = Json::array(
      {{{"from", "eval"}, {"port", 0}, {"path", "metrics.json"}}, {{"from", "eval"}, {"port", 1}, {"path", "params.bin"}}});
  return b.Finish(name,
                  "pipeline-parallel training of " + o.model + ": " + std::to_string(D) + " stages x " + std::to_string(M) +
                      " micro-batches, " + o.schedule + " schedule" +
                      (interleaved ? " (" + std::to_string(o.virtual_stages) + " model chunks a stage)" : "") +
                      (W > 1 ? ", " + std::to_string(W) + " data-parallel pipelines" : "") +
                      (R > 1 ? ", each stage split over " + std::to_string(R) + " tensor-parallel members" : "") +
                      ", generated by copse graph",
                  std::move(outputs));
}

}  // namespace

std::vector<std::pair<char, int>> ScheduleOrder(const std::string& schedule, int stage, int stages, int microbatches) {
  std::vector<std::pair<char, int>> out;
  const int M = microbatches;
  if (schedule == "gpipe") {
    for (int m = 0; m < M; ++m) out.push_back({'F', m});
    for (int m = 0; m < M; ++m) out.push_back({'B', m});
    return out;
  }
  const int warmup = std::min(stages - stage - 1, M);
  int f = 0, bw = 0;
  for (; f < warmup; ++f) out.push_back({'F', f});
  while (f < M) {
    out.push_back({'F', f++});
    out.push_back({'B', bw++});
  }
  while (bw < M) out.push_back({'B', bw++});
  return out;
}

std::vector<ChunkOp> InterleavedOrder(int device, int devices, int chunks, int microbatches) {
  const int total = microbatches * chunks;  // (chunk, micro-batch) pairs, forwards and backwards each
  // The k-th forward (backward) of the step: micro-batches in groups of `devices`, each group
  // through every chunk (backwards through them in reverse) before the next group.
  auto op = [&](int k, char kind) {
    const int in_group = k % (devices * chunks);
    const int chunk = in_group / devices;
    return ChunkOp{kind, kind == 'F' ? chunk : chunks - 1 - chunk, (k / (devices * chunks)) * devices + k % devices};
  };
  const int warmup = microbatches == devices ? total : std::min(total, (devices - device - 1) * 2 + (chunks - 1) * devices);
  std::vector<ChunkOp> out;
  int f = 0, b = 0;
  for (; f < warmup; ++f) out.push_back(op(f, 'F'));
  while (f < total) {
    out.push_back(op(f++, 'F'));
    out.push_back(op(b++, 'B'));
  }
  while (b < total) out.push_back(op(b++, 'B'));
  return out;
}

std::string StepEndStage(const std::string& kind, const std::string& reducer, int tensor_parallel) {
  if (kind == "tensor-parallel") return MemberStage(0);
  if (kind == "data-parallel") return UpdatePrefix(reducer) + (Replicated(reducer) ? "0" : "");
  return std::string("upd0") + (tensor_parallel > 1 ? "t0" : "");
}

Result<std::vector<int>> BalancedSplit(const std::string& model, int stages) {
  COPSE_ASSIGN_OR_RETURN(Sequential m, BuildModelLayers(model));
  const int n = static_cast<int>(m.size());
  if (stages > n) return Status::InvalidArgument("--stages: model " + model + " has only " + std::to_string(n) + " layers");
  std::vector<double> cost(static_cast<size_t>(n), 0.0);
  bool first = true;
  for (int i = 0; i < n; ++i) {
    double p = 0;
    for (const Parameter& q : m.layer(static_cast<size_t>(i)).parameters()) p += static_cast<double>(q.value.numel());
    cost[static_cast<size_t>(i)] = (first && p > 0 ? 2.0 : 3.0) * p + 1.0;
    if (p > 0) first = false;
  }
  // Minimize the largest stage's cost. best[k][i]: the least largest cost of layers [i, n) in k
  // stages (a dynamic program, O(stages x layers^2): a 256-block GPT has 516 layers). Of the
  // splits that reach it, the boundaries come out lexicographically smallest (each stage ends
  // at the first layer that still lets the rest fit), so equal costs always split alike.
  auto range_cost = [&](int a, int b) {
    double c = 0;
    for (int i = a; i < b; ++i) c += cost[static_cast<size_t>(i)];
    return c;
  };
  constexpr double kNever = 1e300;
  std::vector<std::vector<double>> best(static_cast<size_t>(stages) + 1, std::vector<double>(static_cast<size_t>(n) + 1, kNever));
  best[0][static_cast<size_t>(n)] = 0;
  for (int k = 1; k <= stages; ++k) {
    for (int i = n - k; i >= 0; --i) {
      double c = 0, least = kNever;
      for (int end = i + 1; end <= n - (k - 1); ++end) {
        c += cost[static_cast<size_t>(end - 1)];
        least = std::min(least, std::max(c, best[static_cast<size_t>(k - 1)][static_cast<size_t>(end)]));
      }
      best[static_cast<size_t>(k)][static_cast<size_t>(i)] = least;
    }
  }
  const double target = best[static_cast<size_t>(stages)][0];
  std::vector<int> split = {0};
  for (int k = stages; k >= 1; --k) {
    const int start = split.back();
    int end = start + 1;
    while (end < n - (k - 1) &&
           !(range_cost(start, end) <= target && best[static_cast<size_t>(k - 1)][static_cast<size_t>(end)] <= target))
      ++end;
    split.push_back(end);
  }
  return split;
}

Result<Json> GenerateTrainingGraph(const GraphOptions& options) {
  GraphOptions o = options;
  if (IsLanguageModel(o.model) && o.data_dir == kFashionMnistDir) o.data_dir = kFortunesDir;  // text models read text
  COPSE_RETURN_NOT_OK(Check(o));
  COPSE_RETURN_NOT_OK(BuildModelLayers(o.model).status());
  COPSE_ASSIGN_OR_RETURN(int64_t train_size, TrainSize(o));
  const int64_t steps_per_epoch = (train_size + o.batch - 1) / o.batch;
  int64_t steps = steps_per_epoch * o.epochs;
  if (o.steps > 0) steps = std::min(steps, o.steps);
  {
    // A step is a few vertices per worker, stage and micro-batch (ring reducers: per worker
    // pair); bound the whole before writing it, as the job manager bounds what it expands.
    const int64_t w = o.kind == "pipeline" ? 1 : o.workers;
    const int64_t pm = o.kind == "data-parallel" ? 1 : int64_t{o.stages} * o.microbatches;
    const int64_t per_step = (w * (2 * pm + 2 * w + 4) + 2 * o.stages) * std::max(1, o.tensor_parallel);  // + updates
    if (steps > kMaxGraphVertices / per_step) {
      return Status::InvalidArgument("--epochs/--steps: " + std::to_string(steps) + " steps of up to " +
                                     std::to_string(per_step) + " vertices each exceed the " + std::to_string(kMaxGraphVertices) +
                                     " vertices a generated graph may have; use --steps, a larger --batch or fewer "
                                     "workers, stages or micro-batches");
    }
  }
  // Images trained: full batches except the last of each epoch.
  int64_t images = 0;
  for (int64_t t = 0; t < steps; ++t) {
    const int64_t k = t % steps_per_epoch;
    images += std::min<int64_t>(o.batch, train_size - k * o.batch);
  }
  if (o.kind == "data-parallel") return DataParallel(o, steps, images);
  if (o.kind == "tensor-parallel") return TensorParallel(o, steps, images);
  return Pipeline(o, steps, images);
}

}  // namespace copse::ml
