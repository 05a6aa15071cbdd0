// `stream` channels: live ZeroMQ pipes between daemons' stream hubs (channels/stream_hub.h).
// Hubs in this process talk over 127.0.0.1 (tcp://) or a socket file (ipc://); the fault cases
// run a producer "daemon" in a child process and SIGKILL it. Every wait is bounded.
#include "channels/stream_hub.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <fstream>
#include <functional>
#include <thread>

#include <zmq.hpp>

#include "common/auth.h"
#include "tests/channels/channel_test_util.h"
#include "tests/child_process.h"

namespace copse::chan {
namespace {

using testing::Drain;
using testing::Pattern;
using testing::TempDir;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

const std::string kSecret = "stream-test-secret-0123456789abcdef";
const std::string kHost = "127.0.0.1";

double SecondsSince(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

std::unique_ptr<StreamHub> StartHub(const std::filesystem::path& ipc_dir, const std::string& secret = kSecret,
                                    bool encrypt = false) {
  auto h = StreamHub::Start(kHost, 0, ipc_dir, secret, encrypt);
  REQUIRE_MESSAGE(h.ok(), h.status().ToString());
  return std::move(h).value();
}

StreamPeer TcpOnly(StreamPeer ep) {
  ep.ipc.clear();
  return ep;
}

// Two hubs in this process: `prod` sends to `cons`.
struct Pair {
  TempDir dir;
  std::unique_ptr<StreamHub> prod = StartHub(dir.path() / "p");
  std::unique_ptr<StreamHub> cons = StartHub(dir.path() / "c");
  StreamPeer peer(bool ipc) const { return ipc ? cons->endpoints() : TcpOnly(cons->endpoints()); }
};

StreamOptions Quick() {
  StreamOptions o;
  o.peer_timeout = milliseconds(500);
  o.open_timeout = milliseconds(3000);
  return o;
}

TEST_CASE("Stream.EndpointsAndKeys" * doctest::timeout(10)) {
  Pair p;
  auto ep = p.cons->endpoints();
  CHECK(ep.tcp.rfind("tcp://127.0.0.1:", 0) == 0);
  CHECK(ep.ipc.rfind("ipc://", 0) == 0);
  CHECK(!ep.host.empty());
  auto again = StreamPeer::FromJson(ep.ToJson());
  REQUIRE(again.ok());
  CHECK(again->tcp == ep.tcp);
  CHECK(again->ipc == ep.ipc);
  StreamKey k{3, 7, 2};
  CHECK(k.ToString() == "job3/c7.v2");
  auto back = StreamKey::FromJson(k.ToJson());
  REQUIRE(back.ok());
  CHECK(*back == k);
  CHECK(StreamKey::FromJson(Json{{"job", 1}, {"channel", -1}, {"version", 0}}).status().message().find("/channel") !=
        std::string::npos);
  CHECK(StreamPeer::FromJson(Json{{"tcp", 5}}).status().message().find("/tcp") != std::string::npos);
  CHECK(p.prod->OpenWriter(StreamPeer{"http://x", "", ""}, k, {}).status().code() == StatusCode::kInvalidArgument);
}

TEST_CASE("Stream.WhatAWriterClosedJustBeforeItsHubStopsIsDelivered" * doctest::timeout(60)) {
  // A producer process closes its writer and exits at once: messages and end-of-stream still
  // queued as hub commands when the hub stops must be sent, not dropped (a race: many rounds).
  TempDir dir;
  auto cons = StartHub(dir.path() / "c");
  for (uint32_t round = 0; round < 100; ++round) {
    CAPTURE(round);
    StreamKey key{8, 1, round};
    auto r = cons->OpenReader(key, Quick());
    REQUIRE(r.ok());
    auto prod = StartHub(dir.path() / ("p" + std::to_string(round)));
    auto w = prod->OpenWriter(TcpOnly(cons->endpoints()), key, Quick());
    REQUIRE(w.ok());
    for (int i = 0; i < 3; ++i) REQUIRE((*w)->Write(Buffer(Pattern(1000, round, i))).ok());
    REQUIRE((*w)->Close().ok());
    w->reset();
    prod.reset();  // stops the hub right after Close
    auto got = Drain(**r);
    REQUIRE(got.size() == 3);
    for (int i = 0; i < 3; ++i) CHECK(got[i] == Pattern(1000, round, i));
  }
}

TEST_CASE("Stream.OrderAndBoundariesOverTcpAndIpc" * doctest::timeout(20)) {
  Pair p;
  for (bool ipc : {false, true}) {
    CAPTURE(ipc);
    StreamKey key{1, ipc ? 2u : 1u, 0};
    auto r = p.cons->OpenReader(key, Quick());
    REQUIRE(r.ok());
    auto w = p.prod->OpenWriter(p.peer(ipc), key, Quick());
    REQUIRE(w.ok());
    // Empty, tiny, odd, larger than the zero-copy threshold, larger than the window.
    std::vector<size_t> sizes = {0, 1, 63, 64, 4095, 4096, 100'000, 1 << 20, 9 << 20, 0, 7};
    std::atomic<bool> wrote_all{false};
    std::thread producer([&] {
      for (int round = 0; round < 3; ++round)
        for (size_t i = 0; i < sizes.size(); ++i)
          if (!(*w)->Write(Buffer(Pattern(sizes[i], round, i))).ok()) return;
      wrote_all = (*w)->Close().ok();
    });
    auto got = Drain(**r);
    producer.join();
    CHECK(wrote_all.load());
    REQUIRE(got.size() == 3 * sizes.size());
    for (int round = 0; round < 3; ++round)
      for (size_t i = 0; i < sizes.size(); ++i) CHECK(got[round * sizes.size() + i] == Pattern(sizes[i], round, i));
  }
  CHECK(p.cons->buffered_bytes() == 0);
  CHECK(p.cons->dropped_frames() == 0);
}

TEST_CASE("Stream.EncryptedHubsDeliverInOrderAndRefuseHubsWithoutTheKey" * doctest::timeout(30)) {
  TempDir dir;
  auto prod = StartHub(dir.path() / "p", kSecret, /*encrypt=*/true);
  auto cons = StartHub(dir.path() / "c", kSecret, /*encrypt=*/true);
  for (bool ipc : {false, true}) {
    CAPTURE(ipc);
    StreamKey key{1, ipc ? 2u : 1u, 0};
    auto r = cons->OpenReader(key, Quick());
    REQUIRE(r.ok());
    auto w = prod->OpenWriter(ipc ? cons->endpoints() : TcpOnly(cons->endpoints()), key, Quick());
    REQUIRE(w.ok());
    std::vector<std::string> sent;
    for (size_t i = 0; i < 40; ++i) sent.push_back(Pattern(i * 7919 % 300'000, 9, i));
    std::atomic<bool> wrote_all{false};
    std::thread producer([&] {
      for (const auto& m : sent)
        if (!(*w)->Write(Buffer(m)).ok()) return;
      wrote_all = (*w)->Close().ok();
    });
    CHECK(Drain(**r) == sent);
    producer.join();
    CHECK(wrote_all.load());
  }
  // A hub without CURVE, and one of another cluster (another secret, so other keys), never get a
  // frame through: ZeroMQ's handshake refuses them, and the reader times out.
  auto plain = StartHub(dir.path() / "x");
  auto foreign = StartHub(dir.path() / "y", "another-cluster-secret-0123456789", /*encrypt=*/true);
  uint32_t channel = 10;
  for (StreamHub* stranger : {plain.get(), foreign.get()}) {
    StreamKey key{1, channel++, 0};
    StreamOptions o = Quick();
    o.open_timeout = milliseconds(1000);
    auto r = cons->OpenReader(key, o);
    REQUIRE(r.ok());
    auto w = stranger->OpenWriter(TcpOnly(cons->endpoints()), key, o);
    REQUIRE(w.ok());
    (void)(*w)->Write(Buffer(std::string("not for you")));
    (void)(*w)->Close();
    auto got = (*r)->Next();
    CHECK_FALSE(got.ok());
    CHECK(got.status().code() == StatusCode::kUnavailable);
  }
  CHECK(cons->dropped_frames() == 0);  // refused before any frame reached the hub
}

TEST_CASE("Stream.AHubWhoseIpcPathIsTooLongServesOverTcp" * doctest::timeout(20)) {
  // A daemon with a deep work dir exited at start: its socket file's path did not fit a unix
  // socket's 108 bytes.
  TempDir dir;
  auto deep = dir.path() / std::string(60, 'd') / std::string(60, 'e');
  auto cons = StartHub(deep);
  CHECK(cons->endpoints().ipc.empty());
  auto prod = StartHub(dir.path() / "p");
  StreamKey key{1, 1, 0};
  auto r = cons->OpenReader(key, Quick());
  REQUIRE(r.ok());
  auto w = prod->OpenWriter(cons->endpoints(), key, Quick());  // same host, no ipc: tcp://
  REQUIRE(w.ok());
  REQUIRE((*w)->Write(Buffer(std::string("over tcp"))).ok());
  REQUIRE((*w)->Close().ok());
  CHECK(Drain(**r) == std::vector<std::string>{"over tcp"});
}

TEST_CASE("Stream.AMessageLargerThanAnyWindowIsRefusedAtWrite" * doctest::timeout(10)) {
  // The consumer's hub would drop the frame with its connection (its cap on what an
  // unauthenticated peer may make it buffer): the writer says so instead.
  class Huge final : public Payload {
   public:
    size_t EncodedSize() const override { return (size_t{1} << 30) + 1; }
    std::string Encode() const override { return {}; }  // never called
  };
  Pair p;
  auto w = p.prod->OpenWriter(p.peer(false), {1, 4, 0}, Quick());
  REQUIRE(w.ok());
  const Status st = (*w)->Write(Buffer(std::shared_ptr<const Payload>(std::make_shared<Huge>())));
  CHECK(st.code() == StatusCode::kInvalidArgument);
  CHECK_MESSAGE(st.message().find("exceeds a live channel's limit of 1073741824") != std::string::npos, st.message());
  REQUIRE((*w)->Write(Buffer("small")).ok());  // the channel goes on
  REQUIRE((*w)->Close().ok());
  auto r = p.cons->OpenReader({1, 4, 0}, Quick());
  REQUIRE(r.ok());
  CHECK(Drain(**r) == std::vector<std::string>{"small"});
}

TEST_CASE("Stream.ReaderOpenedAfterTheProducerFinished" * doctest::timeout(10)) {
  Pair p;
  StreamKey key{1, 3, 0};
  {
    auto w = p.prod->OpenWriter(p.peer(false), key, Quick());
    REQUIRE(w.ok());
    for (int i = 0; i < 10; ++i) REQUIRE((*w)->Write(Buffer(Pattern(1000, 4, i))).ok());
    REQUIRE((*w)->Close().ok());
  }
  std::this_thread::sleep_for(milliseconds(1500));  // longer than peer_timeout: the end was already held
  auto r = p.cons->OpenReader(key, Quick());
  REQUIRE(r.ok());
  auto got = Drain(**r);
  REQUIRE(got.size() == 10);
  CHECK(got[9] == Pattern(1000, 4, 9));
  CHECK(p.cons->OpenReader(key, Quick()).status().code() == StatusCode::kAlreadyExists);
}

TEST_CASE("Stream.BackPressureBoundsBufferedBytes" * doctest::timeout(20)) {
  Pair p;
  StreamKey key{1, 4, 0};
  StreamOptions o = Quick();
  o.window_bytes = 1 << 20;
  o.window_messages = 64;
  auto w = p.prod->OpenWriter(p.peer(false), key, o);
  auto r = p.cons->OpenReader(key, o);
  REQUIRE((w.ok() && r.ok()));
  constexpr int kMessages = 1024;  // 64 MiB of 64 KiB messages, 64x the window
  std::atomic<int> written{0};
  std::thread producer([&] {
    for (int i = 0; i < kMessages; ++i) {
      REQUIRE((*w)->Write(Buffer(Pattern(64 << 10, 5, i))).ok());
      ++written;
    }
    REQUIRE((*w)->Close().ok());
  });
  std::this_thread::sleep_for(milliseconds(700));  // the reader sleeps; heartbeats keep the writer alive
  CHECK(written.load() == 16);                     // exactly one window
  CHECK(p.cons->buffered_bytes() <= o.window_bytes);
  CHECK(p.prod->in_flight_bytes() <= o.window_bytes);
  size_t max_buffered = 0;
  for (int i = 0; i < kMessages; ++i) {
    auto m = (*r)->Next();
    REQUIRE(m.ok());
    REQUIRE(m->has_value());
    REQUIRE((*m)->view() == Pattern(64 << 10, 5, i));
    max_buffered = std::max(max_buffered, p.cons->buffered_bytes());
  }
  auto end = (*r)->Next();
  REQUIRE(end.ok());
  CHECK(!end->has_value());
  producer.join();
  CHECK(max_buffered <= o.window_bytes);
}

TEST_CASE("Stream.WriterDestroyedWithoutCloseAbortsTheReader" * doctest::timeout(10)) {
  Pair p;
  StreamKey key{1, 5, 0};
  auto r = p.cons->OpenReader(key, Quick());
  REQUIRE(r.ok());
  {
    auto w = p.prod->OpenWriter(p.peer(true), key, Quick());
    REQUIRE(w.ok());
    REQUIRE((*w)->Write(Buffer(std::string("a"))).ok());
  }
  auto start = Clock::now();
  auto m = (*r)->Next();
  REQUIRE(m.ok());
  CHECK((*m)->view() == "a");
  auto e = (*r)->Next();
  CHECK(e.status().code() == StatusCode::kUnavailable);
  CHECK(SecondsSince(start) < 0.4);  // told, not timed out
}

TEST_CASE("Stream.ReaderGoneFailsTheWriter" * doctest::timeout(10)) {
  Pair p;
  StreamKey key{1, 6, 0};
  StreamOptions o = Quick();
  o.window_messages = 2;
  auto w = p.prod->OpenWriter(p.peer(false), key, o);
  auto r = p.cons->OpenReader(key, o);
  REQUIRE((w.ok() && r.ok()));
  REQUIRE((*w)->Write(Buffer(std::string("a"))).ok());
  auto m = (*r)->Next();
  REQUIRE(m.ok());
  r->reset();  // the consumer failed before the end
  Status s;
  auto start = Clock::now();
  for (int i = 0; i < 100 && s.ok(); ++i) s = (*w)->Write(Buffer(std::string("b")));
  CHECK(s.code() == StatusCode::kUnavailable);
  CHECK(SecondsSince(start) < 2.0);
}

TEST_CASE("Stream.CancelUnblocksReaderAndWriter" * doctest::timeout(10)) {
  Pair p;
  std::atomic<bool> cancel{false};
  StreamOptions o = Quick();
  o.cancel = &cancel;
  o.window_messages = 1;
  auto r = p.cons->OpenReader({2, 1, 0}, o);
  auto w = p.prod->OpenWriter(p.peer(false), {2, 2, 0}, o);  // nobody reads it
  REQUIRE((r.ok() && w.ok()));
  REQUIRE((*w)->Write(Buffer(std::string("a"))).ok());
  std::thread t([&] {
    std::this_thread::sleep_for(milliseconds(100));
    cancel = true;
  });
  auto start = Clock::now();
  CHECK((*r)->Next().status().code() == StatusCode::kCancelled);
  CHECK((*w)->Write(Buffer(std::string("b"))).code() == StatusCode::kCancelled);
  CHECK(SecondsSince(start) < 1.0);
  t.join();
}

TEST_CASE("Stream.APeersJobDropReadsAsCancelledOnTheOtherSide" * doctest::timeout(10)) {
  // Only one hub drops the job; the other learns it through the abort frame, and must report
  // a cancellation (the job is over), not a failure of its peer.
  Pair p;
  StreamOptions o = Quick();
  o.window_messages = 1;
  auto r = p.cons->OpenReader({11, 1, 0}, o);
  auto w = p.prod->OpenWriter(p.peer(false), {11, 1, 0}, o);
  REQUIRE((r.ok() && w.ok()));
  REQUIRE((*w)->Write(Buffer(std::string("a"))).ok());
  p.cons->DropJob(11);  // the consumer's daemon ended the job; the producer's did not (yet)
  Status st;
  auto deadline = Clock::now() + std::chrono::seconds(3);
  while ((st = (*w)->Write(Buffer(std::string("b")))).ok() && Clock::now() < deadline) {
    std::this_thread::sleep_for(milliseconds(5));
  }
  CHECK_MESSAGE(st.code() == StatusCode::kCancelled, st.ToString());

  auto r2 = p.cons->OpenReader({12, 1, 0}, o);
  auto w2 = p.prod->OpenWriter(p.peer(false), {12, 1, 0}, o);
  REQUIRE((r2.ok() && w2.ok()));
  REQUIRE((*w2)->Write(Buffer(std::string("a"))).ok());
  p.prod->DropJob(12);         // now only the producer's side drops
  auto first = (*r2)->Next();  // "a" may already be here; the drop follows it
  if (first.ok() && *first) first = (*r2)->Next();
  CHECK(first.status().code() == StatusCode::kCancelled);
}

TEST_CASE("Stream.DropJobUnblocksBothSides" * doctest::timeout(10)) {
  Pair p;
  StreamOptions o = Quick();
  o.window_messages = 1;
  auto r = p.cons->OpenReader({9, 1, 0}, o);
  auto w = p.prod->OpenWriter(p.peer(false), {9, 2, 0}, o);
  auto other = p.cons->OpenReader({10, 1, 0}, o);
  REQUIRE((r.ok() && w.ok() && other.ok()));
  REQUIRE((*w)->Write(Buffer(std::string("a"))).ok());
  std::thread t([&] {
    std::this_thread::sleep_for(milliseconds(100));
    p.cons->DropJob(9);
    p.prod->DropJob(9);
  });
  auto start = Clock::now();
  CHECK((*r)->Next().status().code() == StatusCode::kCancelled);
  CHECK((*w)->Write(Buffer(std::string("b"))).code() == StatusCode::kCancelled);
  CHECK(SecondsSince(start) < 1.0);
  t.join();
  // Another job's channel is untouched.
  auto w2 = p.prod->OpenWriter(p.peer(false), {10, 1, 0}, o);
  REQUIRE(w2.ok());
  REQUIRE((*w2)->Write(Buffer(std::string("still here"))).ok());
  REQUIRE((*w2)->Close().ok());
  CHECK(Drain(**other) == std::vector<std::string>{"still here"});
}

TEST_CASE("Stream.UnauthenticatedFramesAreIgnored" * doctest::timeout(15)) {
  Pair p;
  StreamKey key{4, 1, 0};
  auto r = p.cons->OpenReader(key, Quick());
  REQUIRE(r.ok());
  // A producer that does not know the secret: its open is refused, its data never arrives.
  TempDir other;
  auto intruder_hub = StartHub(other.path(), "not-the-secret");
  auto bad = intruder_hub->OpenWriter(p.peer(false), key, Quick());
  REQUIRE(bad.ok());
  REQUIRE((*bad)->Write(Buffer(std::string("evil"))).ok());
  REQUIRE((*bad)->Close().ok());
  // Raw garbage on the hub's port.
  zmq::context_t ctx(1);
  zmq::socket_t raw(ctx, zmq::socket_type::dealer);
  raw.set(zmq::sockopt::linger, 0);
  raw.connect(p.peer(false).tcp);
  raw.send(zmq::str_buffer("garbage"), zmq::send_flags::none);
  std::string header(40, '\0');
  raw.send(zmq::buffer(header), zmq::send_flags::none);  // wrong magic
  auto start = Clock::now();
  while (p.cons->dropped_frames() < 4 && SecondsSince(start) < 5) std::this_thread::sleep_for(milliseconds(10));
  CHECK(p.cons->dropped_frames() >= 4);  // bad open, its data, its end, garbage, wrong magic

  // The legitimate producer opens the same key; a spoofed data frame from another connection
  // (a valid header for the key, no open of its own) is dropped.
  auto good = p.prod->OpenWriter(p.peer(false), key, Quick());
  REQUIRE(good.ok());
  REQUIRE((*good)->Write(Buffer(std::string("a"))).ok());
  auto m = (*r)->Next();
  REQUIRE(m.ok());
  REQUIRE(m->has_value());
  CHECK((*m)->view() == "a");
  uint32_t magic = 0x53535043;
  std::memcpy(header.data(), &magic, 4);
  header[4] = 2;  // data
  uint64_t job = 4, seq = 1;
  uint32_t channel = 1;
  std::memcpy(header.data() + 8, &job, 8);
  std::memcpy(header.data() + 16, &channel, 4);
  std::memcpy(header.data() + 24, &seq, 8);
  uint64_t before = p.cons->dropped_frames();
  raw.send(zmq::buffer(header), zmq::send_flags::sndmore);
  raw.send(zmq::str_buffer("spoofed"), zmq::send_flags::none);
  start = Clock::now();
  while (p.cons->dropped_frames() == before && SecondsSince(start) < 5) std::this_thread::sleep_for(milliseconds(10));
  CHECK(p.cons->dropped_frames() == before + 1);
  REQUIRE((*good)->Write(Buffer(std::string("b"))).ok());
  REQUIRE((*good)->Close().ok());
  CHECK(Drain(**r) == std::vector<std::string>{"b"});
}

/// A producer written by hand on a raw DEALER socket, that knows the secret: it can send what
/// no writer of this build would.
struct RawProducer {
  RawProducer(const std::string& endpoint, StreamKey key) : key(key) {
    raw.set(zmq::sockopt::linger, 0);
    raw.connect(endpoint);
  }
  std::string Header(uint8_t type, uint64_t a, uint64_t b) const {
    std::string h(40, '\0');
    const uint32_t magic = 0x53535043;
    std::memcpy(h.data(), &magic, 4);
    h[4] = static_cast<char>(type);
    std::memcpy(h.data() + 8, &key.job, 8);
    std::memcpy(h.data() + 16, &key.channel, 4);
    std::memcpy(h.data() + 20, &key.version, 4);
    std::memcpy(h.data() + 24, &a, 8);
    std::memcpy(h.data() + 32, &b, 8);
    return h;
  }
  void Open(uint64_t window_bytes, uint64_t window_messages) {
    const std::string nonce(32, 'a');
    std::string open = Header(1, window_bytes, window_messages) + nonce +
                       auth::Mac(kSecret, "copse-stream-open/" + key.ToString() + "/" + nonce + "/" +
                                              std::to_string(window_bytes) + "/" + std::to_string(window_messages));
    raw.send(zmq::buffer(open), zmq::send_flags::none);
  }
  StreamKey key;
  zmq::context_t ctx{1};
  zmq::socket_t raw{ctx, zmq::socket_type::dealer};
};

TEST_CASE("Stream.AProducerBeyondItsWindowFailsTheChannel" * doctest::timeout(15)) {
  // An authenticated producer (it knows the secret) that ignores flow control: the consumer
  // buffers no more than the window it opened with, and the channel fails saying why.
  Pair p;
  StreamKey key{5, 2, 1};
  auto r = p.cons->OpenReader(key, Quick());
  REQUIRE(r.ok());
  RawProducer producer(p.peer(false).tcp, key);
  producer.Open(1 << 20, 2);
  for (uint64_t seq = 0; seq < 5; ++seq) {  // the window holds 2
    producer.raw.send(zmq::buffer(producer.Header(2, seq, 0)), zmq::send_flags::sndmore);
    producer.raw.send(zmq::str_buffer("x"), zmq::send_flags::none);
  }
  // Nothing is read until the hub has taken all five in: a reader that pops in between returns
  // credit, and then a third message is within the window. The fourth and fifth, after the
  // channel failed, are dropped.
  for (auto deadline = Clock::now() + std::chrono::seconds(5); p.cons->dropped_frames() < 2 && Clock::now() < deadline;) {
    std::this_thread::sleep_for(milliseconds(5));
  }
  Status failure;
  std::vector<std::string> got;
  for (int i = 0; i < 5 && failure.ok(); ++i) {
    auto m = (*r)->Next();
    if (!m.ok())
      failure = m.status();
    else if (m->has_value())
      got.emplace_back((*m)->view());
  }
  CHECK(got.size() <= 2);
  CHECK(failure.code() == StatusCode::kDataLoss);
  CHECK_MESSAGE(failure.message().find("sent beyond its window of 2 messages and 1048576 bytes") != std::string::npos,
                failure.ToString());
}

TEST_CASE("Stream.AnOpenAboveTheConsumersCapsIsAbortedWithTheReason" * doctest::timeout(15)) {
  // A producer of another build, with a bigger window than this hub allows: told why at once,
  // rather than ignored until it times out.
  Pair p;
  StreamKey key{5, 3, 1};
  auto r = p.cons->OpenReader(key, Quick());
  REQUIRE(r.ok());
  RawProducer producer(p.peer(false).tcp, key);
  producer.Open(uint64_t{2} << 30, 4);
  zmq::pollitem_t item{producer.raw.handle(), 0, ZMQ_POLLIN, 0};
  std::string reply;
  for (auto deadline = Clock::now() + std::chrono::seconds(5); reply.empty() && Clock::now() < deadline;) {
    if (zmq::poll(&item, 1, std::chrono::milliseconds(100)) <= 0) continue;
    zmq::message_t m;
    if (!producer.raw.recv(m, zmq::recv_flags::dontwait)) continue;
    if (m.size() > 40 && static_cast<uint8_t>(m.data<char>()[4]) == 4) reply = m.to_string().substr(40);  // abort
  }
  CHECK_MESSAGE(
      reply.find("opened with a window of 2147483648 bytes and 4 messages, above the consumer's caps") != std::string::npos,
      reply);
}

TEST_CASE("Stream.ConsumerHubNeverAnswers" * doctest::timeout(10)) {
  TempDir dir;
  auto hub = StartHub(dir.path());
  // A port nobody listens on (bound and closed by a throwaway hub).
  StreamPeer dead;
  {
    auto tmp = StartHub({});
    dead = tmp->endpoints();
  }
  StreamOptions o = Quick();
  o.open_timeout = milliseconds(300);
  o.window_messages = 2;
  auto w = hub->OpenWriter(dead, {5, 1, 0}, o);
  REQUIRE(w.ok());
  Status s;
  auto start = Clock::now();
  for (int i = 0; i < 10 && s.ok(); ++i) s = (*w)->Write(Buffer(std::string("x")));
  CHECK(s.code() == StatusCode::kUnavailable);
  CHECK(SecondsSince(start) < 2.0);
}

// ---- two processes -----------------------------------------------------------------------------

// A producer "daemon" in a child process (tests/child_process.h): it receives the consumer
// hub's endpoints, starts its own hub and runs `body`, then exits 0 when body returned true.
int RunProducer(const std::function<bool(StreamHub&, const StreamPeer&)>& body) {
  std::string peer = copse::testing::ReceiveFromParent();
  if (peer.empty()) return 2;
  auto hub = StreamHub::Start(kHost, 0, {}, kSecret);
  if (!hub.ok()) return 3;
  auto parsed = StreamPeer::FromJson(Json::parse(peer));
  if (!parsed.ok()) return 4;
  bool ok = body(**hub, *parsed);
  // A process that exits right after Close leaves its last frames only the sockets' linger
  // (1 s) to go out, which a loaded machine can outlast (the 1 GiB test's last message was
  // lost so, twice in a year of runs). Wait until the consumer has read everything (credited it
  // back), as a daemon, which outlives its writers, always does; then the end-of-stream frame
  // alone is left to the linger.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (ok && (*hub)->in_flight_bytes() > 0 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  hub->reset();  // flushes what is queued (linger)
  return ok ? 0 : 1;
}

constexpr StreamKey kBlockedKey{6, 1, 0};

// Writes 5 messages through a 4-message window (the 5th blocks) and then idles until killed.
COPSE_TEST_CHILD(stream_blocked_producer) {
  return RunProducer([](StreamHub& hub, const StreamPeer& peer) {
    StreamOptions o;
    o.window_messages = 4;
    auto w = hub.OpenWriter(peer, kBlockedKey, o);
    if (!w.ok()) return false;
    for (int i = 0; i < 5; ++i) (void)(*w)->Write(Buffer(Pattern(100, 6, i)));
    for (;;) ::pause();
  });
}

constexpr StreamKey kGiBKey{7, 1, 0};
constexpr int kGiBMessages = 1024;
constexpr size_t kGiBMessageSize = 1 << 20;

// About memory, not liveness: a loaded CI machine may starve a heartbeat past the default 1 s.
StreamOptions Patient() {
  StreamOptions o;
  o.peer_timeout = std::chrono::seconds(10);
  return o;
}

// Writes 1 GiB as 1 MiB messages, each stamped with its index.
COPSE_TEST_CHILD(stream_gib_producer) {
  return RunProducer([](StreamHub& hub, const StreamPeer& peer) {
    auto w = hub.OpenWriter(peer, kGiBKey, Patient());
    if (!w.ok()) return false;
    std::string base = Pattern(kGiBMessageSize, 7, 0);
    for (uint64_t i = 0; i < kGiBMessages; ++i) {
      std::string m = base;
      std::memcpy(m.data(), &i, sizeof i);
      if (!(*w)->Write(Buffer(std::move(m))).ok()) return false;
    }
    return (*w)->Close().ok();
  });
}

/// The state letter /proc gives process `pid` (R running, S sleeping, Z exited, unreaped), or "gone".
std::string ProcessState(pid_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
  std::string stat;
  std::getline(f, stat);
  const size_t paren = stat.rfind(')');
  return paren == std::string::npos || paren + 2 >= stat.size() ? "gone" : stat.substr(paren + 2, 1);
}

size_t PeakRssKiB() {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("VmHWM:", 0) == 0) return std::stoul(line.substr(6));
  return 0;
}

TEST_CASE("Stream.KilledProducerIsUnavailableWithinPeerTimeout" * doctest::timeout(15)) {
  copse::testing::ChildProcess child("stream_blocked_producer");
  TempDir dir;
  auto hub = StartHub(dir.path());
  child.Send(TcpOnly(hub->endpoints()).ToJson().dump());
  StreamOptions o = Quick();  // peer_timeout 500 ms
  auto r = hub->OpenReader(kBlockedKey, o);
  REQUIRE(r.ok());
  for (int i = 0; i < 3; ++i) {
    auto m = (*r)->Next();
    REQUIRE_MESSAGE(m.ok(), m.status().ToString());
    REQUIRE(m->has_value());
    CHECK((*m)->view() == Pattern(100, 6, i));
  }
  std::this_thread::sleep_for(milliseconds(800));  // alive but blocked: heartbeats, no false alarm
  for (int i = 3; i < 5; ++i) {
    auto m = (*r)->Next();
    REQUIRE_MESSAGE(m.ok(), m.status().ToString());
    REQUIRE(m->has_value());
  }
  ::kill(child.pid(), SIGKILL);
  auto killed = Clock::now();
  auto e = (*r)->Next();
  double waited = SecondsSince(killed);
  CHECK(e.status().code() == StatusCode::kUnavailable);
  MESSAGE("dead producer noticed after " << waited << " s: " << e.status().ToString());
  CHECK(waited < 0.5 + 1.0);
  child.Wait();
}

TEST_CASE("Stream.OneGiBBetweenProcessesInBoundedMemory" * doctest::timeout(60)) {
  constexpr int kMessages = kGiBMessages;
  constexpr size_t kSize = kGiBMessageSize;
  copse::testing::ChildProcess child("stream_gib_producer");
  TempDir dir;
  auto hub = StartHub(dir.path());
  {
    std::ofstream clear("/proc/self/clear_refs");
    clear << "5";  // resets VmHWM to the current RSS (Linux >= 4.0)
  }
  size_t rss_before = PeakRssKiB();
  child.Send(TcpOnly(hub->endpoints()).ToJson().dump());
  auto r = hub->OpenReader(kGiBKey, Patient());
  REQUIRE(r.ok());
  auto start = Clock::now();
  std::string base = Pattern(kSize, 7, 0);
  for (uint64_t i = 0; i < kMessages; ++i) {
    auto m = (*r)->Next();
    // A rare failure here (no word from the producer for the whole 10 s) has been seen only while
    // other test runs loaded the machine; the producer's state tells a stall from an early exit.
    REQUIRE_MESSAGE(m.ok(), m.status().ToString()
                                << " after message " << i << "; the producer process is " << ProcessState(child.pid()));
    REQUIRE(m->has_value());
    REQUIRE((*m)->size() == kSize);
    uint64_t idx;
    std::memcpy(&idx, (*m)->data(), sizeof idx);
    REQUIRE(idx == i);
    REQUIRE(std::memcmp((*m)->data() + 8, base.data() + 8, 4096) == 0);
    REQUIRE(std::memcmp((*m)->data() + kSize - 4096, base.data() + kSize - 4096, 4096) == 0);
  }
  auto end = (*r)->Next();
  REQUIRE(end.ok());
  CHECK(!end->has_value());
  double s = SecondsSince(start);
  size_t peak = PeakRssKiB();
  MESSAGE("1 GiB over tcp in " << s << " s (" << (kMessages * double(kSize) / s / 1e9) << " GB/s); peak RSS " << peak / 1024
                               << " MiB (before: " << rss_before / 1024 << " MiB)");
  CHECK(peak < rss_before + 256 * 1024);
  CHECK(WEXITSTATUS(child.Wait()) == 0);
}

}  // namespace
}  // namespace copse::chan
