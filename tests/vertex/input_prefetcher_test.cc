// Fetching a waiting task's remote inputs ahead of its start, against a real data server on
// loopback: inputs that exist, an input whose producer is still running (chained across
// daemons), and a producer daemon that goes away.
#include "vertex/input_prefetcher.h"

#include <doctest/doctest.h>

#include <chrono>
#include <future>
#include <thread>

#include "channels/data_server.h"
#include "channels/output_store.h"
#include "tests/channels/channel_test_util.h"
#include "tests/vertex/task_util.h"

namespace copse::vertex {
namespace {

const std::string kSecret = "prefetch-test-secret-0123456789abcdef";

struct Producer {
  chan::testing::TempDir dir;
  std::unique_ptr<chan::OutputStore> store;
  std::unique_ptr<chan::DataServer> server;
  Producer() {
    store = chan::OutputStore::Make(dir.path() / "outputs", 1 << 30).value();
    server = chan::DataServer::Start(*store, "127.0.0.1", 0, kSecret).value();
  }
  void Put(const chan::OutputKey& key, const std::vector<std::string>& messages) {
    auto w = store->CreateWriter(key, chan::StorageKind::kMemory);
    REQUIRE(w.ok());
    for (const auto& m : messages) REQUIRE((*w)->Write(chan::Buffer(m)).ok());
    REQUIRE((*w)->Close().ok());
  }
  protocol::Input Input(const chan::OutputKey& key) const { return testing::RemoteInput(key, "127.0.0.1", server->port()); }
};

std::vector<std::string> ReadAll(chan::ChannelReader& r) { return chan::testing::Drain(r); }

using Inputs = google::protobuf::RepeatedPtrField<protocol::Input>;
Inputs Of(std::initializer_list<protocol::Input> inputs) {
  Inputs out;
  for (const auto& in : inputs) *out.Add() = in;
  return out;
}

TEST_CASE("InputPrefetcher.FetchesExistingRemoteInputsAndLeavesTheRest" * doctest::timeout(20)) {
  Producer p;
  p.Put({1, 4, 1, 0}, {"alpha", "beta"});
  InputPrefetcher prefetcher(kSecret);
  Inputs inputs = Of({testing::LocalInput({1, 2, 1, 0}), p.Input({1, 4, 1, 0}), testing::EmptyInput()});
  auto cancel = std::make_shared<std::atomic<bool>>(false);
  auto got = prefetcher.Start(inputs, std::nullopt, cancel, nullptr);
  REQUIRE(got);
  CHECK(got->Take(0) == nullptr);  // local: read from the store as usual
  auto remote = got->Take(1);
  REQUIRE(remote);
  CHECK(ReadAll(*remote) == std::vector<std::string>{"alpha", "beta"});
  CHECK(got->Take(1) == nullptr);  // taken once
  CHECK(got->Take(2) == nullptr);
  // Only local inputs: nothing to do.
  CHECK(prefetcher.Start(Of({inputs[0]}), std::nullopt, cancel, nullptr) == nullptr);
}

TEST_CASE("InputPrefetcher.WaitsForTheOutputOfTheAttemptItIsChainedAfter" * doctest::timeout(20)) {
  Producer p;
  InputPrefetcher prefetcher(kSecret);
  const chan::OutputKey key{1, 7, 3, 1};
  std::promise<Status> arrived;
  auto cancel = std::make_shared<std::atomic<bool>>(false);
  auto got = prefetcher.Start(Of({p.Input(key)}), InputPrefetcher::After{7, 3}, cancel,
                              [&](const Status& st) { arrived.set_value(st); });
  REQUIRE(got);
  auto when = arrived.get_future();
  // Longer than one waiting fetch: it asks again.
  CHECK(when.wait_for(std::chrono::milliseconds(InputPrefetcher::kWaitSliceMs + 200)) == std::future_status::timeout);
  p.Put(key, {"activation"});
  REQUIRE(when.wait_for(std::chrono::seconds(5)) == std::future_status::ready);
  CHECK(when.get().ok());
  auto r = got->Take(0);
  REQUIRE(r);
  CHECK(ReadAll(*r) == std::vector<std::string>{"activation"});
}

TEST_CASE("InputPrefetcher.AGoneProducerDaemonIsReported" * doctest::timeout(20)) {
  auto p = std::make_unique<Producer>();
  const chan::OutputKey key{1, 7, 3, 0};
  Inputs inputs = Of({p->Input(key)});
  p.reset();  // its daemon is gone before (or while) the task waits
  InputPrefetcher prefetcher(kSecret);
  std::promise<Status> arrived;
  auto got = prefetcher.Start(inputs, InputPrefetcher::After{7, 3}, std::make_shared<std::atomic<bool>>(false),
                              [&](const Status& st) { arrived.set_value(st); });
  auto when = arrived.get_future();
  REQUIRE(when.wait_for(std::chrono::seconds(10)) == std::future_status::ready);
  CHECK(when.get().code() == StatusCode::kUnavailable);
  CHECK(got->Take(0) == nullptr);  // the task opens it itself, and reports the loss
}

TEST_CASE("InputPrefetcher.CancellingStopsAWaitingFetch" * doctest::timeout(20)) {
  Producer p;
  std::promise<Status> arrived;
  auto cancel = std::make_shared<std::atomic<bool>>(false);
  const auto started = std::chrono::steady_clock::now();
  {
    InputPrefetcher prefetcher(kSecret);
    prefetcher.Start(Of({p.Input({1, 7, 3, 0})}), InputPrefetcher::After{7, 3}, cancel,
                     [&](const Status& st) { arrived.set_value(st); });
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    cancel->store(true);
  }  // joins
  CHECK(std::chrono::steady_clock::now() - started < std::chrono::seconds(3));
  auto when = arrived.get_future();
  REQUIRE(when.wait_for(std::chrono::seconds(0)) == std::future_status::ready);
  CHECK(when.get().code() == StatusCode::kCancelled);
}

}  // namespace
}  // namespace copse::vertex
