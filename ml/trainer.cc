#include "ml/trainer.h"

#include <chrono>
#include <cmath>
#include <memory>

#include "common/logging.h"
#include "ml/language_model.h"
#include "ml/loss.h"
#include "ml/loss_scaler.h"
#include "ml/models.h"
#include "ml/optimizer.h"
#include "ml/philox.h"
#include "ml/sequential.h"
#include "ml/serialize.h"
#include "ml/text_corpus.h"
#include "ml/transformer.h"

namespace copse::ml {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }

Status Validate(const TrainOptions& o) {
  if (o.epochs < 1) return Status::InvalidArgument("--epochs must be >= 1");
  if (o.batch < 1) return Status::InvalidArgument("--batch must be >= 1");
  if (!(o.lr > 0)) return Status::InvalidArgument("--lr must be > 0");
  if (o.momentum < 0 || o.momentum >= 1) return Status::InvalidArgument("--momentum must be in [0, 1)");
  if (o.threads < 1) return Status::InvalidArgument("--threads must be >= 1");
  if (o.optimizer != "sgd" && o.optimizer != "adam" && o.optimizer != "adamw")
    return Status::InvalidArgument("--optimizer must be sgd, adam or adamw");
  if (o.limit == 0) return Status::InvalidArgument("--limit must be > 0");
  if (o.max_steps < 0) return Status::InvalidArgument("--steps must be >= 0");
  if (o.lr_schedule != "constant" && o.lr_schedule != "cosine")
    return Status::InvalidArgument("--lr-schedule must be constant or cosine");
  if (o.warmup_steps < 0) return Status::InvalidArgument("--warmup-steps must be >= 0");
  if (auto p = ParsePrecision(o.precision); !p.ok()) return p.status().WithContext("--precision");
  if (o.min_lr < 0 || o.min_lr > o.lr) return Status::InvalidArgument("--min-lr must be in [0, --lr]");
  if (o.clip_norm < 0) return Status::InvalidArgument("--clip-norm must be >= 0");
  if (!(o.init_loss_scale > 0) || !std::isfinite(o.init_loss_scale))
    return Status::InvalidArgument("--init-loss-scale must be a finite number > 0");
  if (o.init_loss_scale != LossScale::kInitial && o.precision != "fp16")
    return Status::InvalidArgument("--init-loss-scale is for --precision fp16 (its dynamic loss scaling)");
  if (IsLanguageModel(o.model) && o.sample_bytes > 0 && o.sample_prompt.empty())
    return Status::InvalidArgument("--sample-prompt must not be empty");
  return Status::OK();
}

/// The training and evaluation sets of `model`: Fashion-MNIST, or windows of the text corpus.
Status LoadData(const TrainOptions& o, Dataset* train, Dataset* test) {
  if (IsLanguageModel(o.model)) {
    COPSE_ASSIGN_OR_RETURN(GptSpec spec, ParseGptSpec(o.model));
    COPSE_ASSIGN_OR_RETURN(*train, LoadTextSplit(o.text_dir, Split::kTrain, spec.context, o.limit));
    if (o.evaluate) {
      COPSE_ASSIGN_OR_RETURN(*test, LoadTextSplit(o.text_dir, Split::kTest, spec.context, o.test_limit));
    }
    return Status::OK();
  }
  DatasetOptions train_opts, test_opts;
  train_opts.limit = o.limit;
  test_opts.limit = o.test_limit;
  COPSE_ASSIGN_OR_RETURN(*train, LoadFashionMnist(o.data_dir, Split::kTrain, train_opts));
  if (train->size() == 0) return Status::InvalidArgument("the training set in " + o.data_dir + " has no images");
  if (o.evaluate) {
    COPSE_ASSIGN_OR_RETURN(*test, LoadFashionMnist(o.data_dir, Split::kTest, test_opts));
    // An accuracy over no images would be reported as 0 %, as if the model were wrong.
    if (test->size() == 0) return Status::InvalidArgument("the test set in " + o.data_dir + " has no images");
  }
  return Status::OK();
}

}  // namespace

Result<double> Evaluate(const Sequential& model, const Dataset& data, int64_t batch) {
  if (data.size() == 0) return 0.0;
  int64_t correct = 0;
  for (int64_t b = 0; b < data.size(); b += batch) {
    const Batch x = data.Range(b, std::min(data.size(), b + batch), model.device());
    COPSE_ASSIGN_OR_RETURN(Tensor logits, model.Predict(x.images));
    correct += CountCorrect(logits, x.labels);
  }
  return static_cast<double>(correct) / static_cast<double>(data.size());
}

