// main() of the GPU training-graph suite: exits 77 (CTest: skipped) when there is no GPU.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdio>

#include "ml/device.h"

int main(int argc, char** argv) {
  if (copse::ml::CudaDeviceCount() == 0) {
    std::printf("ml_graph_cuda_tests: no GPU visible, skipping\n");
    return 77;
  }
  doctest::Context context(argc, argv);
  return context.run();
}
