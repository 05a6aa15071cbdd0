#pragma once
// GpuPool: which of a daemon's GPUs its running attempts hold. An attempt that asks for a GPU
// takes a Lease on one for its duration (device -1 when it asked for none, or none came free).
// The job manager counts a cancelled attempt's GPU free once it has sent the cancel, so the
// next attempt may arrive while the old one still holds the device here: Acquire waits for
// it, up to `wait` or the attempt's own cancel. Thread-safe.
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <set>

namespace copse::vertex {

class GpuPool {
 public:
  static constexpr std::chrono::seconds kDefaultWait{10};

  /// A pool of devices 0 … gpus-1.
  explicit GpuPool(int gpus) : gpus_(gpus) {}
  GpuPool(const GpuPool&) = delete;
  GpuPool& operator=(const GpuPool&) = delete;

  /// One device for as long as it lives; released (and a waiter woken) when destroyed.
  class Lease {
   public:
    Lease() = default;
    Lease(Lease&& other) noexcept : pool_(other.pool_), device_(other.device_) { other.device_ = -1; }
    Lease& operator=(Lease&&) = delete;
    ~Lease();
    /// The device held, or -1.
    int device() const { return device_; }

   private:
    friend class GpuPool;
    Lease(GpuPool* pool, int device) : pool_(pool), device_(device) {}
    GpuPool* pool_ = nullptr;
    int device_ = -1;
  };

  /// A device when `gpus` > 0 and the pool has one: the first free, waiting up to `wait` (or
  /// until `cancel`) for one to free up. An empty lease otherwise.
  Lease Acquire(int gpus, const std::atomic<bool>& cancel, std::chrono::milliseconds wait = kDefaultWait);
  int size() const { return gpus_; }

 private:
  void Release(int device);

  const int gpus_;
  std::mutex mu_;
  std::condition_variable freed_;
  std::set<int> busy_;  // guarded by mu_
};

}  // namespace copse::vertex