Result<TrainReport> Train(const TrainOptions& o, const ProgressCallback& progress, int64_t progress_every) {
  COPSE_RETURN_NOT_OK(Validate(o));
  auto log = Logger("ml");
  SetCpuThreads(o.threads);
  COPSE_ASSIGN_OR_RETURN(Device * device, DeviceByName(o.device));
  const Precision precision = *ParsePrecision(o.precision);

  const bool lm = IsLanguageModel(o.model);
  COPSE_ASSIGN_OR_RETURN(Sequential model, BuildModel(o.model, o.seed));  // checks the spec first
  Dataset train, test;
  COPSE_RETURN_NOT_OK(LoadData(o, &train, &test));
  model.To(device);
  std::unique_ptr<Optimizer> opt;
  if (o.optimizer == "adam" || o.optimizer == "adamw") {
    AdamOptions a;
    a.lr = o.lr;
    a.weight_decay = o.weight_decay;
    a.decoupled_weight_decay = o.optimizer == "adamw";
    opt = std::make_unique<Adam>(model.Parameters(), a);
  } else {
    SgdOptions s;
    s.lr = o.lr;
    s.momentum = o.momentum;
    s.weight_decay = o.weight_decay;
    opt = std::make_unique<Sgd>(model.Parameters(), s);
  }
  log->info("train model={} ({} parameters) device={} precision={} threads={} images={} batch={}", o.model, model.NumParameters(),
            device->name(), PrecisionName(precision), o.threads, train.size(), o.batch);

  TrainReport report;
  report.train_images = train.size();
  report.parameters = model.NumParameters();
  report.model_description = model.Describe();
  report.precision = PrecisionName(precision);
  report.language_model = lm;
  const int64_t steps_per_epoch = (train.size() + o.batch - 1) / o.batch;
  const int64_t total_steps =
      o.max_steps > 0 ? std::min<int64_t>(o.max_steps, steps_per_epoch * o.epochs) : steps_per_epoch * o.epochs;
  const auto params = model.Parameters();
  const bool fp16 = precision == Precision::kFloat16;
  LossScale loss_scale{o.init_loss_scale, 0};  // fp16's dynamic loss scaling
  int64_t global_step = 0, rows_trained = 0;   // rows: images, or tokens
  Stash stash;
  for (int epoch = 1; epoch <= o.epochs && global_step < total_steps; ++epoch) {
    const std::vector<int64_t> order = EpochOrder(train.size(), o.seed, epoch);
    const auto batches = MakeBatches(order, o.batch);
    const auto start = Clock::now();
    double loss_sum = 0;
    int64_t seen = 0, step = 0;
    for (const auto& idx : batches) {
      if (global_step == total_steps) break;
      ++step;
      if (o.lr_schedule == "cosine") opt->set_lr(WarmupCosineLr(global_step, o.warmup_steps, total_steps, o.lr, o.min_lr));
      ++global_step;
      const Batch b = train.Gather(idx, device);
      ForwardContext ctx;
      ctx.training = true;
      ctx.seed = MixSeed(o.seed, static_cast<uint64_t>(epoch), static_cast<uint64_t>(step));
      ctx.precision = precision;
      COPSE_ASSIGN_OR_RETURN(Tensor logits, model.Forward(b.images, ctx, &stash));
      COPSE_ASSIGN_OR_RETURN(LossOutput loss, CrossEntropyLoss(logits, b.labels));
      if (fp16) ScaleLossGradient(loss.grad, loss_scale);
      COPSE_RETURN_NOT_OK(model.Backward(loss.grad, stash, /*need_input_grad=*/false, /*accumulate=*/false).status());
      bool finite = true;
      if (fp16) {
        finite = UnscaleGradients(params, loss_scale);
        loss_scale = loss_scale.Next(finite);
        report.skipped_steps += finite ? 0 : 1;
      }
      if (finite) {  // else fp16 overflowed: the step is skipped, at half the scale next time
        if (o.clip_norm > 0) ClipGradNorm(params, o.clip_norm);
        opt->Step();
      }
      loss_sum += loss.loss * static_cast<double>(b.size());
      seen += b.size();
      if (progress && progress_every > 0 && step % progress_every == 0 && step != static_cast<int64_t>(batches.size())) {
        TrainProgress p;
        p.epoch = epoch;
        p.step = step;
        p.steps_per_epoch = static_cast<int64_t>(batches.size());
        p.loss = loss_sum / static_cast<double>(seen);
        p.images_per_s = static_cast<double>(seen) / Seconds(start, Clock::now());
        p.lr = opt->lr();
        progress(p);
      }
    }
    report.loss_scale = fp16 ? loss_scale.scale : 0.0f;
    report.steps = global_step;
    report.train_tokens += lm ? seen : 0;
    rows_trained += seen;
    device->Synchronize();
    EpochReport er;
    er.epoch = epoch;
    er.seconds = Seconds(start, Clock::now());
    er.loss = seen ? loss_sum / static_cast<double>(seen) : 0.0;
    er.images_per_s = static_cast<double>(seen) / er.seconds;
    report.train_seconds += er.seconds;
    if (o.evaluate && lm) {
      COPSE_ASSIGN_OR_RETURN(er.validation_loss, EvaluateLoss(model, test));
    } else if (o.evaluate) {
      COPSE_ASSIGN_OR_RETURN(er.test_accuracy, Evaluate(model, test));
    }
    log->info("epoch={} loss={:.4f} test_accuracy={:.4f} validation_loss={:.4f} per_s={:.0f}", epoch, er.loss, er.test_accuracy,
              er.validation_loss, er.images_per_s);
    report.epochs.push_back(er);
    if (progress) {
      TrainProgress p;
      p.epoch = epoch;
      p.step = step;
      p.steps_per_epoch = step;
      p.loss = er.loss;
      p.images_per_s = er.images_per_s;
      p.lr = opt->lr();
      p.epoch_done = &report.epochs.back();
      progress(p);
    }
  }
  report.final_loss = report.epochs.back().loss;
  report.test_accuracy = report.epochs.back().test_accuracy;
  report.images_per_s = report.train_seconds > 0 ? static_cast<double>(rows_trained) / report.train_seconds : 0.0;
  if (lm) {
    report.validation_loss = report.epochs.back().validation_loss;
    report.perplexity = o.evaluate ? std::exp(report.validation_loss) : 0.0;  // 0: not evaluated
    if (o.sample_bytes > 0) {
      COPSE_ASSIGN_OR_RETURN(GptSpec spec, ParseGptSpec(o.model));
      COPSE_ASSIGN_OR_RETURN(report.sample,
                             GenerateText(model, spec.context, o.sample_prompt, o.sample_bytes, o.sample_temperature, o.seed));
    }
  }
  report.final_parameters = model.ExportParameters(/*host=*/true);
  report.parameter_digest = Digest(report.final_parameters);
  return report;
}

}  // namespace copse::ml
