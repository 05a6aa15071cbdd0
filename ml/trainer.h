#pragma once
// The single-process reference trainer: the figures graph-based training (data-parallel,
// pipeline) is compared with. Trains a model from ml/models.h with SGD (PyTorch semantics),
// Adam or AdamW — an image model on Fashion-MNIST, evaluated for test accuracy after every
// epoch; a language model ("gpt:...") on the fortunes text (ml/text_corpus.h), evaluated for
// validation loss, with a sample of generated text at the end — and reports loss and
// throughput (images/s, or tokens/s for text), in float32 or mixed bfloat16. Deterministic: the same options give bit-identical
// parameters (shuffles from (seed, epoch), initialization from (seed, layer), no data races).
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
  std::string optimizer = "sgd";  // sgd | adam | adamw
  int threads = 2;
  uint64_t seed = 1;
  std::string device = "cpu";  // cpu | cuda | cuda:N
  // Matrix products in fp32, or bf16 (mixed precision, ml/dtype.h: float32 parameters, optimizer
  // and elementwise work; evaluation in float32).
  std::string precision = "fp32";
  std::string data_dir = kFashionMnistDir;
  std::string text_dir = "/usr/share/games/fortunes";  // the corpus of language models
  int64_t limit = -1;                                  // training examples (images, text windows) used (all when < 0)
  int64_t test_limit = -1;                             // test images or validation windows used (all when < 0)
  bool evaluate = true;                                // test accuracy (validation loss) after every epoch
  int64_t max_steps = 0;                               // stop after this many steps in all (0: run every epoch)
  // The learning rate: constant, or (lr_schedule "cosine") a linear warmup over warmup_steps
  // then a cosine decay to min_lr at the last step (WarmupCosineLr).
  std::string lr_schedule = "constant";  // constant | cosine
  int64_t warmup_steps = 0;
  float min_lr = 0.0f;
  float clip_norm = 0.0f;            // clip the gradients' global L2 norm to this (0: never)
  float init_loss_scale = 65536.0f;  // fp16: the loss scale of the first step (ml/loss_scaler.h)
  int sample_bytes = 200;            // language models: bytes of text generated at the end (0: none)
  std::string sample_prompt = "\n";  // ... continuing this prompt
  float sample_temperature = 0.8f;
};

struct EpochReport {
  int epoch = 0;               // from 1
  double loss = 0;             // mean training loss over the epoch (per image or token)
  double test_accuracy = 0;    // 0..1 (0 when not evaluated, and for language models)
  double validation_loss = 0;  // language models: mean loss per validation token
  double images_per_s = 0;     // training throughput of this epoch (tokens/s for text)
  double seconds = 0;
};

/// Reported every `progress_every` steps and at the end of each epoch.
struct TrainProgress {
  int epoch = 0;
  int64_t step = 0;  // within the epoch, from 1
  int64_t steps_per_epoch = 0;
  double loss = 0;                          // running mean over the epoch so far
  double images_per_s = 0;                  // tokens/s for text
  float lr = 0;                             // of the last step
  const EpochReport* epoch_done = nullptr;  // set at the end of an epoch
};

struct TrainReport {
  std::vector<EpochReport> epochs;
  double final_loss = 0;     // mean loss of the last epoch
  double test_accuracy = 0;  // after the last epoch
  double images_per_s = 0;   // over all epochs (tokens/s for text)
  double train_seconds = 0;
  int64_t train_images = 0;  // per epoch (text: windows)
  int64_t steps = 0;         // optimizer steps taken
  // Language models only:
  bool language_model = false;
  int64_t train_tokens = 0;    // trained on, in all
  double validation_loss = 0;  // after the last step
  double perplexity = 0;       // exp(validation_loss)
  std::string sample;          // text the model wrote at the end, after options.sample_prompt
  int64_t parameters = 0;
  std::string model_description;
  std::string precision;  // as trained
  // fp16 only (dynamic loss scaling, ml/loss_scaler.h): steps skipped for gradients that
  // overflowed, and the loss scale at the end.
  int64_t skipped_steps = 0;
  float loss_scale = 0;
  std::string parameter_digest;   // Digest() of the final parameters
  NamedTensors final_parameters;  // host copies
};

using ProgressCallback = std::function<void(const TrainProgress&)>;

Result<TrainReport> Train(const TrainOptions& options, const ProgressCallback& progress = {}, int64_t progress_every = 100);

/// Fraction of `data` the model classifies correctly (evaluated in batches of `batch`).
Result<double> Evaluate(const class Sequential& model, const Dataset& data, int64_t batch = 1000);

}  // namespace copse::ml
