// main() of the NCCL suite: exits 77 (CTest: skipped) when there is no GPU to test.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdio>

#include "channels/nccl/nccl_group.h"

int main(int argc, char** argv) {
  if (copse::chan::nccl::CudaDeviceCount() == 0) {
    std::printf("channels_nccl_tests: no GPU visible, skipping\n");
    return 77;
  }
  doctest::Context context(argc, argv);
  return context.run();
}
