#pragma once
// Command-line reading the benchmarks share: `--flag value` pairs.
#include <cstdio>
#include <cstdlib>
#include <string>

namespace copse::bench {

/// The value after the flag argv[*i], advancing *i past it; exits 2 with "<flag> needs a
/// value" when the flag is the last argument.
inline std::string FlagValue(int argc, char** argv, int* i) {
  if (*i + 1 >= argc) {
    std::fprintf(stderr, "%s needs a value\n", argv[*i]);
    std::exit(2);
  }
  return argv[++*i];
}

}  // namespace copse::bench
