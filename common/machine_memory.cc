#include "common/machine_memory.h"

#include <unistd.h>

namespace copse {

int64_t MachineMemoryMb() {
  const long pages = ::sysconf(_SC_PHYS_PAGES);
  const long page_bytes = ::sysconf(_SC_PAGE_SIZE);
  if (pages <= 0 || page_bytes <= 0) return 0;
  return static_cast<int64_t>(pages) * page_bytes >> 20;
}

}  // namespace copse
