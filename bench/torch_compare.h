#pragma once
// What the benchmarks that run PyTorch beside copse share (ml_train_bench, gpt_bench,
// mixed_precision_bench): the interpreter that has Debian's python3-torch, a command's standard
// output, medians, and the GPT training recipe both sides follow.
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

#include "ml/trainer.h"

namespace copse::bench {

/// The median (the mean of the middle two for an even count); 0 for none.
inline double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/// $COPSE_PYTHON, else the system interpreter (Debian's python3-torch lives there, which a
/// pyenv shim on PATH may hide), else python3.
inline std::string Python() {
  if (const char* p = std::getenv("COPSE_PYTHON")) return p;
  if (access("/usr/bin/python3", X_OK) == 0) return "/usr/bin/python3";
  return "python3";
}

/// What `cmd` printed, or nothing when it could not run or exited non-zero (torch missing: 3).
inline std::optional<std::string> CommandOutput(const std::string& cmd) {
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) return std::nullopt;
  std::string out;
  std::array<char, 4096> buf;
  while (size_t n = fread(buf.data(), 1, buf.size(), p)) out.append(buf.data(), n);
  if (pclose(p) != 0) return std::nullopt;
  return out;
}

/// The GPT recipe of gpt_bench (and scripts/torch_gpt.py): batch 16, AdamW lr 3e-3 with weight
/// decay 0.1, a 20-step warmup and cosine decay to 3e-4, gradients clipped to norm 1, `steps`
/// steps, validation loss on the first 500 windows, no sample.
inline ml::TrainOptions GptRecipe(const std::string& model, int steps, int threads) {
  ml::TrainOptions o;
  o.model = model;
  o.optimizer = "adamw";
  o.lr = 3e-3f;
  o.min_lr = 3e-4f;
  o.weight_decay = 0.1f;
  o.lr_schedule = "cosine";
  o.warmup_steps = 20;
  o.clip_norm = 1.0f;
  o.batch = 16;
  o.max_steps = steps;
  o.threads = threads;
  o.test_limit = 500;
  o.sample_bytes = 0;
  return o;
}

}  // namespace copse::bench
