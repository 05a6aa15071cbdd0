#include "common/allocator_name.h"

#include <dlfcn.h>

namespace copse {

const char* AllocatorName() {
  // Each allocator exports an entry point of its own besides malloc.
  if (dlsym(RTLD_DEFAULT, "tc_malloc") != nullptr) return "tcmalloc";
  if (dlsym(RTLD_DEFAULT, "mallctl") != nullptr) return "jemalloc";
  return "glibc";
}

}  // namespace copse
