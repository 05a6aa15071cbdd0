#include "vertex/gpu_pool.h"

namespace copse::vertex {

GpuPool::Lease::~Lease() {
  if (pool_ && device_ >= 0) pool_->Release(device_);
}

GpuPool::Lease GpuPool::Acquire(int gpus, const std::atomic<bool>& cancel, std::chrono::milliseconds wait) {
  if (gpus <= 0 || gpus_ <= 0) return {};
  const auto until = std::chrono::steady_clock::now() + wait;
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    for (int i = 0; i < gpus_; ++i) {
      if (busy_.insert(i).second) return Lease(this, i);
    }
    if (cancel.load() || std::chrono::steady_clock::now() >= until) return {};
    freed_.wait_for(lock, std::chrono::milliseconds(50));  // polled: a cancel does not notify
  }
}

void GpuPool::Release(int device) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    busy_.erase(device);
  }
  freed_.notify_all();
}

}  // namespace copse::vertex
