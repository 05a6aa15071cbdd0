#pragma once
// CachingAllocator: keeps freed blocks in per-size free lists so that a training loop that
// allocates the same shapes every step touches the system allocator (malloc, cudaMalloc) only
// during its first step. Header-only so that ml/cuda can use it without linking copse_ml.
// Thread-safe (one mutex; allocation is not on any kernel's hot path).
#include <cstddef>
#include <functional>
#include <mutex>
#include <unordered_map>
#include <vector>

namespace copse::ml {

class CachingAllocator {
 public:
  CachingAllocator(std::function<void*(size_t)> alloc, std::function<void(void*)> release)
      : alloc_(std::move(alloc)), release_(std::move(release)) {}
  ~CachingAllocator() { Trim(); }
  CachingAllocator(const CachingAllocator&) = delete;
  CachingAllocator& operator=(const CachingAllocator&) = delete;

  void* Allocate(size_t bytes) {
    const size_t key = Round(bytes);
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = free_.find(key);
      if (it != free_.end() && !it->second.empty()) {
        void* p = it->second.back();
        it->second.pop_back();
        cached_bytes_ -= key;
        return p;
      }
    }
    return alloc_(key);
  }

  void Free(void* ptr, size_t bytes) {
    if (ptr == nullptr) return;
    const size_t key = Round(bytes);
    std::lock_guard<std::mutex> lock(mu_);
    if (cached_bytes_ + key > kMaxCachedBytes) {
      release_(ptr);
      return;
    }
    free_[key].push_back(ptr);
    cached_bytes_ += key;
  }

  /// Returns every cached block to the system.
  void Trim() {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& [size, blocks] : free_)
      for (void* p : blocks) release_(p);
    free_.clear();
    cached_bytes_ = 0;
  }

 private:
  static constexpr size_t kMaxCachedBytes = size_t{4} << 30;
  static size_t Round(size_t bytes) { return bytes == 0 ? 256 : (bytes + 255) / 256 * 256; }

  std::function<void*(size_t)> alloc_;
  std::function<void(void*)> release_;
  std::mutex mu_;
  std::unordered_map<size_t, std::vector<void*>> free_;
  size_t cached_bytes_ = 0;
};

}  // namespace copse::ml
