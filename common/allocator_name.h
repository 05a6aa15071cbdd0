#pragma once
// Which malloc this process runs on, found at run time: the `copse` binary links tcmalloc when
// the build finds it (CMakeLists.txt), and LD_PRELOAD may put another first. Reported by
// `copse train -o json` and the benchmarks, whose figures depend on it.
namespace copse {

/// "tcmalloc", "jemalloc" or "glibc".
const char* AllocatorName();

}  // namespace copse
