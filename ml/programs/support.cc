#include "ml/programs/support.h"

#include <fcntl.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <tuple>

#include "ml/models.h"
#include "ml/philox.h"
#include "ml/text_corpus.h"
#include "ml/transformer.h"
#include "ml/tensor_message.h"

namespace copse::ml::programs {

Status CheckPartition(const vertex::VertexContext& ctx) {
  // Divisors and indices of every training program: zero or out of range would divide by zero
  // or read past an array in the daemon's process.
  try {
    const int64_t workers = ctx.param<int64_t>("workers", 1), worker = ctx.param<int64_t>("worker", 0);
    const int64_t microbatches = ctx.param<int64_t>("microbatches", 1);
    const int64_t stages = ctx.param<int64_t>("stages", 1), stage = ctx.param<int64_t>("stage", 0);
    if (workers < 1 || workers > kMaxParts)
      return Status::InvalidArgument(ctx.name + ": params.workers must be 1 to " + std::to_string(kMaxParts));
    if (microbatches < 1 || microbatches > kMaxParts)
      return Status::InvalidArgument(ctx.name + ": params.microbatches must be 1 to " + std::to_string(kMaxParts));
    if (stages < 1 || stages > kMaxParts)
      return Status::InvalidArgument(ctx.name + ": params.stages must be 1 to " + std::to_string(kMaxParts));
    if (worker < 0 || worker >= workers)
      return Status::InvalidArgument(ctx.name + ": params.worker " + std::to_string(worker) + " is not one of its " +
                                     std::to_string(workers) + " workers");
    if (stage < 0 || stage >= stages)
      return Status::InvalidArgument(ctx.name + ": params.stage " + std::to_string(stage) + " is not one of its " +
                                     std::to_string(stages) + " stages");
  } catch (const std::exception& e) {
    return Status::InvalidArgument(ctx.name + ": bad ML params: " + e.what());
  }
  return Status::OK();
}

Result<Device*> ProgramDevice(const vertex::VertexContext& ctx) {
  std::string name;
  try {
    name = ctx.param<std::string>("device", "cpu");
  } catch (const std::exception& e) {
    return Status::InvalidArgument(ctx.name + ": bad ML params: " + e.what());
  }
  if (name == "cpu") return CpuDevice();
  if (name != "cuda") return Status::InvalidArgument(ctx.name + ": params.device is \"" + name + "\"; expected cpu or cuda");
  if (ctx.gpu < 0)
    return Status::InvalidArgument(ctx.name +
                                   ": params.device is cuda but the vertex holds no GPU (give its stage resources.gpus 1)");
  auto device = CudaDevice(ctx.gpu);
  if (!device.ok()) return device.status().WithContext(ctx.name + ": params.device cuda (GPU " + std::to_string(ctx.gpu) + ")");
  return *device;
}

Tensor OnDevice(const Tensor& t, Device* device) { return !t.defined() || t.device() == device ? t : t.To(device); }

NamedTensors OnDevice(const NamedTensors& set, Device* device) {
  NamedTensors out;
  out.reserve(set.size());
  for (const auto& [name, t] : set) out.emplace_back(name, name.starts_with("__") ? t : OnDevice(t, device));
  return out;
}

namespace {
Result<std::shared_ptr<const std::vector<int32_t>>> CachedImageLabels(const std::string& dir, int64_t limit);
}  // namespace

Result<TrainSettings> SettingsFromParams(const vertex::VertexContext& ctx) {
  TrainSettings s;
  COPSE_ASSIGN_OR_RETURN(s.device, ProgramDevice(ctx));
  try {
    s.model = ctx.param<std::string>("model", s.model);
    s.seed = ctx.param<uint64_t>("seed", s.seed);
    s.data_dir = ctx.param<std::string>("data_dir", s.data_dir);
    s.limit = ctx.param<int64_t>("limit", s.limit);
    s.test_limit = ctx.param<int64_t>("test_limit", s.test_limit);
    s.batch = ctx.param<int64_t>("batch", s.batch);
    s.optimizer = ctx.param<std::string>("optimizer", s.optimizer);
    s.lr = ctx.param<float>("lr", s.lr);
    s.momentum = ctx.param<float>("momentum", s.momentum);
    s.weight_decay = ctx.param<float>("weight_decay", s.weight_decay);
    s.lr_schedule = ctx.param<std::string>("lr_schedule", s.lr_schedule);
    s.warmup_steps = ctx.param<int64_t>("warmup_steps", s.warmup_steps);
    s.min_lr = ctx.param<float>("min_lr", s.min_lr);
    s.clip_norm = ctx.param<float>("clip_norm", s.clip_norm);
    s.initial_loss_scale = ctx.param<float>("loss_scale", s.initial_loss_scale);
    auto precision = ParsePrecision(ctx.param<std::string>("precision", "fp32"));
    if (!precision.ok()) return precision.status().WithContext(ctx.name + ": params.precision");
    s.precision = *precision;
    s.tp_ranks = ctx.param<int>("tensor_parallel", 1);
    s.tp_rank = ctx.param<int>("tp_rank", 0);
  } catch (const std::exception& e) {
    return Status::InvalidArgument(ctx.name + ": bad ML params: " + e.what());
  }
  if (s.batch < 1 || s.batch > kMaxBatch)
    return Status::InvalidArgument(ctx.name + ": params.batch must be 1 to " + std::to_string(kMaxBatch));
  COPSE_RETURN_NOT_OK(CheckPartition(ctx));
  const int64_t parts = int64_t{ctx.param<int>("workers", 1)} * ctx.param<int>("microbatches", 1);
  if (s.batch < parts) {
    return Status::InvalidArgument(ctx.name + ": params.batch " + std::to_string(s.batch) + " leaves some of its " +
                                   std::to_string(parts) + " workers x micro-batches without an image");
  }
  if (s.tp_ranks < 1 || s.tp_ranks > 64 || s.tp_rank < 0 || s.tp_rank >= s.tp_ranks)
    return Status::InvalidArgument(ctx.name + ": params.tp_rank " + std::to_string(s.tp_rank) + " is not one of its " +
                                   std::to_string(s.tp_ranks) + " tensor-parallel ranks (params.tensor_parallel, 1 to 64)");
  if (s.precision == Precision::kFloat16 && ctx.params && ctx.params->contains("stages") && s.tp_ranks > 1)
    return Status::InvalidArgument(ctx.name +
                                   ": params.precision fp16 is not for a pipeline's tensor-parallel members (their "
                                   "overflow check would have to span the shards of every stage, which is not built yet)");
  if (!(s.initial_loss_scale > 0) || !std::isfinite(s.initial_loss_scale))
    return Status::InvalidArgument(ctx.name + ": params.loss_scale must be a finite number > 0");
  if (s.lr_schedule != "constant" && s.lr_schedule != "cosine")
    return Status::InvalidArgument(ctx.name + ": params.lr_schedule must be constant or cosine");
  if (s.warmup_steps < 0 || !(s.min_lr >= 0) || !(s.clip_norm >= 0) || !std::isfinite(s.clip_norm))
    return Status::InvalidArgument(ctx.name + ": params.warmup_steps, min_lr and clip_norm must be finite and >= 0");
  if (s.optimizer != "sgd" && s.optimizer != "adam" && s.optimizer != "adamw")
    return Status::InvalidArgument(ctx.name + ": params.optimizer must be sgd, adam or adamw");
  if (!s.data_dir.empty() && s.data_dir[0] != '/') s.data_dir = ctx.ResolvePath(s.data_dir).string();
  // The size alone: a vertex that reads no images (a later stage, an update) need not load them.
  if (IsLanguageModel(s.model)) {
    COPSE_ASSIGN_OR_RETURN(auto train, CachedDataset(s.model, s.data_dir, Split::kTrain, s.limit));
    s.train_size = train->size();
    s.labels_per_example = train->labels_per_example();
  } else {
    COPSE_ASSIGN_OR_RETURN(auto labels, CachedImageLabels(s.data_dir, s.limit));
    s.train_size = static_cast<int64_t>(labels->size());
    s.labels_per_example = 1;
  }
  if (s.train_size == 0) return Status::InvalidArgument(ctx.name + ": the training set is empty");
  s.steps_per_epoch = (s.train_size + s.batch - 1) / s.batch;
  return s;
}

namespace {

std::mutex g_data_mu;
std::map<std::tuple<std::string, std::string, int, int64_t>, std::shared_ptr<const Dataset>> g_datasets;
std::map<std::pair<std::string, int64_t>, std::shared_ptr<const std::vector<int32_t>>> g_image_labels;

/// The (limited) Fashion-MNIST training labels of `dir`, loaded once per process.
Result<std::shared_ptr<const std::vector<int32_t>>> CachedImageLabels(const std::string& dir, int64_t limit) {
  std::lock_guard<std::mutex> lock(g_data_mu);
  auto it = g_image_labels.find({dir, limit});
  if (it != g_image_labels.end()) return it->second;
  COPSE_ASSIGN_OR_RETURN(std::vector<int32_t> labels, LoadFashionMnistLabels(dir, Split::kTrain, limit));
  auto ptr = std::make_shared<const std::vector<int32_t>>(std::move(labels));
  g_image_labels[{dir, limit}] = ptr;
  return ptr;
}
std::map<std::tuple<int64_t, uint64_t, int64_t>, std::shared_ptr<const std::vector<int64_t>>> g_orders;

std::shared_ptr<const std::vector<int64_t>> CachedOrder(int64_t n, uint64_t seed, int64_t epoch) {
  std::lock_guard<std::mutex> lock(g_data_mu);
  const auto key = std::make_tuple(n, seed, epoch);
  auto it = g_orders.find(key);
  if (it != g_orders.end()) return it->second;
  if (g_orders.size() >= 8) g_orders.clear();  // only a few epochs are live at once
  auto order = std::make_shared<const std::vector<int64_t>>(EpochOrder(n, seed, epoch));
  g_orders[key] = order;
  return order;
}

}  // namespace

Result<std::shared_ptr<const Dataset>> CachedDataset(const std::string& model, const std::string& dir, Split split,
                                                     int64_t limit) {
  int context = 0;  // text windows of this length, or images when 0
  if (IsLanguageModel(model)) {
    COPSE_ASSIGN_OR_RETURN(GptSpec spec, ParseGptSpec(model));
    context = spec.context;
  }
  std::lock_guard<std::mutex> lock(g_data_mu);
  const auto key =
      std::make_tuple(context ? "text/" + std::to_string(context) : std::string("images"), dir, static_cast<int>(split), limit);
  auto it = g_datasets.find(key);
  if (it != g_datasets.end()) return it->second;
  Dataset d;
  if (context > 0) {
    COPSE_ASSIGN_OR_RETURN(d, LoadTextSplit(dir, split, context, limit));
  } else {
    DatasetOptions o;
    o.limit = limit;
    COPSE_ASSIGN_OR_RETURN(d, LoadFashionMnist(dir, split, o));
  }
  auto ptr = std::make_shared<const Dataset>(std::move(d));
  g_datasets[key] = ptr;
  return ptr;
}

Result<std::vector<int32_t>> TrainLabelsOf(const TrainSettings& s, std::span<const int64_t> idx) {
  if (IsLanguageModel(s.model)) {
    COPSE_ASSIGN_OR_RETURN(auto train, CachedDataset(s.model, s.data_dir, Split::kTrain, s.limit));
    return train->LabelsOf(idx);
  }
  COPSE_ASSIGN_OR_RETURN(auto labels, CachedImageLabels(s.data_dir, s.limit));
  std::vector<int32_t> out;
  out.reserve(idx.size());
  for (const int64_t i : idx) {
    if (i < 0 || i >= static_cast<int64_t>(labels->size()))
      return Status::InvalidArgument("training example " + std::to_string(i) + " of " + std::to_string(labels->size()));
    out.push_back((*labels)[static_cast<size_t>(i)]);
  }
  return out;
}

float StepLr(const TrainSettings& s, int64_t step, int64_t total) {
  return s.lr_schedule == "cosine" ? WarmupCosineLr(step, s.warmup_steps, total, s.lr, s.min_lr) : s.lr;
}

std::unique_ptr<Optimizer> MakeOptimizer(const TrainSettings& s, Sequential& m) {
  if (s.optimizer == "adam" || s.optimizer == "adamw") {
    AdamOptions a;
    a.lr = s.lr;
    a.weight_decay = s.weight_decay;
    a.decoupled_weight_decay = s.optimizer == "adamw";
    return std::make_unique<Adam>(m.Parameters(), a);
  }
  SgdOptions o;
  o.lr = s.lr;
  o.momentum = s.momentum;
  o.weight_decay = s.weight_decay;
  return std::make_unique<Sgd>(m.Parameters(), o);
}

void AddToStats(const TrainSettings& s, int64_t step, const std::vector<float>& loss, std::vector<float>& stats) {
  const int64_t epoch = EpochAndStep(s, step).first;
  if (static_cast<int64_t>(stats[2]) != epoch) stats[0] = stats[1] = 0, stats[2] = static_cast<float>(epoch);
  stats[0] += loss[0];
  stats[1] += loss[1];
  stats[3] += loss[1];
}

Json StepProgress(const TrainSettings& s, int64_t step, int64_t steps, const std::vector<float>& stats) {
  return {{"step", step + 1},
          {"steps", steps},
          {"loss", stats[0] / stats[1]},
          {"epoch", static_cast<int64_t>(stats[2])},
          {IsLanguageModel(s.model) ? "tokens" : "images", stats[3]}};
}

std::pair<int64_t, int64_t> EpochAndStep(const TrainSettings& s, int64_t step) {
  return {step / s.steps_per_epoch + 1, step % s.steps_per_epoch + 1};
}

Result<std::vector<int64_t>> StepIndices(const TrainSettings& s, int64_t step, int part, int parts, int64_t* batch_size) {
  const auto [epoch, k] = EpochAndStep(s, step);
  auto order = CachedOrder(s.train_size, s.seed, epoch);
  const int64_t begin = (k - 1) * s.batch;
  const int64_t end = std::min<int64_t>(s.train_size, begin + s.batch);
  std::span<const int64_t> batch(order->data() + begin, static_cast<size_t>(end - begin));
  if (batch_size) *batch_size = (end - begin) * s.labels_per_example;
  return ShardBatch(batch, part, parts);
}

// ---- model cache --------------------------------------------------------------------------

namespace {

std::mutex g_model_mu;
std::map<std::string, std::vector<std::unique_ptr<CachedModel>>> g_models;  // idle entries
constexpr size_t kMaxIdlePerKey = 4;

/// COPSE_ML_MODEL_CACHE=off: every vertex builds its model slice from its input messages, as a
/// cold daemon does after recovery (to show that the cache changes no result, and to test the
/// paths that rebuild what it would have held).
bool ModelCacheEnabled() {
  static const bool enabled = [] {
    const char* v = std::getenv("COPSE_ML_MODEL_CACHE");
    return v == nullptr || std::string_view(v) != "off";
  }();
  return enabled;
}

}  // namespace

ModelLease::ModelLease(std::string cache_key, std::unique_ptr<CachedModel> entry)
    : cache_key_(std::move(cache_key)), entry_(std::move(entry)) {}

ModelLease::~ModelLease() {
  if (!entry_) return;
  if (!committed_) entry_->params_key = entry_->grads_key = entry_->state_key = 0;
  if (!ModelCacheEnabled()) return;
  std::lock_guard<std::mutex> lock(g_model_mu);
  auto& idle = g_models[cache_key_];
  if (idle.size() < kMaxIdlePerKey) idle.push_back(std::move(entry_));
}

Result<ModelLease> LeaseModel(const TrainSettings& s, int begin, int end, const chan::Buffer& params_msg, uint64_t grads_key) {
  const std::string cache_key = s.device->name() + "/" + s.model + "/" + std::to_string(begin) + "-" + std::to_string(end) + "/" +
                                s.optimizer + "/tp" + std::to_string(s.tp_rank) + "of" + std::to_string(s.tp_ranks);
  const uint64_t params_key = TensorMessageKey(params_msg);
  std::unique_ptr<CachedModel> entry;
  {
    std::lock_guard<std::mutex> lock(g_model_mu);
    auto& idle = g_models[cache_key];
    size_t best = idle.size();
    int best_score = -1;
    for (size_t i = 0; i < idle.size(); ++i) {
      const int score = (idle[i]->params_key == params_key ? 2 : 0) + (grads_key != 0 && idle[i]->grads_key == grads_key ? 1 : 0);
      if (score > best_score) best_score = score, best = i;
    }
    if (best < idle.size()) {
      entry = std::move(idle[best]);
      idle.erase(idle.begin() + static_cast<std::ptrdiff_t>(best));
    }
  }
  if (!entry) {
    // The params message sets every parameter below, so the layers are built uninitialized.
    COPSE_ASSIGN_OR_RETURN(Sequential full, BuildModelShardLayers(s.model, s.tp_rank, s.tp_ranks));
    if (begin < 0 || end > static_cast<int>(full.size()) || begin >= end)
      return Status::InvalidArgument("layers [" + std::to_string(begin) + ", " + std::to_string(end) +
                                     ") out of range for model " + s.model + " (" + std::to_string(full.size()) + " layers)");
    entry = std::make_unique<CachedModel>();
    entry->model = full.Slice(static_cast<size_t>(begin), static_cast<size_t>(end));
    entry->model.To(s.device);                          // ShareParameters below copies CPU parameters onto it
    entry->model.SetWeightCasts(&entry->weight_casts);  // its parameters are never written in place
  }
  ModelLease lease(cache_key, std::move(entry));
  if (lease->params_key != params_key) {
    lease->params_key = 0;
    COPSE_ASSIGN_OR_RETURN(NamedTensors params, ReadTensorMessage(params_msg));
    COPSE_RETURN_NOT_OK(lease->model.ShareParameters(params));
    lease->loss_scale = LossScaleIn(params, s.initial_loss_scale).scale;
    lease->params_key = params_key;
  }
  return lease;
}

ForwardContext StepContext(const TrainSettings& s, int64_t step, int part) {
  const auto [epoch, k] = EpochAndStep(s, step);
  ForwardContext fc;
  fc.seed = MixSeed(MixSeed(s.seed, static_cast<uint64_t>(epoch), static_cast<uint64_t>(k)), static_cast<uint64_t>(part));
  fc.precision = s.precision;
  return fc;
}

namespace {

/// Whether layer `index` of `model` takes a bfloat16 input as it is; the layers' kinds are
/// read once per model and process.
bool TakesBFloat16At(const std::string& model, int index) {
  static std::mutex mu;
  static std::map<std::string, std::vector<bool>> kinds;
  std::lock_guard<std::mutex> lock(mu);
  auto it = kinds.find(model);
  if (it == kinds.end()) {
    std::vector<bool> takes;
    if (auto layers = BuildModelLayers(model); layers.ok())
      for (size_t i = 0; i < layers->size(); ++i) takes.push_back(layers->layer(i).TakesBFloat16());
    it = kinds.emplace(model, std::move(takes)).first;
  }
  return index >= 0 && static_cast<size_t>(index) < it->second.size() && it->second[static_cast<size_t>(index)];
}

}  // namespace

Tensor BoundaryTensor(const TrainSettings& s, int next, const Tensor& t) {
  return s.precision == Precision::kBFloat16 && TakesBFloat16At(s.model, next) ? t.Cast(DType::kBFloat16) : t;
}

LossScale LossScaleIn(const NamedTensors& set, float initial) {
  LossScale s{initial, 0};
  if (const Tensor* t = FindTensor(set, "__loss_scale"); t && t->numel() >= 1) {
    const std::vector<float> v = t->ToVector();
    if (std::isfinite(v[0]) && v[0] > 0) s.scale = v[0];
    if (v.size() > 1 && v[1] >= 0) s.good_steps = static_cast<int64_t>(v[1]);
  }
  return s;
}

Tensor Scalars(const std::vector<float>& v) { return Tensor::FromVector({static_cast<int64_t>(v.size())}, v); }

std::vector<float> ReadScalars(const Tensor* t, size_t n) {
  std::vector<float> out(n, 0.0f);
  if (t) {
    const std::vector<float> v = t->ToVector();  // any type a message may carry
    for (size_t i = 0; i < n && i < v.size(); ++i) out[i] = v[i];
  }
  return out;
}

NamedTensors HostCopies(const NamedTensors& tensors) {
  NamedTensors out;
  out.reserve(tensors.size());
  for (const auto& [name, t] : tensors) out.emplace_back(name, t.To(CpuDevice()));
  return out;
}

namespace {

/// Each parameter's `field` (value or grad) under its name, sharing storage.
NamedTensors Handles(const Sequential& m, Tensor Parameter::*field) {
  NamedTensors out;
  const auto names = m.ParameterNames();
  const auto params = m.Parameters();
  for (size_t i = 0; i < params.size(); ++i) out.emplace_back(names[i], params[i]->*field);
  return out;
}

}  // namespace

const Tensor* FindTensor(const NamedTensors& set, std::string_view name) {
  for (const auto& [n, t] : set)
    if (n == name) return &t;
  return nullptr;
}

NamedTensors GradientHandles(const Sequential& m) { return Handles(m, &Parameter::grad); }
NamedTensors ParameterHandles(const Sequential& m) { return Handles(m, &Parameter::value); }

Result<std::vector<chan::Buffer>> ReadAll(vertex::VertexContext& ctx, size_t port) {
  if (port >= ctx.num_inputs()) return Status::InvalidArgument(ctx.name + ": expected an input on port " + std::to_string(port));
  std::vector<chan::Buffer> out;
  while (true) {
    COPSE_ASSIGN_OR_RETURN(auto msg, ctx.input(port).Next());
    if (!msg) break;
    out.push_back(std::move(*msg));
  }
  return out;
}

Result<chan::Buffer> ReadOne(vertex::VertexContext& ctx, size_t port) {
  COPSE_ASSIGN_OR_RETURN(auto all, ReadAll(ctx, port));
  if (all.size() != 1)
    return Status::DataLoss(ctx.name + ": input " + std::to_string(port) + " has " + std::to_string(all.size()) +
                            " messages, expected 1");
  return all[0];
}

Result<chan::Buffer> ReadParams(vertex::VertexContext& ctx, size_t port) {
  COPSE_ASSIGN_OR_RETURN(auto all, ReadAll(ctx, port));
  if (all.size() != 1 && all.size() != 3)
    return Status::DataLoss(ctx.name + ": input " + std::to_string(port) + " has " + std::to_string(all.size()) +
                            " messages, expected parameters (1) or a chain (3)");
  return all[0];
}

int64_t WallMicros() {
  return std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

TraceSpan::TraceSpan(const vertex::VertexContext& ctx) : start_us_(WallMicros()) {
  if (std::getenv("COPSE_ML_TRACE")) name_ = ctx.name;
}

TraceSpan::~TraceSpan() {
  if (name_.empty()) return;
  const char* path = std::getenv("COPSE_ML_TRACE");
  const std::string line =
      name_ + " " + std::to_string(start_us_) + " " + std::to_string(WallMicros()) + " " + std::to_string(getpid()) + "\n";
  const int fd = ::open(path, O_WRONLY | O_CREAT | O_APPEND, 0644);
  if (fd < 0) return;
  (void)!::write(fd, line.data(), line.size());  // one write: O_APPEND keeps lines whole
  ::close(fd);
}

}  // namespace copse::ml::programs
