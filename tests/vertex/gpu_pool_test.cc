// GpuPool: an attempt holds its GPU alone for as long as it runs; the next waits for it.
#include "vertex/gpu_pool.h"

#include <doctest/doctest.h>

#include <thread>

namespace copse::vertex {
namespace {

TEST_CASE("GpuPool.EachLeaseHoldsADeviceAlone" * doctest::timeout(10)) {
  GpuPool pool(2);
  std::atomic<bool> cancel{false};
  GpuPool::Lease none = pool.Acquire(0, cancel);
  CHECK(none.device() == -1);  // asked for none
  GpuPool::Lease a = pool.Acquire(1, cancel);
  GpuPool::Lease b = pool.Acquire(1, cancel);
  CHECK(a.device() == 0);
  CHECK(b.device() == 1);
  // Both held: the next gives up after its wait.
  const auto start = std::chrono::steady_clock::now();
  GpuPool::Lease c = pool.Acquire(1, cancel, std::chrono::milliseconds(100));
  CHECK(c.device() == -1);
  CHECK(std::chrono::steady_clock::now() - start >= std::chrono::milliseconds(100));
}

TEST_CASE("GpuPool.AWaiterGetsTheDeviceWhenItsHolderEnds" * doctest::timeout(10)) {
  GpuPool pool(1);
  std::atomic<bool> cancel{false};
  auto held = std::make_unique<GpuPool::Lease>(pool.Acquire(1, cancel));
  REQUIRE(held->device() == 0);
  std::thread release([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    held.reset();
  });
  GpuPool::Lease next = pool.Acquire(1, cancel, std::chrono::seconds(5));
  release.join();
  CHECK(next.device() == 0);
}

TEST_CASE("GpuPool.ACancelledWaiterStopsWaiting" * doctest::timeout(10)) {
  GpuPool pool(1);
  std::atomic<bool> cancel{false};
  GpuPool::Lease held = pool.Acquire(1, cancel);
  std::atomic<bool> cancelled{true};
  const auto start = std::chrono::steady_clock::now();
  GpuPool::Lease waiter = pool.Acquire(1, cancelled, std::chrono::seconds(5));
  CHECK(waiter.device() == -1);
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(1));
  GpuPool empty(0);
  CHECK(empty.Acquire(1, cancel).device() == -1);  // a daemon without GPUs
}

}  // namespace
}  // namespace copse::vertex
