// NCCL groups: unique ids, all-reduce, send/recv between GPUs, and deadlines that abort instead
// of hanging. Cases needing two GPUs say so and pass trivially on a one-GPU machine.
#include "channels/nccl/nccl_group.h"

#include <cuda_runtime.h>

#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

namespace copse::chan::nccl {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

double SecondsSince(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

struct DeviceBuffer {
  float* p = nullptr;
  size_t n = 0;
  DeviceBuffer(int device, const std::vector<float>& host) : n(host.size()) {
    REQUIRE(cudaSetDevice(device) == cudaSuccess);
    REQUIRE(cudaMalloc(&p, n * sizeof(float)) == cudaSuccess);
    REQUIRE(cudaMemcpy(p, host.data(), n * sizeof(float), cudaMemcpyHostToDevice) == cudaSuccess);
  }
  std::vector<float> Get() const {
    std::vector<float> h(n);
    REQUIRE(cudaMemcpy(h.data(), p, n * sizeof(float), cudaMemcpyDeviceToHost) == cudaSuccess);
    return h;
  }
  ~DeviceBuffer() { cudaFree(p); }
};

NcclOptions Quick() {
  NcclOptions o;
  o.timeout = milliseconds(20'000);
  return o;
}

TEST_CASE("Nccl.UniqueIdIsHexAndValidated" * doctest::timeout(30)) {
  auto id = NcclUniqueId();
  REQUIRE_MESSAGE(id.ok(), id.status().ToString());
  CHECK(id->size() == 256);
  CHECK(NcclGroup::Create("abc", 0, 1, 0).status().code() == StatusCode::kInvalidArgument);
  CHECK(NcclGroup::Create(std::string(256, 'z'), 0, 1, 0).status().code() == StatusCode::kInvalidArgument);
  CHECK(NcclGroup::Create(*id, 2, 2, 0).status().code() == StatusCode::kInvalidArgument);
  CHECK(NcclGroup::Create(*id, 0, 1, CudaDeviceCount()).status().code() == StatusCode::kInvalidArgument);
}

TEST_CASE("Nccl.AllReduceOfOneRankIsIdentity" * doctest::timeout(60)) {
  auto id = NcclUniqueId();
  REQUIRE(id.ok());
  auto g = NcclGroup::Create(*id, 0, 1, 0, Quick());
  REQUIRE_MESSAGE(g.ok(), g.status().ToString());
  std::vector<float> v(1000);
  for (size_t i = 0; i < v.size(); ++i) v[i] = float(i) * 0.5f;
  DeviceBuffer b(0, v);
  REQUIRE((*g)->AllReduce(b.p, b.n).ok());
  CHECK(b.Get() == v);
  CHECK((*g)->health().ok());
}

TEST_CASE("Nccl.MissingPeerTimesOutInsteadOfHanging" * doctest::timeout(60)) {
  auto id = NcclUniqueId();
  REQUIRE(id.ok());
  NcclOptions o;
  o.timeout = milliseconds(2000);
  auto start = Clock::now();
  auto g = NcclGroup::Create(*id, 0, 2, 0, o);  // rank 1 never joins
  CHECK(g.status().code() == StatusCode::kTimeout);
  CHECK(SecondsSince(start) < 10.0);
}

TEST_CASE("Nccl.CancelAbortsCreate" * doctest::timeout(60)) {
  auto id = NcclUniqueId();
  REQUIRE(id.ok());
  std::atomic<bool> cancel{false};
  NcclOptions o;
  o.cancel = &cancel;
  std::thread t([&] {
    std::this_thread::sleep_for(milliseconds(300));
    cancel = true;
  });
  auto g = NcclGroup::Create(*id, 0, 2, 0, o);
  t.join();
  CHECK(g.status().code() == StatusCode::kCancelled);
}

TEST_CASE("Nccl.SendRecvAndAllReduceAcrossGpus" * doctest::timeout(120)) {
  int devices = CudaDeviceCount();
  if (devices < 2) {
    MESSAGE("one GPU: send/recv and multi-rank all-reduce need two (NCCL refuses two ranks on one device)");
    return;
  }
  int n = std::min(devices, 4);
  auto id = NcclUniqueId();
  REQUIRE(id.ok());
  constexpr size_t kCount = 1 << 20;
  std::vector<Status> results(n);
  std::vector<std::vector<float>> reduced(n), received(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      auto g = NcclGroup::Create(*id, r, n, r, Quick());
      if (!g.ok()) {
        results[r] = g.status();
        return;
      }
      DeviceBuffer a(r, std::vector<float>(kCount, float(r + 1)));
      results[r] = (*g)->AllReduce(a.p, a.n);
      if (!results[r].ok()) return;
      reduced[r] = a.Get();
      // A ring of sends: r -> r+1.
      DeviceBuffer out(r, std::vector<float>(kCount, float(100 + r)));
      DeviceBuffer in(r, std::vector<float>(kCount, 0.f));
      if (r % 2 == 0) {
        results[r] = (*g)->Send(out.p, kCount, (r + 1) % n);
        if (results[r].ok()) results[r] = (*g)->Recv(in.p, kCount, (r + n - 1) % n);
      } else {
        results[r] = (*g)->Recv(in.p, kCount, (r + n - 1) % n);
        if (results[r].ok()) results[r] = (*g)->Send(out.p, kCount, (r + 1) % n);
      }
      if (results[r].ok()) received[r] = in.Get();
    });
  }
  for (auto& t : threads) t.join();
  float sum = float(n * (n + 1) / 2);
  for (int r = 0; r < n; ++r) {
    CAPTURE(r);
    REQUIRE_MESSAGE(results[r].ok(), results[r].ToString());
    CHECK(reduced[r][0] == sum);
    CHECK(reduced[r][kCount - 1] == sum);
    CHECK(received[r][0] == float(100 + (r + n - 1) % n));
    CHECK(received[r][kCount - 1] == float(100 + (r + n - 1) % n));
  }
}

TEST_CASE("Nccl.LostPeerAbortsTheGroup" * doctest::timeout(120)) {
  if (CudaDeviceCount() < 2) {
    MESSAGE("one GPU: a two-rank group needs two");
    return;
  }
  auto id = NcclUniqueId();
  REQUIRE(id.ok());
  NcclOptions o;
  o.timeout = milliseconds(3000);
  Status r0;
  std::thread peer([&] {
    auto g = NcclGroup::Create(*id, 1, 2, 1, o);
    REQUIRE(g.ok());
    (*g)->Abort();  // rank 1 is "lost" before the all-reduce
  });
  auto g = NcclGroup::Create(*id, 0, 2, 0, o);
  peer.join();
  REQUIRE(g.ok());
  DeviceBuffer b(0, std::vector<float>(1024, 1.f));
  auto start = Clock::now();
  r0 = (*g)->AllReduce(b.p, b.n);
  CHECK(!r0.ok());
  CHECK(SecondsSince(start) < 10.0);
  CHECK(!(*g)->health().ok());
  CHECK((*g)->AllReduce(b.p, b.n).code() == r0.code());  // the group stays dead
}

}  // namespace
}  // namespace copse::chan::nccl
