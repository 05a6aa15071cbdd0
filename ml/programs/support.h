#pragma once
// Shared machinery of the ML vertex programs (ml/programs/programs.cc): the training settings
// every vertex reads from its params, the process-wide dataset cache, the model cache that
// lets consecutive vertices on one daemon skip decoding parameters they already hold, and the
// optional per-vertex timing trace the pipeline bench reads.
//
// Determinism: everything here is a pure function of (params, input bytes). The model cache
// only skips work: an entry is reused when it provably holds the tensors of an input message
// (same TensorMessageKey, ml/tensor_message.h), so a cold daemon (after recovery) computes the
// same bytes as a warm one.
//
// Thread-safety: the caches are safe to use from every worker thread of a daemon; a leased
// model is used by one vertex at a time.
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "ml/dataset.h"
#include "ml/loss_scaler.h"
#include "ml/optimizer.h"
#include "ml/sequential.h"
#include "vertex/program.h"

namespace copse::ml::programs {

/// The training settings of a generated graph, carried in every ML vertex's params.
struct TrainSettings {
  std::string model = "mlp";
  uint64_t seed = 1;
  std::string data_dir = kFashionMnistDir;
  int64_t limit = -1;       // training images (all when < 0)
  int64_t test_limit = -1;  // test images (all when < 0)
  int64_t batch = 128;      // global batch
  std::string optimizer = "sgd";
  float lr = 0.05f, momentum = 0.9f, weight_decay = 0.0f;
  std::string lr_schedule = "constant";  // or cosine: StepLr
  int64_t warmup_steps = 0;
  float min_lr = 0.0f;
  float clip_norm = 0.0f;                          // the gradients' global L2 norm clipped to this before each step (0: never)
  Precision precision = Precision::kFloat32;       // params.precision: of matrix products and stage boundaries
  float initial_loss_scale = LossScale::kInitial;  // fp16: params.loss_scale, the scale of the first step
  // params.device: where the vertex computes and keeps its model — the CPU, or ("cuda") the GPU
  // the daemon leased it (resources.gpus). Messages may carry tensors of either device; the
  // programs move what they read onto this one (OnDevice).
  Device* device = CpuDevice();
  int64_t train_size = 0;          // examples (images, text windows) in the (limited) training set
  int64_t steps_per_epoch = 0;     // ceil(train_size / batch)
  int64_t labels_per_example = 1;  // 1 for an image; a text window's context for a gpt model
  // Tensor parallelism (params.tensor_parallel, tp_rank): the vertex holds shard tp_rank of
  // tp_ranks of the model's blocks (ml/transformer.h); 1 member: the whole model.
  int tp_rank = 0, tp_ranks = 1;
};

/// The device params.device names for this vertex: the CPU ("cpu", the default), or for "cuda"
/// the GPU its daemon leased it. InvalidArgument names the vertex when it holds no GPU (no
/// resources.gpus) or this build or host has no such GPU.
Result<Device*> ProgramDevice(const vertex::VertexContext& ctx);

/// `t` on `device`: itself when it is there already, else a copy.
Tensor OnDevice(const Tensor& t, Device* device);
/// Every tensor of `set` on `device` (those already there shared, the others copied), except
/// scalars named "__…" (loss sums, statistics), which the programs read on the host.
NamedTensors OnDevice(const NamedTensors& set, Device* device);

/// The largest global batch, and the most workers, micro-batches or stages, params may name.
inline constexpr int64_t kMaxBatch = int64_t{1} << 24;
inline constexpr int64_t kMaxParts = 4096;

/// Checks params.workers, worker, microbatches, stages and stage (where given) against each
/// other and kMaxParts. SettingsFromParams includes it.
Status CheckPartition(const vertex::VertexContext& ctx);

/// The training settings of a vertex's params, checked: batch within kMaxBatch and covering
/// every worker's micro-batches, CheckPartition, a training set that is not empty.
Result<TrainSettings> SettingsFromParams(const vertex::VertexContext& ctx);

/// The (limited) split `model` trains on, loaded once per process: Fashion-MNIST from `dir`, or
/// for a gpt model windows of the text corpus in `dir` (kTest: its validation text).
Result<std::shared_ptr<const Dataset>> CachedDataset(const std::string& model, const std::string& dir, Split split,
                                                     int64_t limit);

/// The labels of training examples `idx` (labels_per_example each): for an image model from
/// its labels file alone (CachedDataset's images are decompressed only where they are read),
/// for a gpt model from its windows.
Result<std::vector<int32_t>> TrainLabelsOf(const TrainSettings& s, std::span<const int64_t> idx);

/// Dataset indices of global step `step` (0-based over all epochs), part `part` of `parts`
/// (ShardBatch: contiguous, sizes differing by at most one). `batch_size` gets the rows of the
/// loss over the whole global batch (its images, or tokens: the loss normalizer).
Result<std::vector<int64_t>> StepIndices(const TrainSettings& s, int64_t step, int part, int parts, int64_t* batch_size);
/// The learning rate of global step `step` (0-based) of `total`: s.lr, or with the cosine
/// schedule WarmupCosineLr (what copse train uses, so jobs follow the same rates).
float StepLr(const TrainSettings& s, int64_t step, int64_t total);
/// The optimizer of `s` (sgd, adam or adamw) over `m`'s parameters.
std::unique_ptr<Optimizer> MakeOptimizer(const TrainSettings& s, Sequential& m);
/// Adds global step `step`'s {loss sum, rows} to a chain's "__stats" {loss sum and rows of this
/// epoch, epoch, rows trained in all} (the epoch's sums restart with a new epoch).
void AddToStats(const TrainSettings& s, int64_t step, const std::vector<float>& loss, std::vector<float>& stats);
/// What a training step reports as progress: {"step", "steps", "loss", "epoch", and "images"
/// or, for a language model, "tokens" trained so far}.
Json StepProgress(const TrainSettings& s, int64_t step, int64_t steps, const std::vector<float>& stats);
/// Epoch (from 1) and step within the epoch (from 1) of a global step.
std::pair<int64_t, int64_t> EpochAndStep(const TrainSettings& s, int64_t step);

/// One cached model slice (layers [begin, end) of `model`, or of its tensor-parallel shard)
/// with an optional optimizer. The
/// keys say which message each part of the state equals (0 = unknown).
///
/// Sharing contract: an entry's parameter values, gradients and optimizer state may be the very
/// tensors of messages (LeaseModel shares the params message; programs send gradients and the
/// update's outputs as handles), and message tensors are immutable. So nothing writes them in
/// place: parameters are replaced (Sgd::StepOutOfPlace, or copies before an in-place step),
/// gradients are renewed (Sequential::FreshGradients) before they are overwritten, and only
/// an accumulation this entry produced itself and sent on as a gradient log (which shares none
/// of the gradients, gradient_log.h) continues in place.
struct CachedModel {
  Sequential model;
  std::unique_ptr<Optimizer> optimizer;
  uint64_t params_key = 0, grads_key = 0, state_key = 0;
  std::vector<float> grads_loss{0, 0};     // "__loss" of the message grads_key names
  WeightCasts weight_casts;                // the parameters' bfloat16 copies (the model's layers use them)
  float loss_scale = LossScale::kInitial;  // fp16: the "__loss_scale" of the message params_key names
};

/// A model taken from the cache for one vertex; returned on destruction. Keys are reset unless
/// Commit() was called, so a failed vertex never leaves a half-updated entry behind.
class ModelLease {
 public:
  ModelLease(std::string cache_key, std::unique_ptr<CachedModel> entry);
  ~ModelLease();
  ModelLease(ModelLease&&) = default;
  CachedModel* operator->() const { return entry_.get(); }
  CachedModel& operator*() const { return *entry_; }
  void Commit() { committed_ = true; }

