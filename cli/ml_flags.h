#pragma once
// Flags `copse train` and `copse graph` share that name ML settings (only those two include it:
// the client binary has no ml/).
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

}  // namespace copse::cli
