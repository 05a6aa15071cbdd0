// The one main() of every doctest suite. `--copse-child NAME` runs a registered child body
// instead of the tests (tests/child_process.h).
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <string_view>

#include "tests/child_process.h"

int main(int argc, char** argv) {
  if (argc == 3 && std::string_view(argv[1]) == "--copse-child") return copse::testing::RunChild(argv[2]);
  return doctest::Context(argc, argv).run();
}
