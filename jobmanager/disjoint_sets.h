#pragma once
// Union-find over dense indices (vertices of a job, members of a gang): which of them end up
// joined by live channels, shared memory or an affinity group.
#include <algorithm>
#include <cstdint>
#include <numeric>
#include <vector>

namespace copse::jm {

class DisjointSets {
 public:
  explicit DisjointSets(size_t n) : parent_(n) { std::iota(parent_.begin(), parent_.end(), 0u); }
  /// The set's representative: its smallest index.
  uint32_t Find(uint32_t x) {
    while (parent_[x] != x) x = parent_[x] = parent_[parent_[x]];
    return x;
  }
  void Union(uint32_t a, uint32_t b) {
    a = Find(a);
    b = Find(b);
    if (a != b) parent_[std::max(a, b)] = std::min(a, b);
  }

 private:
  std::vector<uint32_t> parent_;
};

}  // namespace copse::jm
