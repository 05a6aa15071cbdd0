#pragma once
// Flags `copse train` and `copse graph` share that name ML settings (only those two include it:
// the client binary has no ml/).
#include <cmath>
#include <string>

#include <CLI/CLI.hpp>

#include "ml/dtype.h"

namespace copse::cli {

/// --precision (ml/dtype.h says what each value means).
inline void AddPrecisionFlag(CLI::App* cmd, std::string& precision) {
  cmd->add_option("--precision", precision,
                  "Matrix products in fp32; or bf16 or fp16: mixed precision with float32 parameters, optimizer and "
                  "elementwise work (fp16 with dynamic loss scaling; fast on GPUs, emulated on CPUs)")
      ->check(CLI::Validator(
          [](std::string& text) -> std::string {
            const auto p = ml::ParsePrecision(text);
            return p.ok() ? "" : p.status().message();
          },
          "fp32|bf16|fp16"))
      ->capture_default_str();
}

/// --init-loss-scale: fp16's first loss scale (ml/loss_scaler.h), as PyTorch GradScaler's init_scale.
template <typename Number>
void AddInitLossScaleFlag(CLI::App* cmd, Number& scale) {
  cmd->add_option("--init-loss-scale", scale,
                  "fp16: the loss scale of the first step (halved on every overflow, doubled after 2000 good steps)")
      ->check(CLI::Validator(
          [](std::string& text) -> std::string {
            try {
              const double v = std::stod(text);
              return std::isfinite(v) && v > 0 ? "" : "expected a finite number > 0";
            } catch (const std::exception&) {
              return "expected a number";
            }
          },
          "S > 0"))
      ->capture_default_str();
}

}  // namespace copse::cli
