#pragma once
// Names the calling thread as `top -H`, `perf` and /proc/<pid>/task/*/comm show it, so that a
// profile of a daemon tells its vertex workers from its data server and prefetch threads.

#include <string_view>

namespace copse {

/// Linux keeps at most 15 bytes of a thread's name; longer names are cut. Failure is ignored:
/// a name is only a diagnostic.
void SetThreadName(std::string_view name);

}  // namespace copse
