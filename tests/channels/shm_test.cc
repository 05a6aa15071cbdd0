// `shm` channels: in-process FIFOs between two vertices on one daemon (channels/shm_registry.h).
#include "channels/shm_registry.h"

#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "tests/channels/channel_test_util.h"

namespace copse::chan {
namespace {

using testing::Drain;
using testing::Pattern;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

double SecondsSince(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

TEST_CASE("Shm.OrderBoundariesAndNoCopies" * doctest::timeout(10)) {
  ShmRegistry reg;
  StreamKey key{1, 2, 0};
  auto w = reg.OpenWriter(key, {});
  REQUIRE(w.ok());
  auto r = reg.OpenReader(key, {});
  REQUIRE(r.ok());
  std::vector<Buffer> sent;
  for (size_t i = 0; i < 20; ++i) sent.emplace_back(Pattern(i * 37, 1, i));  // sizes 0, 37, …
  std::thread producer([&] {
    for (auto& b : sent) REQUIRE((*w)->Write(b).ok());
    REQUIRE((*w)->Close().ok());
  });
  for (size_t i = 0; i < sent.size(); ++i) {
    auto m = (*r)->Next();
    REQUIRE(m.ok());
    REQUIRE(m->has_value());
    CHECK((*m)->size() == sent[i].size());
    CHECK((*m)->storage() == sent[i].storage());  // the very same bytes: no copy
  }
  auto end = (*r)->Next();
  REQUIRE(end.ok());
  CHECK(!end->has_value());
  producer.join();
}

TEST_CASE("Shm.ReaderOpenedBeforeOrAfterWriter" * doctest::timeout(10)) {
  ShmRegistry reg;
  StreamKey a{1, 1, 0}, b{1, 2, 0};
  // Reader first.
  auto ra = reg.OpenReader(a, {});
  REQUIRE(ra.ok());
  std::thread t([&] {
    std::this_thread::sleep_for(milliseconds(50));
    auto w = reg.OpenWriter(a, {});
    REQUIRE(w.ok());
    for (int i = 0; i < 3; ++i) REQUIRE((*w)->Write(Buffer(Pattern(10, 2, i))).ok());
    REQUIRE((*w)->Close().ok());
  });
  auto got = Drain(**ra);
  t.join();
  REQUIRE(got.size() == 3);
  CHECK(got[2] == Pattern(10, 2, 2));
  // Writer first, writes and closes before the reader exists.
  {
    auto w = reg.OpenWriter(b, {});
    REQUIRE(w.ok());
    REQUIRE((*w)->Write(Buffer(std::string("x"))).ok());
    REQUIRE((*w)->Close().ok());
  }
  auto rb = reg.OpenReader(b, {});
  REQUIRE(rb.ok());
  CHECK(Drain(**rb) == std::vector<std::string>{"x"});
  rb->reset();
  ra->reset();
  CHECK(reg.channels() == 0);
}

TEST_CASE("Shm.BackPressureKeepsTheFifoBounded" * doctest::timeout(10)) {
  ShmRegistry reg;
  StreamKey key{1, 3, 0};
  StreamOptions o;
  o.window_bytes = 4000;
  o.window_messages = 100;
  auto w = reg.OpenWriter(key, o);
  auto r = reg.OpenReader(key, o);
  REQUIRE((w.ok() && r.ok()));
  std::atomic<int> written{0};
  std::thread producer([&] {
    for (int i = 0; i < 100; ++i) {
      REQUIRE((*w)->Write(Buffer(Pattern(1000, 3, i))).ok());
      ++written;
    }
    REQUIRE((*w)->Close().ok());
  });
  std::this_thread::sleep_for(milliseconds(200));
  CHECK(written.load() == 4);  // 4 x 1000 bytes fill the window; the 5th blocks
  CHECK(reg.buffered_bytes() <= 4000);
  auto got = Drain(**r);
  producer.join();
  REQUIRE(got.size() == 100);
  for (int i = 0; i < 100; ++i) CHECK(got[i] == Pattern(1000, 3, i));
  CHECK(reg.buffered_bytes() == 0);
}

TEST_CASE("Shm.WriterDestroyedWithoutCloseIsUnavailable" * doctest::timeout(10)) {
  ShmRegistry reg;
  StreamKey key{1, 4, 0};
  auto r = reg.OpenReader(key, {});
  REQUIRE(r.ok());
  {
    auto w = reg.OpenWriter(key, {});
    REQUIRE(w.ok());
    REQUIRE((*w)->Write(Buffer(std::string("a"))).ok());
  }
  auto m = (*r)->Next();
  REQUIRE(m.ok());
  CHECK((*m)->view() == "a");  // what was written arrives, then the failure
  auto e = (*r)->Next();
  REQUIRE(!e.ok());
  CHECK(e.status().code() == StatusCode::kUnavailable);
}

TEST_CASE("Shm.ReaderGoneFailsTheWriter" * doctest::timeout(10)) {
  ShmRegistry reg;
  StreamKey key{1, 5, 0};
  StreamOptions o;
  o.window_messages = 1;
  auto w = reg.OpenWriter(key, o);
  auto r = reg.OpenReader(key, o);
  REQUIRE((w.ok() && r.ok()));
  REQUIRE((*w)->Write(Buffer(std::string("a"))).ok());
  std::thread t([&] {
    std::this_thread::sleep_for(milliseconds(50));
    r->reset();  // the consumer vertex failed while the producer was blocked
  });
  auto s = (*w)->Write(Buffer(std::string("b")));
  t.join();
  CHECK(s.code() == StatusCode::kUnavailable);
  CHECK((*w)->Close().code() == StatusCode::kUnavailable);
}

TEST_CASE("Shm.CancelAndDropJobUnblock" * doctest::timeout(10)) {
  ShmRegistry reg;
  std::atomic<bool> cancel{false};
  StreamOptions o;
  o.cancel = &cancel;
  auto r = reg.OpenReader({7, 1, 0}, o);
  REQUIRE(r.ok());
  auto start = Clock::now();
  std::thread t([&] {
    std::this_thread::sleep_for(milliseconds(50));
    cancel = true;
  });
  auto m = (*r)->Next();
  t.join();
  CHECK(m.status().code() == StatusCode::kCancelled);
  CHECK(SecondsSince(start) < 1.0);

  StreamOptions small;
  small.window_messages = 1;
  auto w = reg.OpenWriter({8, 1, 0}, small);
  auto r2 = reg.OpenReader({8, 2, 0}, {});
  REQUIRE((w.ok() && r2.ok()));
  REQUIRE((*w)->Write(Buffer(std::string("a"))).ok());
  std::thread d([&] {
    std::this_thread::sleep_for(milliseconds(50));
    reg.DropJob(8);
  });
  CHECK((*w)->Write(Buffer(std::string("b"))).code() == StatusCode::kCancelled);  // was blocked: window full
  CHECK((*r2)->Next().status().code() == StatusCode::kCancelled);
  d.join();
}

TEST_CASE("Shm.DuplicateEndsAndOpenTimeout" * doctest::timeout(10)) {
  ShmRegistry reg;
  StreamKey key{2, 1, 0};
  auto w = reg.OpenWriter(key, {});
  REQUIRE(w.ok());
  CHECK(reg.OpenWriter(key, {}).status().code() == StatusCode::kAlreadyExists);
  StreamOptions quick;
  quick.open_timeout = milliseconds(100);
  auto r = reg.OpenReader({2, 2, 0}, quick);  // its writer never comes
  REQUIRE(r.ok());
  auto start = Clock::now();
  CHECK((*r)->Next().status().code() == StatusCode::kUnavailable);
  CHECK(SecondsSince(start) < 2.0);
}

TEST_CASE("Shm.EndsOutliveTheRegistry" * doctest::timeout(10)) {
  std::unique_ptr<ChannelReader> r;
  {
    ShmRegistry reg;
    r = std::move(reg.OpenReader({3, 1, 0}, {})).value();
  }
  CHECK(r->Next().status().code() == StatusCode::kCancelled);
}

}  // namespace
}  // namespace copse::chan
