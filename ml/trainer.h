#pragma once
// The single-process reference trainer: the figures graph-based training (data-parallel,
// pipeline) is compared with. Trains a model from ml/models.h on Fashion-MNIST with SGD
// (PyTorch semantics) or Adam, evaluates on the test set after every epoch, and reports loss,
// accuracy and throughput. Deterministic: the same options give bit-identical parameters
// (shuffles from (seed, epoch), initialization from (seed, layer), no data races).
//
//   TrainOptions o;  o.model = "mlp";  o.epochs = 1;
//   Result<TrainReport> r = Train(o, [](const TrainProgress& p) { ... });
//
// Thread-safety: Train may run concurrently with other code, but it sets the process-wide
// OpenBLAS thread count (SetCpuThreads).
#include <functional>
#include <string>
#include <vector>

#include "ml/dataset.h"
#include "ml/tensor.h"

namespace copse::ml {

struct TrainOptions {
  std::string model = "mlp";  // see BuildModel
  int epochs = 1;
  int batch = 128;
  float lr = 0.05f;
  float momentum = 0.9f;
  float weight_decay = 0.0f;
  std::string optimizer = "sgd";  // sgd | adam
  int threads = 2;
  uint64_t seed = 1;
  std::string device = "cpu";  // cpu | cuda | cuda:N
  std::string data_dir = kFashionMnistDir;
  int64_t limit = -1;       // training images used (all when < 0)
  int64_t test_limit = -1;  // test images used (all when < 0)
  bool evaluate = true;     // test accuracy after every epoch
};

struct EpochReport {
  int epoch = 0;             // from 1
  double loss = 0;           // mean training loss over the epoch
  double test_accuracy = 0;  // 0..1 (0 when not evaluated)
  double images_per_s = 0;   // training throughput of this epoch (evaluation excluded)
  double seconds = 0;
};

/// Reported every `progress_every` steps and at the end of each epoch.
struct TrainProgress {
  int epoch = 0;
  int64_t step = 0;  // within the epoch, from 1
  int64_t steps_per_epoch = 0;
  double loss = 0;  // running mean over the epoch so far
  double images_per_s = 0;
  const EpochReport* epoch_done = nullptr;  // set at the end of an epoch
};

struct TrainReport {
  std::vector<EpochReport> epochs;
  double final_loss = 0;     // mean loss of the last epoch
  double test_accuracy = 0;  // after the last epoch
  double images_per_s = 0;   // over all epochs
  double train_seconds = 0;
  int64_t train_images = 0;  // per epoch
  int64_t parameters = 0;
  std::string model_description;
  std::string parameter_digest;   // Digest() of the final parameters
  NamedTensors final_parameters;  // host copies
};

using ProgressCallback = std::function<void(const TrainProgress&)>;

Result<TrainReport> Train(const TrainOptions& options, const ProgressCallback& progress = {}, int64_t progress_every = 100);

/// Fraction of `data` the model classifies correctly (evaluated in batches of `batch`).
Result<double> Evaluate(const class Sequential& model, const Dataset& data, int64_t batch = 1000);

}  // namespace copse::ml