 private:
  std::string cache_key_;
  std::unique_ptr<CachedModel> entry_;
  bool committed_ = false;
};

/// A model slice whose parameters are those of `params_msg` (shared, not copied; read only
/// when no cached entry holds them already). `grads_key` prefers an entry whose gradients equal
/// that message.
Result<ModelLease> LeaseModel(const TrainSettings& s, int begin, int end, const chan::Buffer& params_msg, uint64_t grads_key = 0);

/// The tensor named `name` in `set` (the first such), or null.
const Tensor* FindTensor(const NamedTensors& set, std::string_view name);

/// fp16's loss scale in a message's tensors: a params message's "__loss_scale" [S] (what its
/// gradients are computed at), or a chain's stats message's [S, good steps]; `initial` where
/// there is none (init's messages).
LossScale LossScaleIn(const NamedTensors& set, float initial);

/// A 1-D tensor of `v` ("__loss", "__stats"), and the first `n` values of one (zeros where it
/// is null or shorter).
Tensor Scalars(const std::vector<float>& v);
std::vector<float> ReadScalars(const Tensor* t, size_t n);

/// Deep copies of `tensors` on the host (to write to tensors a TensorMessage shares read-only).
NamedTensors HostCopies(const NamedTensors& tensors);

/// Parameter gradients of `m` (no copies: the handles of the gradients), plus `extra`.
NamedTensors GradientHandles(const Sequential& m);
NamedTensors ParameterHandles(const Sequential& m);

/// The settings of a forward pass of global step `step`, micro-batch or worker part `part`:
/// training, its dropout seed and s.precision.
ForwardContext StepContext(const TrainSettings& s, int64_t step, int part);
/// An activation or gradient as it crosses the pipeline stage boundary before layer `next` of
/// the model: in bfloat16 (half the bytes) under mixed precision where that layer multiplies
/// its input in bfloat16 anyway (Layer::TakesBFloat16: an MLP's Linear), else as it is — a
/// GPT's residual stream and a CNN's feature maps stay float32, as in one process.
Tensor BoundaryTensor(const TrainSettings& s, int next, const Tensor& t);

/// Reads every message of input `port`.
Result<std::vector<chan::Buffer>> ReadAll(vertex::VertexContext& ctx, size_t port);
/// Reads exactly one message of input `port`.
Result<chan::Buffer> ReadOne(vertex::VertexContext& ctx, size_t port);
/// The parameters on input `port`: a params message, or the first of a chain (params, state,
/// stats), which is what every consumer of a checkpoint step's update reads (its durable output).
Result<chan::Buffer> ReadParams(vertex::VertexContext& ctx, size_t port);

/// Appends "<vertex> <start_us> <end_us> <pid>" to $COPSE_ML_TRACE when set (wall clock, so
/// several daemons on one host share a time base). For the bench's bubble figure.
class TraceSpan {
 public:
  explicit TraceSpan(const vertex::VertexContext& ctx);
  ~TraceSpan();

 private:
  std::string name_;
  int64_t start_us_;
};

/// Wall-clock microseconds since the epoch.
int64_t WallMicros();

}  // namespace copse::ml::programs
