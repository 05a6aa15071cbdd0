#pragma once
// Each `copse` verb lives in its own file and adds itself to the CLI11 app through one of
// these functions. Callbacks set the process exit code through ExitCode().
#include <charconv>
#include <cmath>
#include <cstdint>
#include <sstream>
#include <string>

#include <CLI/CLI.hpp>

namespace copse::cli {

void AddValidateCommand(CLI::App& app);
void AddProgramsCommand(CLI::App& app);
void AddJmCommand(CLI::App& app);
void AddDaemonCommand(CLI::App& app);
void AddClientCommands(CLI::App& app);
void AddRunCommand(CLI::App& app);

/// Rejects NaN and infinities in a floating-point flag: CLI11's Range and PositiveNumber let
/// NaN through (every comparison with it is false). Chain it before them.
inline CLI::Validator Finite() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        double d = 0;
        if (!CLI::detail::lexical_cast(text, d) || !std::isfinite(d)) return "expected a finite number, got " + text;
        return "";
      },
      "FINITE");
}

/// A finite number above `floor` (or equal to it, with `or_equal`), said in those words: CLI11's
/// PositiveNumber names its bound as a 309-digit double.
inline CLI::Validator FiniteFrom(double floor, bool or_equal) {
  return CLI::Validator(
      [floor, or_equal](std::string& text) -> std::string {
        double d = 0;
        if (!CLI::detail::lexical_cast(text, d) || !std::isfinite(d) || d < floor || (!or_equal && d == floor)) {
          std::ostringstream want;
          want << "expected a finite number " << (or_equal ? ">= " : "> ") << floor << ", got " << text;
          return want.str();
        }
        return "";
      },
      std::string(or_equal ? "NUMBER>=" : "NUMBER>") + CLI::detail::to_string(floor));
}

/// Accepts only a decimal number from 0 to 2^64 - 1 for an unsigned flag (a seed): CLI11 reads
/// "-1" as 2^64 - 1 and saturates what is larger.
inline CLI::Validator Unsigned64() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        uint64_t value = 0;
        const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
        if (ec != std::errc() || end != text.data() + text.size()) return "expected a whole number from 0 to 2^64-1, got " + text;
        return "";
      },
      "UINT64");
}

/// The exit code a command's callback sets: 0 success, 1 the job or the input failed,
/// 2 usage error (main() maps CLI11's parse errors to 2).
int& ExitCode();

/// The learning-rate schedule and clipping flags `copse train` and `copse graph` share:
/// --lr-schedule, --warmup-steps, --min-lr and --clip-norm (`clip_help` says where it applies).
template <typename Real>
void AddScheduleFlags(CLI::App* cmd, std::string& schedule, int64_t& warmup_steps, Real& min_lr, Real& clip_norm,
                      const std::string& clip_help) {
  cmd->add_option("--lr-schedule", schedule, "constant, or cosine: linear warmup then cosine decay to --min-lr")
      ->check(CLI::IsMember({"constant", "cosine"}))
      ->capture_default_str();
  cmd->add_option("--warmup-steps", warmup_steps, "Warmup steps of the cosine schedule")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 40))
      ->capture_default_str();
  cmd->add_option("--min-lr", min_lr, "Learning rate at the end of the cosine schedule")
      ->check(FiniteFrom(0, true))
      ->capture_default_str();
  cmd->add_option("--clip-norm", clip_norm, clip_help)->check(FiniteFrom(0, true))->capture_default_str();
}

}  // namespace copse::cli
