#pragma once
// What a harness asserts about the code it drives: a violated property aborts, which libFuzzer
// (and the replay main) reports as a crash with the input that caused it. Unlike assert(), it
// holds in every build type.
#include <cstdio>
#include <cstdlib>

#define COPSE_FUZZ_CHECK(cond)                                                           \
  do {                                                                                   \
    if (!(cond)) {                                                                       \
      std::fprintf(stderr, "%s:%d: property violated: %s\n", __FILE__, __LINE__, #cond); \
      std::abort();                                                                      \
    }                                                                                    \
  } while (0)
