#include "cli/train_command.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/ml_flags.h"
#include "common/allocator_name.h"
#include "ml/trainer.h"
#include "ml/transformer.h"

namespace copse::cli {
namespace {

struct TrainFlags {
  ml::TrainOptions options;
  std::string output = "text";
  long long progress_every = 100;
};

/// fp16's dynamic loss scaling, in a line of its own before "done:".
void PrintLossScaling(const ml::TrainReport& r) {
  if (r.precision != "fp16") return;
  std::printf("fp16: %lld steps skipped for overflowed gradients, loss scale %g at the end\n",
              static_cast<long long>(r.skipped_steps), r.loss_scale);
}

int RunTrain(const TrainFlags& flags) {
  const bool json = flags.output == "json";
  const bool lm = ml::IsLanguageModel(flags.options.model);
  const char* unit = lm ? "tokens/s" : "images/s";
  auto progress = [&](const ml::TrainProgress& p) {
    if (json) return;
    if (p.epoch_done && lm) {
      std::printf("epoch %d: loss %.4f  validation loss %.4f (perplexity %.2f)  %.0f tokens/s  (%.1f s)\n", p.epoch,
                  p.epoch_done->loss, p.epoch_done->validation_loss, std::exp(p.epoch_done->validation_loss),
                  p.epoch_done->images_per_s, p.epoch_done->seconds);
    } else if (p.epoch_done) {
      std::printf("epoch %d: loss %.4f  test accuracy %.2f %%  %.0f images/s  (%.1f s)\n", p.epoch, p.epoch_done->loss,
                  100.0 * p.epoch_done->test_accuracy, p.epoch_done->images_per_s, p.epoch_done->seconds);
    } else {
      std::printf("epoch %d step %lld/%lld: loss %.4f  %.0f %s  lr %.3g\n", p.epoch, static_cast<long long>(p.step),
                  static_cast<long long>(p.steps_per_epoch), p.loss, p.images_per_s, unit, p.lr);
    }
    std::fflush(stdout);
  };
  auto report = ml::Train(flags.options, progress, flags.progress_every);
  if (!report.ok()) {
    std::fprintf(stderr, "copse train: %s\n", report.status().ToString().c_str());
    return 1;
  }
  const ml::TrainReport& r = *report;
  if (json) {
    nlohmann::json epochs = nlohmann::json::array();
    for (const auto& e : r.epochs)
      epochs.push_back({{"epoch", e.epoch},
                        {"loss", e.loss},
                        {"test_accuracy", e.test_accuracy},
                        {"images_per_s", e.images_per_s},
                        {"seconds", e.seconds}});
    nlohmann::json out = {
        {"model", flags.options.model},
        {"model_description", r.model_description},
        {"parameters", r.parameters},
        {"device", flags.options.device},
        {"precision", r.precision},
        {"threads", flags.options.threads},
        {"allocator", AllocatorName()},
        {"seed", flags.options.seed},
        {"epochs", epochs},
        {"train_images", r.train_images},
        {"test_accuracy", r.test_accuracy},
        {"final_loss", r.final_loss},
        {"images_per_s", r.images_per_s},
        {"train_seconds", r.train_seconds},
        {"parameter_digest", r.parameter_digest},
    };
    if (r.precision == "fp16") {
      out["skipped_steps"] = r.skipped_steps;
      out["loss_scale"] = r.loss_scale;
    }
    if (r.language_model) {
      out["steps"] = r.steps;
      out["train_tokens"] = r.train_tokens;
      out["tokens_per_s"] = r.images_per_s;
      out["validation_loss"] = r.validation_loss;
      out["perplexity"] = r.perplexity;
      out["sample"] = r.sample;
    }
    std::printf("%s\n", out.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
  } else if (r.language_model) {
    PrintLossScaling(r);
    std::printf("done: %s, %lld parameters; %lld steps, final loss %.4f, validation loss %.4f (perplexity %.2f), %.0f tokens/s\n",
                r.model_description.c_str(), static_cast<long long>(r.parameters), static_cast<long long>(r.steps), r.final_loss,
                r.validation_loss, r.perplexity, r.images_per_s);
    if (!r.sample.empty()) std::printf("sample:\n%s%s\n", flags.options.sample_prompt.c_str(), r.sample.c_str());
  } else {
    PrintLossScaling(r);
    std::printf("done: %s, %lld parameters; test accuracy %.2f %%, final loss %.4f, %.0f images/s\n", r.model_description.c_str(),
                static_cast<long long>(r.parameters), 100.0 * r.test_accuracy, r.final_loss, r.images_per_s);
  }
  return 0;
}

}  // namespace

void AddTrainCommand(CLI::App& app) {
  auto flags = std::make_shared<TrainFlags>();
  ml::TrainOptions& o = flags->options;
  CLI::App* cmd = app.add_subcommand(
      "train", "Train a model in this process (the single-process reference): images on Fashion-MNIST, gpt on text");
  cmd->add_option("--model", o.model,
                  "mlp (784-1024-1024-10), cnn, mlp:A-B-...-Z, or gpt:LAYERS-WIDTH-HEADS-CONTEXT[,dropout=P] (a "
                  "byte-level transformer trained on the fortunes text)")
      ->capture_default_str();
  cmd->add_option("--epochs", o.epochs, "Passes over the training set")->check(CLI::Range(1, 1000000))->capture_default_str();
  cmd->add_option("--batch", o.batch, "Batch size")->check(CLI::Range(1, 1 << 20))->capture_default_str();
  cmd->add_option("--lr", o.lr, "Learning rate")->check(FiniteFrom(0, false))->capture_default_str();
  cmd->add_option("--momentum", o.momentum, "SGD momentum (PyTorch semantics)")
      ->check(Finite())
      ->check(CLI::Range(0.0, 0.999999))
      ->capture_default_str();
  cmd->add_option("--weight-decay", o.weight_decay, "L2 weight decay")->check(FiniteFrom(0, true))->capture_default_str();
  cmd->add_option("--optimizer", o.optimizer, "sgd, adam, or adamw (decoupled weight decay)")
      ->check(CLI::IsMember({"sgd", "adam", "adamw"}))
      ->capture_default_str();
  cmd->add_option("--steps", o.max_steps, "Stop after this many steps in all (0: every epoch)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 40))
      ->capture_default_str();
  AddScheduleFlags(cmd, o.lr_schedule, o.warmup_steps, o.min_lr, o.clip_norm,
                   "Clip the gradients' global L2 norm to this (0: never)");
  cmd->add_option("--text-dir", o.text_dir, "Directory of fortune files: the text gpt models train on")->capture_default_str();
  cmd->add_option("--sample-bytes", o.sample_bytes, "gpt: bytes of text to generate at the end (0: none)")
      ->check(CLI::Range(0, 1 << 20))
      ->capture_default_str();
  cmd->add_option("--sample-prompt", o.sample_prompt, "gpt: the text the sample continues");
  cmd->add_option("--temperature", o.sample_temperature, "gpt: sampling temperature (0: greedy)")
      ->check(FiniteFrom(0, true))
      ->capture_default_str();
  cmd->add_option("--threads", o.threads, "CPU threads")->check(CLI::Range(1, 1024))->capture_default_str();
  cmd->add_option("--seed", o.seed, "Seed of initialization, shuffling and dropout")->check(Unsigned64())->capture_default_str();
  cmd->add_option("--device", o.device, "cpu, cuda or cuda:N")->capture_default_str();
  AddPrecisionFlag(cmd, o.precision);
  AddInitLossScaleFlag(cmd, o.init_loss_scale);
  cmd->add_option("--data-dir", o.data_dir, "Directory with the Fashion-MNIST IDX .gz files")->capture_default_str();
  cmd->add_option("--limit", o.limit, "Use only the first N training images (text windows)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 40));
  cmd->add_option("--test-limit", o.test_limit, "Use only the first N test images (validation windows)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 40));
  cmd->add_option("--progress-every", flags->progress_every, "Steps between progress lines")
      ->check(CLI::Range(0, std::numeric_limits<int>::max()))
      ->capture_default_str();
  cmd->add_option("-o,--format", flags->output, "text, or json: one JSON value at the end")
      ->check(CLI::IsMember({"text", "json"}))
      ->capture_default_str();
  cmd->callback([flags] { std::exit(RunTrain(*flags)); });
}

}  // namespace copse::cli
