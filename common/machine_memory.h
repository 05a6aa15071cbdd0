#pragma once
// How much memory this machine has: what a daemon offers vertices unless told otherwise, and
// what bounds a vertex that declares none.
#include <cstdint>

namespace copse {

/// This machine's physical memory in MB (0 when the kernel does not say).
int64_t MachineMemoryMb();

}  // namespace copse
