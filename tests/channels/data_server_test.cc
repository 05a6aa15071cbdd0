// Fetching outputs between daemons: the data server, the remote reader and its connection pool,
// and a server's behaviour towards bad or dying peers. Loopback (127.0.0.1) only.
#include "channels/data_server.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <doctest/doctest.h>

#include <chrono>
#include <fstream>
#include <thread>
#include <utility>
#include <vector>

#include "channels/record_format.h"
#include "channels/remote_reader.h"
#include "channels/socket.h"
#include "common/auth.h"
#include "common/wire.h"
#include "protocol/codec.h"
#include "tests/channels/channel_test_util.h"
#include "tests/child_process.h"

namespace copse::chan {
namespace {

using testing::Drain;
using testing::DrainStatus;
using testing::Pattern;
using testing::PayloadMessage;
using testing::TempDir;
using testing::WriteMemoryOutput;
using Clock = std::chrono::steady_clock;

const std::string kSecret = "0123456789abcdef0123456789abcdef-test";
const std::string kHost = "127.0.0.1";

struct Daemon {
  TempDir dir;
  std::unique_ptr<OutputStore> store;
  std::unique_ptr<DataServer> server;

  explicit Daemon(uint64_t budget = 1ull << 30, DataServerOptions options = {2000, 2000}) {
    auto s = OutputStore::Make(dir.path() / "outputs", budget);
    REQUIRE(s.ok());
    store = std::move(s).value();
    auto srv = DataServer::Start(*store, kHost, 0, kSecret, options);
    REQUIRE_MESSAGE(srv.ok(), srv.status().ToString());
    server = std::move(srv).value();
  }

  void Put(const OutputKey& key, StorageKind kind, const std::vector<std::string>& msgs) {
    auto w = store->CreateWriter(key, kind);
    REQUIRE(w.ok());
    for (const auto& m : msgs) REQUIRE((*w)->Write(Buffer(m)).ok());
    REQUIRE((*w)->Close().ok());
  }
};

/// Whether readers use the same-host local socket (the default outside tests) or TCP.
bool g_local_socket = false;

/// For the rest of a test case: the transport its SUBCASE picked.
struct TransportScope {
  explicit TransportScope(bool local) { g_local_socket = local; }
  ~TransportScope() { g_local_socket = false; }
};

/// Runs the rest of the test case twice: over TCP, then through the server's local socket (file
/// outputs handed over by descriptor). `local` names the transport in the body.
#define COPSE_FOR_BOTH_TRANSPORTS(local)        \
  bool local = false;                           \
  SUBCASE("over TCP") { local = false; }        \
  SUBCASE("same-host socket") { local = true; } \
  TransportScope transport_scope_(local)

RemoteReaderOptions Quick() {
  RemoteReaderOptions o{2000, 2000};
  o.local_socket = g_local_socket;
  return o;
}

std::vector<std::string> Fetch(const Daemon& d, const OutputKey& key) {
  auto r = OpenRemoteReader(kHost, d.server->port(), key, kSecret, Quick());
  REQUIRE_MESSAGE(r.ok(), r.status().ToString());
  return Drain(**r);
}

Status FetchStatus(uint16_t port, const OutputKey& key, const std::string& secret = kSecret) {
  auto r = OpenRemoteReader(kHost, port, key, secret, Quick());
  if (!r.ok()) return r.status();
  return DrainStatus(**r);
}

/// A raw TCP connection for speaking (bad) protocol by hand.
struct Raw {
  internal::BufferedSocket s;
  explicit Raw(uint16_t port) : s(Connect(port)) {}
  static internal::Socket Connect(uint16_t port) {
    auto s = internal::Socket::Connect(kHost, port, 2000);
    REQUIRE(s.ok());
    return std::move(s).value();
  }
  Json ReadJson() {
    auto j = internal::ReadJson(s, 1 << 20, 3000, 3000);
    REQUIRE_MESSAGE(j.ok(), j.status().ToString());
    return *j;
  }
  void Send(std::string_view bytes) { REQUIRE(s.socket().WriteAll(bytes.data(), bytes.size()).ok()); }
  void Authenticate() {
    Json hello = ReadJson();
    REQUIRE(hello["op"] == "hello");
    Json auth = {{"op", "auth"}, {"role", "peer"}, {"mac", auth::Mac(kSecret, hello["nonce"].get<std::string>())}};
    Send(wire::EncodeFrame(wire::FrameType::kJson, auth.dump()));
    REQUIRE(ReadJson()["op"] == "welcome");
  }
  /// Sends a data-plane request (protocol/data.proto).
  void Send(const protocol::DataRequest& request) { Send(protocol::EncodeFrame(request)); }
  /// The next frame, a data reply.
  protocol::DataReply ReadReply() {
    auto h = internal::ReadHeader(s, 1 << 20, 3000, 3000);
    REQUIRE_MESSAGE(h.ok(), h.status().ToString());
    auto body = internal::ReadBody(s, *h, 3000);
    REQUIRE(body.ok());
    REQUIRE(h->type == wire::FrameType::kProto);
    auto reply = protocol::DecodeDataReply(*body);
    REQUIRE_MESSAGE(reply.ok(), reply.status().ToString());
    return *reply;
  }
  /// True when the server closed the connection (within 3 s).
  bool Closed() {
    char c;
    for (;;) {
      auto r = s.socket().ReadSome(&c, 1, 3000);
      if (!r.ok()) return r.status().code() == StatusCode::kUnavailable;
    }
  }
};

std::vector<std::string> MixedMessages() {
  std::vector<std::string> m = {"", "x"};
  for (int i = 0; i < 2000; ++i) m.push_back(Pattern(static_cast<size_t>(i % 97), 5, i));
  for (int i = 0; i < 6; ++i) m.push_back(Pattern((1 << 20) + 3 * i, 6, i));
  m.push_back("");
  return m;
}

}  // namespace

TEST_CASE("RemoteFetch.RoundTripBothKinds" * doctest::timeout(20)) {
  COPSE_FOR_BOTH_TRANSPORTS(local);
  Daemon d;
  auto msgs = MixedMessages();
  d.Put({1, 0, 0, 0}, StorageKind::kMemory, msgs);
  d.Put({1, 1, 0, 0}, StorageKind::kFile, msgs);
  d.Put({1, 2, 0, 0}, StorageKind::kFile, {});
  d.Put({1, 3, 0, 0}, StorageKind::kMemory, {});
  CHECK(Fetch(d, {1, 0, 0, 0}) == msgs);
  CHECK(Fetch(d, {1, 1, 0, 0}) == msgs);
  CHECK(Fetch(d, {1, 2, 0, 0}).empty());
  CHECK(Fetch(d, {1, 3, 0, 0}).empty());
  CHECK(FetchStatus(d.server->port(), {1, 9, 0, 0}).code() == StatusCode::kNotFound);
  CHECK(Fetch(d, {1, 0, 0, 0}) == msgs);             // the connection is still good after a refusal
  CHECK(d.server->handoffs() == (local ? 1u : 0u));  // the file output with messages, when local
}

TEST_CASE("RemoteFetch.OverTlsOutputsArriveWholeAndPlaintextPeersAreToldWhy" * doctest::timeout(30)) {
  TempDir tls_dir;
  REQUIRE(tls::CreateClusterCertificateIfAbsent(tls_dir.path()).ok());
  auto ctx = tls::Context::Load(tls_dir.path());
  REQUIRE(ctx.ok());
  DataServerOptions server_options{2000, 2000};
  server_options.tls = *ctx;
  Daemon secured(1ull << 30, server_options);
  auto msgs = MixedMessages();
  secured.Put({1, 0, 0, 0}, StorageKind::kMemory, msgs);
  secured.Put({1, 1, 0, 0}, StorageKind::kFile, msgs);
  RemoteReaderOptions tls_reader{2000, 2000};
  tls_reader.tls = *ctx;
  for (bool local_ok : {false, true}) {
    // Same host: the local socket stays plaintext (it never leaves the host), TCP is TLS.
    tls_reader.local_socket = local_ok;
    for (uint64_t vertex : {0, 1}) {
      auto r = OpenRemoteReader(kHost, secured.server->port(), {1, vertex, 0, 0}, kSecret, tls_reader);
      REQUIRE_MESSAGE(r.ok(), r.status().ToString());
      CHECK(Drain(**r) == msgs);
    }
  }
  CHECK(secured.server->handoffs() == 1u);  // the file output, through the local socket
  // A plaintext reader over TCP reads the banner's reason.
  Status plain = FetchStatus(secured.server->port(), {1, 0, 0, 0});
  CHECK(plain.code() == StatusCode::kFailedPrecondition);
  CHECK_MESSAGE(plain.message().find("requires TLS") != std::string::npos, plain.ToString());
  // A TLS reader of a plaintext server is told so.
  Daemon plaintext;
  plaintext.Put({1, 0, 0, 0}, StorageKind::kMemory, msgs);
  tls_reader.local_socket = false;
  auto r = OpenRemoteReader(kHost, plaintext.server->port(), {1, 0, 0, 0}, kSecret, tls_reader);
  REQUIRE_FALSE(r.ok());
  CHECK(r.status().code() == StatusCode::kFailedPrecondition);
  CHECK_MESSAGE(r.status().message().find("speaks plaintext") != std::string::npos, r.status().ToString());
}

TEST_CASE("RemoteFetch.PayloadsAreEncodedOnceForRemoteReaders" * doctest::timeout(20)) {
  COPSE_FOR_BOTH_TRANSPORTS(local);
  Daemon d;
  auto object = std::make_shared<testing::CountingPayload>(Pattern(3 << 20, 9, 0));
  WriteMemoryOutput(*d.store, {3, 0, 0, 0}, {Buffer("plain"), PayloadMessage(object)});
  const std::vector<std::string> want = {"plain", Pattern(3 << 20, 9, 0)};
  CHECK(Fetch(d, {3, 0, 0, 0}) == want);
  CHECK(Fetch(d, {3, 0, 0, 0}) == want);
  CHECK(object->encodes == 1);
}

TEST_CASE("RemoteFetch.PayloadsWithSpansAreSentInPlaceNotEncoded" * doctest::timeout(20)) {
  COPSE_FOR_BOTH_TRANSPORTS(local);
  Daemon d;
  auto object = std::make_shared<testing::SpannedPayload>(std::vector<std::string>{"head", "", Pattern(3 << 20, 5, 0), "tail"});
  WriteMemoryOutput(*d.store, {3, 1, 0, 0}, {PayloadMessage(object), Buffer("plain")});
  const std::vector<std::string> want = {object->Joined(), "plain"};
  CHECK(Fetch(d, {3, 1, 0, 0}) == want);
  CHECK(Fetch(d, {3, 1, 0, 0}) == want);
  CHECK(object->encodes == 0);
}

TEST_CASE("RemoteFetch.PayloadSpansThatDoNotAddUpAreEncodedInstead" * doctest::timeout(20)) {
  // A payload breaking its contract: its spans are shorter than its encoding. Sending them
  // would frame a record of EncodedSize() bytes and write fewer.
  class ShortSpans final : public Payload {
   public:
    size_t EncodedSize() const override { return 10; }
    std::string Encode() const override { return "0123456789"; }
    std::vector<std::string_view> Spans() const override { return {"0123"}; }
  };
  COPSE_FOR_BOTH_TRANSPORTS(local);
  Daemon d;
  WriteMemoryOutput(*d.store, {3, 3, 0, 0}, {PayloadMessage(std::make_shared<ShortSpans>()), Buffer("after")});
  CHECK(Fetch(d, {3, 3, 0, 0}) == std::vector<std::string>{"0123456789", "after"});
}

TEST_CASE("RemoteFetch.AMessageLargerThanAFrameIsGatheredFromItsSpans" * doctest::timeout(30)) {
  COPSE_FOR_BOTH_TRANSPORTS(local);
  Daemon d;
  // The frame boundary (kMaxPieceBytes) falls inside the middle span.
  std::string first(internal::kMaxPieceBytes - 10, 'x');
  first[3] = 'a';
  auto object = std::make_shared<testing::SpannedPayload>(
      std::vector<std::string>{std::move(first), "0123456789abcdefghij", Pattern(100 << 10, 6, 0)});
  WriteMemoryOutput(*d.store, {3, 2, 0, 0}, {PayloadMessage(object)});
  CHECK(Fetch(d, {3, 2, 0, 0}) == std::vector<std::string>{object->Joined()});
  CHECK(object->encodes == 0);
}

TEST_CASE("RemoteFetch.MessageLargerThanAFrame" * doctest::timeout(20)) {
  COPSE_FOR_BOTH_TRANSPORTS(local);
  Daemon d;
  std::vector<std::string> msgs = {"head", std::string(internal::kMaxPieceBytes * 2 + 12345, 'z'), "tail"};
  msgs[1][7] = 'a';
  msgs[1][internal::kMaxPieceBytes + 1] = 'b';
  d.Put({2, 0, 0, 0}, StorageKind::kMemory, msgs);
  CHECK(Fetch(d, {2, 0, 0, 0}) == msgs);
}

TEST_CASE("RemoteFetch.CorruptedOutputIsDataLoss" * doctest::timeout(10)) {
  COPSE_FOR_BOTH_TRANSPORTS(local);
  Daemon d;
  auto msgs = MixedMessages();
  d.Put({3, 0, 0, 0}, StorageKind::kMemory, msgs);
  d.Put({3, 1, 0, 0}, StorageKind::kFile, msgs);
  d.Put({3, 2, 0, 0}, StorageKind::kFile, {});
  for (uint32_t v = 0; v < 3; ++v) {
    REQUIRE(d.store->Corrupt({3, v, 0, 0}).ok());
    CHECK(FetchStatus(d.server->port(), {3, v, 0, 0}).code() == StatusCode::kDataLoss);
  }
  REQUIRE(d.store->Remove({3, 0, 0, 0}).ok());
  CHECK(FetchStatus(d.server->port(), {3, 0, 0, 0}).code() == StatusCode::kNotFound);
}

TEST_CASE("RemoteFetch.AWaitingFetchGetsAnOutputWrittenAfterItAsked" * doctest::timeout(20)) {
  COPSE_FOR_BOTH_TRANSPORTS(local);
  Daemon d;
  const OutputKey key{4, 1, 1, 0};
  RemoteReaderOptions waiting = Quick();
  waiting.wait_ms = 3000;
  // Not produced within the wait: Timeout (the consumer asks again), not NotFound.
  RemoteReaderOptions brief = Quick();
  brief.wait_ms = 50;
  auto early = OpenRemoteReader(kHost, d.server->port(), key, kSecret, brief);
  REQUIRE_FALSE(early.ok());
  CHECK(early.status().code() == StatusCode::kTimeout);
  // Produced while the fetch waits: it arrives whole, as soon as it is written.
  std::thread producer([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    d.Put(key, StorageKind::kMemory, {"late", "but whole"});
  });
  const auto asked = Clock::now();
  auto r = OpenRemoteReader(kHost, d.server->port(), key, kSecret, waiting);
  producer.join();
  REQUIRE_MESSAGE(r.ok(), r.status().ToString());
  CHECK(Drain(**r) == std::vector<std::string>{"late", "but whole"});
  CHECK(Clock::now() - asked < std::chrono::milliseconds(2500));
  // Removed (a fault) while a fetch waits for it: NotFound at once, not a wait to the end.
  const OutputKey gone{4, 2, 1, 0};
  d.Put(gone, StorageKind::kMemory, {"x"});
  REQUIRE(d.store->Remove(gone).ok());
  auto removed = OpenRemoteReader(kHost, d.server->port(), gone, kSecret, waiting);
  REQUIRE_FALSE(removed.ok());
  CHECK(removed.status().code() == StatusCode::kNotFound);
}

TEST_CASE("DataServer.AMalformedRequestIsRefusedNamingTheField" * doctest::timeout(10)) {
  Daemon d;
  protocol::DataRequest keyless;
  keyless.mutable_fetch()->set_wait_ms(5);
  // A request this build does not know (field 31, varint 1): parsed with its field kept unknown.
  const std::string unknown("\xf8\x01\x01", 3);
  const std::pair<std::string, std::string> cases[] = {
      {protocol::EncodeFrame(keyless), "DataRequest.fetch.key: required"},
      {protocol::EncodeFrame(protocol::DataRequest()), "DataRequest.body: empty"},
      {wire::EncodeFrame(wire::FrameType::kProto, unknown), "DataRequest.body: a request this data server does not know"},
      {wire::EncodeFrame(wire::FrameType::kProto, "\xff\xff"), "DataRequest: the body does not parse"},
      {wire::EncodeFrame(wire::FrameType::kJson, R"({"op":"fetch"})"), "expected a request (a protocol frame"},
  };
  for (const auto& [frame, why] : cases) {
    CAPTURE(why);
    Raw raw(d.server->port());
    raw.Authenticate();
    raw.Send(frame);
    Json error = raw.ReadJson();
    CHECK(error["op"] == "error");
    CHECK_MESSAGE(StringMember(error, "message").find(why) != std::string::npos, error.dump());
    CHECK(raw.Closed());
  }
}

TEST_CASE("RemoteFetch.PooledConnectionsAreReused" * doctest::timeout(20)) {
  COPSE_FOR_BOTH_TRANSPORTS(local);
  Daemon d;
  for (uint32_t v = 0; v < 10; ++v) d.Put({4, v, 0, 0}, StorageKind::kMemory, {Pattern(100, v, 0)});
  auto before = GetRemotePoolStats();
  auto t0 = Clock::now();
  for (int i = 0; i < 1000; ++i) {
    auto got = Fetch(d, {4, static_cast<uint32_t>(i % 10), 0, 0});
    REQUIRE(got.size() == 1);
  }
  double s = std::chrono::duration<double>(Clock::now() - t0).count();
  MESSAGE("1000 small fetches in " << s << " s");
  CHECK(d.server->connections_accepted() <= 2);
  CHECK(d.server->fetches() == 1000);
  CHECK(GetRemotePoolStats().connections_reused - before.connections_reused >= 998);
  CHECK(s < 10);

  // A reader abandoned mid-stream does not leave a half-read connection in the pool.
  std::vector<std::string> big;
  for (int i = 0; i < 64; ++i) big.push_back(Pattern(64 << 10, 7, i));
  d.Put({4, 100, 0, 0}, StorageKind::kMemory, big);
  for (int i = 0; i < 5; ++i) {
    auto r = OpenRemoteReader(kHost, d.server->port(), {4, 100, 0, 0}, kSecret, Quick());
    REQUIRE(r.ok());
    REQUIRE((*r)->Next().ok());
  }
  CHECK(Fetch(d, {4, 3, 0, 0}).size() == 1);
  CHECK(Fetch(d, {4, 100, 0, 0}) == big);
}

TEST_CASE("RemoteFetch.ManyThreads" * doctest::timeout(20)) {
  COPSE_FOR_BOTH_TRANSPORTS(local);
  Daemon d;
  auto msgs = MixedMessages();
  d.Put({5, 0, 0, 0}, StorageKind::kMemory, msgs);
  d.Put({5, 1, 0, 0}, StorageKind::kFile, msgs);
  std::atomic<int> bad{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 5; ++i) {
        auto r = OpenRemoteReader(kHost, d.server->port(), {5, static_cast<uint32_t>((t + i) % 2), 0, 0}, kSecret, Quick());
        if (!r.ok()) {
          ++bad;
          continue;
        }
        std::vector<std::string> got;
        for (;;) {
          auto m = (*r)->Next();
          if (!m.ok()) {
            ++bad;
            break;
          }
          if (!m->has_value()) break;
          got.emplace_back((*m)->view());
        }
        if (got != msgs) ++bad;
      }
    });
  }
  for (auto& t : threads) t.join();
  CHECK(bad == 0);
  CHECK(d.server->connections_accepted() <= 8);
}

TEST_CASE("RemoteFetch.StalePooledConnectionIsReplaced" * doctest::timeout(20)) {
  COPSE_FOR_BOTH_TRANSPORTS(local);
  Daemon d;
  d.Put({6, 0, 0, 0}, StorageKind::kMemory, {"a", "b"});
  uint16_t port = d.server->port();
  CHECK(Fetch(d, {6, 0, 0, 0}).size() == 2);  // leaves an idle pooled connection
  d.server->Stop();
  CHECK(FetchStatus(port, {6, 0, 0, 0}).code() == StatusCode::kUnavailable);
  auto srv = DataServer::Start(*d.store, kHost, port, kSecret);
  REQUIRE_MESSAGE(srv.ok(), srv.status().ToString());
  d.server = std::move(srv).value();
  CHECK(Fetch(d, {6, 0, 0, 0}).size() == 2);
}

TEST_CASE("DataServer.BadMacIsRefused" * doctest::timeout(10)) {
  COPSE_FOR_BOTH_TRANSPORTS(local);
  Daemon d;
  d.Put({7, 0, 0, 0}, StorageKind::kMemory, {"secret data"});
  Status st = FetchStatus(d.server->port(), {7, 0, 0, 0}, "the-wrong-secret-the-wrong-secret");
  CHECK(st.code() == StatusCode::kPermissionDenied);
  CHECK(st.message().find("authentication failed") != std::string::npos);
  // A raw client with a wrong role or MAC is told why and disconnected.
  Raw raw(d.server->port());
  Json hello = raw.ReadJson();
  raw.Send(wire::EncodeFrame(wire::FrameType::kJson, Json{{"op", "auth"}, {"role", "peer"}, {"mac", "00"}}.dump()));
  Json reply = raw.ReadJson();
  CHECK(reply["op"] == "error");
  CHECK(raw.Closed());
  CHECK(Fetch(d, {7, 0, 0, 0}).size() == 1);
}

TEST_CASE("DataServer.GarbageIsRefusedAndOthersAreServed" * doctest::timeout(20)) {
  Daemon d;
  d.Put({8, 0, 0, 0}, StorageKind::kMemory, {"ok"});
  const uint16_t port = d.server->port();
  auto expect_error_and_close = [&](Raw& raw, const std::string& what) {
    Json reply = raw.ReadJson();
    CHECK_MESSAGE(reply["op"] == "error", what);
    MESSAGE(what << ": " << reply.dump());
    CHECK_MESSAGE(raw.Closed(), what);
  };
  {  // garbage instead of the handshake
    Raw raw(port);
    raw.ReadJson();
    raw.Send(std::string(100, '\x7f'));
    expect_error_and_close(raw, "garbage");
  }
  {  // after authenticating: wrong magic
    Raw raw(port);
    raw.Authenticate();
    raw.Send("GET / HTTP/1.1\r\nHost: x\r\n\r\n");
    expect_error_and_close(raw, "wrong magic");
  }
  {  // wrong protocol version
    Raw raw(port);
    raw.Authenticate();
    std::string f = wire::EncodeFrame(wire::FrameType::kJson, R"({"op":"ping"})");
    f[4] = 9;
    raw.Send(f);
    expect_error_and_close(raw, "wrong version");
  }
  {  // oversized frame (a 4 GB request)
    Raw raw(port);
    raw.Authenticate();
    auto h = wire::EncodeHeader(wire::FrameType::kJson, 0xfffffff0u);
    raw.Send(std::string_view(h.data(), h.size()));
    expect_error_and_close(raw, "oversized");
  }
  {  // valid frames, nonsense content
    Raw raw(port);
    raw.Authenticate();
    raw.Send(wire::EncodeFrame(wire::FrameType::kJson, "[1,2"));
    expect_error_and_close(raw, "bad json");
  }
  {
    Raw raw(port);
    raw.Authenticate();
    raw.Send(wire::EncodeFrame(wire::FrameType::kJson, R"({"op":"fetch","key":{"job":"x"}})"));
    expect_error_and_close(raw, "bad key");
  }
  // Members of the wrong type, before and after authenticating, and nesting no server should
  // recurse through: each ends only its own connection.
  for (const char* handshake : {R"({"op":1})", R"({"op":"auth","role":1,"mac":"x"})", R"([1])"}) {
    Raw raw(port);
    raw.ReadJson();
    raw.Send(wire::EncodeFrame(wire::FrameType::kJson, handshake));
    expect_error_and_close(raw, handshake);
  }
  for (std::string request :
       {std::string(R"({"op":1})"), std::string(R"({"op":["fetch"]})"), std::string(100000, '[') + std::string(100000, ']')}) {
    Raw raw(port);
    raw.Authenticate();
    raw.Send(wire::EncodeFrame(wire::FrameType::kJson, request));
    expect_error_and_close(raw, request.substr(0, 20));
  }
  {  // ping works on an authenticated raw connection
    Raw raw(port);
    raw.Authenticate();
    protocol::DataRequest ping;
    ping.mutable_ping();
    raw.Send(ping);
    CHECK(raw.ReadReply().has_pong());
  }
  {  // A byte every 400 ms keeps each read alive, but not the handshake past its 2 s.
    Raw trickle(port);
    trickle.ReadJson();
    const std::string frame =
        wire::EncodeFrame(wire::FrameType::kJson, R"({"op":"auth","role":"peer","mac":")" + std::string(40, 'a') + R"("})");
    const auto start = std::chrono::steady_clock::now();
    bool closed = false;
    for (size_t i = 0; i < frame.size() && !closed; ++i) {
      (void)trickle.s.socket().WriteAll(frame.data() + i, 1);
      std::this_thread::sleep_for(std::chrono::milliseconds(400));
      char c;
      auto r = trickle.s.socket().ReadSome(&c, 1, 0);
      closed = !r.ok() && r.status().code() == StatusCode::kUnavailable;
    }
    CHECK(closed);
    CHECK(std::chrono::steady_clock::now() - start < std::chrono::milliseconds(4500));  // 2 s, and the acceptor's 1 s poll
  }
  // A client that connects and says nothing holds only its own thread, for the handshake timeout.
  Raw silent(port);
  CHECK(Fetch(d, {8, 0, 0, 0}) == std::vector<std::string>{"ok"});
  silent.ReadJson();
  CHECK(silent.Closed());  // handshake timeout (2 s in these tests)
  CHECK(Fetch(d, {8, 0, 0, 0}) == std::vector<std::string>{"ok"});
}

TEST_CASE("DataServer.ConnectionsInTheirHandshakeAreCappedAndTheRestServed" * doctest::timeout(20)) {
  // Anyone may connect, and each connection holds a thread until its handshake ends: beyond the
  // cap, the oldest in its handshake is closed for each new one, so silent peers cannot lock a
  // real one out; authenticated ones are not counted.
  TempDir dir;
  auto store = OutputStore::Make(dir.path() / "outputs", 1 << 20);
  REQUIRE(store.ok());
  DataServerOptions o;
  o.handshake_timeout_ms = 2000;
  o.max_handshaking = 2;
  auto server = DataServer::Start(**store, kHost, 0, kSecret, o);
  REQUIRE(server.ok());
  const uint16_t port = (*server)->port();
  Raw authenticated(port);
  authenticated.Authenticate();
  auto silent1 = std::make_unique<Raw>(port), silent2 = std::make_unique<Raw>(port);
  silent1->ReadJson();  // hello: served
  silent2->ReadJson();
  Raw third(port);
  third.ReadJson();  // greeted...
  char byte;
  auto r = silent1->s.socket().ReadSome(&byte, 1, 1000);
  CHECK_MESSAGE(!r.ok(), "the oldest silent connection was kept");  // ...and the oldest closed for it
  CHECK(r.status().code() == StatusCode::kUnavailable);
  {
    // Silent peers hold the cap (silent2, third): a real fetch still gets through.
    auto w = (*store)->CreateWriter({9, 0, 0, 0}, StorageKind::kMemory);
    REQUIRE(w.ok());
    REQUIRE((*w)->Write(Buffer(std::string("held"))).ok());
    REQUIRE((*w)->Close().ok());
    auto reader = OpenRemoteReader(kHost, port, {9, 0, 0, 0}, kSecret, Quick());
    REQUIRE_MESSAGE(reader.ok(), reader.status().ToString());
    CHECK(Drain(**reader) == std::vector<std::string>{"held"});
  }
  silent1.reset();
  silent2.reset();
  // Their threads end with them; a new peer is greeted again.
  const auto deadline = Clock::now() + std::chrono::seconds(5);
  bool greeted = false;
  while (!greeted && Clock::now() < deadline) {
    Raw next(port);
    char c;
    greeted = next.s.socket().ReadSome(&c, 1, 1000).ok();
    if (!greeted) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  CHECK(greeted);
  protocol::DataRequest ping;
  ping.mutable_ping();
  authenticated.Send(ping);
  CHECK(authenticated.ReadReply().has_pong());
}

TEST_CASE("RemoteFetch.UnreachablePeerIsUnavailable" * doctest::timeout(10)) {
  uint16_t port;
  {
    Daemon d;
    port = d.server->port();
  }
  CHECK(FetchStatus(port, {1, 0, 0, 0}).code() == StatusCode::kUnavailable);
}

namespace {

// A producer daemon in a child process (tests/child_process.h) with a 96 MiB memory output
// {9,0,0,0} and the same as a file output {9,1,0,0}: it
// receives a scratch directory, serves the output and answers with its data server's port.
COPSE_TEST_CHILD(data_server_96mib) {
  std::filesystem::path dir = copse::testing::ReceiveFromParent();
  auto store = OutputStore::Make(dir / "child", 1ull << 30);
  if (!store.ok()) return 1;
  auto w = (*store)->CreateWriter({9, 0, 0, 0}, StorageKind::kMemory);
  auto f = (*store)->CreateWriter({9, 1, 0, 0}, StorageKind::kFile);
  for (int i = 0; i < 96; ++i) {
    (void)(*w)->Write(Buffer(Pattern(1 << 20, 9, i)));
    (void)(*f)->Write(Buffer(Pattern(1 << 20, 9, i)));
  }
  (void)(*w)->Close();
  (void)(*f)->Close();
  auto srv = DataServer::Start(**store, kHost, 0, kSecret);
  if (!srv.ok()) return 1;
  if (!copse::testing::SendToParent(std::to_string((*srv)->port()))) return 1;
  for (;;) ::pause();
}

/// Starts the child daemon; its port.
uint16_t StartChildDaemon(copse::testing::ChildProcess& child, const TempDir& dir) {
  child.Send(dir.path().string());
  return static_cast<uint16_t>(std::stoi(child.Receive()));
}

}  // namespace

TEST_CASE("RemoteFetch.PeerKilledMidStreamIsUnavailable" * doctest::timeout(20)) {
  COPSE_FOR_BOTH_TRANSPORTS(local);
  TempDir dir;
  copse::testing::ChildProcess child("data_server_96mib");
  uint16_t port = StartChildDaemon(child, dir);
  auto r = OpenRemoteReader(kHost, port, {9, 0, 0, 0}, kSecret, Quick());
  REQUIRE_MESSAGE(r.ok(), r.status().ToString());
  for (int i = 0; i < 3; ++i) {
    auto m = (*r)->Next();
    REQUIRE(m.ok());
    CHECK((*m)->view() == Pattern(1 << 20, 9, i));
  }
  child.Kill();
  auto t0 = Clock::now();
  Status st = DrainStatus(**r);
  CHECK(st.code() == StatusCode::kUnavailable);
  MESSAGE(st.ToString());
  CHECK(std::chrono::duration<double>(Clock::now() - t0).count() < 5);
  CHECK(FetchStatus(port, {9, 0, 0, 0}).code() == StatusCode::kUnavailable);
}

TEST_CASE("RemoteFetch.StalledPeerTimesOut" * doctest::timeout(20)) {
  TempDir dir;
  copse::testing::ChildProcess child("data_server_96mib");
  uint16_t port = StartChildDaemon(child, dir);
  RemoteReaderOptions o{2000, 500};
  o.local_socket = false;  // a stream over TCP (a local hand-off does not depend on the peer once made)
  auto r = OpenRemoteReader(kHost, port, {9, 0, 0, 0}, kSecret, o);
  REQUIRE(r.ok());
  REQUIRE((*r)->Next().ok());
  ::kill(child.pid(), SIGSTOP);
  Status st = DrainStatus(**r);
  CHECK(st.code() == StatusCode::kUnavailable);
  MESSAGE(st.ToString());
  child.Kill();
}

TEST_CASE("RemoteFetch.FetchesFromAPeerDeclaredLostEndAtOnce" * doctest::timeout(20)) {
  // A stopped peer accepts and then says nothing: without the job manager's word its readers
  // would wait out the 60 s read timeout, holding their slots.
  TempDir dir;
  copse::testing::ChildProcess child("data_server_96mib");
  uint16_t port = StartChildDaemon(child, dir);
  RemoteReaderOptions o{2000, 60'000};
  o.local_socket = false;
  auto r = OpenRemoteReader(kHost, port, {9, 0, 0, 0}, kSecret, o);
  REQUIRE(r.ok());
  REQUIRE((*r)->Next().ok());
  ::kill(child.pid(), SIGSTOP);
  std::thread job_manager([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    CHECK(AbortFetchesFrom(kHost, port) == 1);
  });
  const auto start = Clock::now();
  Status st = DrainStatus(**r);
  job_manager.join();
  CHECK(st.code() == StatusCode::kUnavailable);
  CHECK(st.message().find("its daemon was declared lost by the job manager") != std::string::npos);
  CHECK(Clock::now() - start < std::chrono::seconds(5));
  CHECK(AbortFetchesFrom(kHost, port) == 0);  // nothing left to end
  child.Kill();
}

TEST_CASE("RemoteFetch.AFetchWaitingForAnOutputOfAPeerDeclaredLostEndsAtOnce" * doctest::timeout(20)) {
  // A chained consumer's prefetch waits for an output its producer has not written yet.
  Daemon d;
  RemoteReaderOptions waiting = Quick();
  waiting.wait_ms = 30'000;
  waiting.local_socket = false;
  std::thread job_manager([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    AbortFetchesFrom(kHost, d.server->port());
  });
  const auto start = Clock::now();
  auto r = OpenRemoteReader(kHost, d.server->port(), {5, 1, 1, 0}, kSecret, waiting);
  job_manager.join();
  REQUIRE_FALSE(r.ok());
  CHECK(r.status().code() == StatusCode::kUnavailable);
  CHECK(r.status().message().find("declared lost") != std::string::npos);
  CHECK(Clock::now() - start < std::chrono::seconds(5));
}

}  // namespace copse::chan

namespace copse::chan {

TEST_CASE("RemoteFetch.AFileOutputHandedOverOutlivesItsProducer" * doctest::timeout(20)) {
  // Same host: a file output arrives as its file's descriptor, so it stays readable after the
  // producer's process dies, where a stream would end Unavailable.
  TempDir dir;
  copse::testing::ChildProcess child("data_server_96mib");
  uint16_t port = StartChildDaemon(child, dir);
  const auto before = GetRemotePoolStats();
  RemoteReaderOptions o = Quick();
  o.local_socket = true;
  auto r = OpenRemoteReader(kHost, port, {9, 1, 0, 0}, kSecret, o);
  REQUIRE_MESSAGE(r.ok(), r.status().ToString());
  CHECK(GetRemotePoolStats().local_connections_opened == before.local_connections_opened + 1);
  child.Kill();
  for (int i = 0; i < 96; ++i) {
    auto m = (*r)->Next();
    REQUIRE_MESSAGE(m.ok(), m.status().ToString());
    REQUIRE(m->has_value());
    CHECK((*m)->view() == Pattern(1 << 20, 9, i));
  }
  auto end = (*r)->Next();
  REQUIRE(end.ok());
  CHECK_FALSE(end->has_value());
}

namespace {

using Frames = std::vector<std::pair<wire::FrameType, std::string>>;

/// A fake peer on the local socket of host:port that answers one fetch with `frames`, attaching
/// `fd` to the last when it is >= 0.
std::thread FakeLocalPeer(internal::Socket& listener, Frames frames, int fd) {
  return std::thread([&listener, frames = std::move(frames), fd] {
    int c = ::accept4(listener.fd(), nullptr, nullptr, SOCK_CLOEXEC);
    REQUIRE(c >= 0);
    internal::BufferedSocket in(internal::Socket(c, true));
    const std::string nonce = auth::NewNonce();
    REQUIRE(internal::WriteJson(in.socket(), Json{{"op", "hello"}, {"nonce", nonce}, {"version", 1}}).ok());
    auto answer = internal::ReadJson(in, 1 << 16, 3000, 3000);
    REQUIRE(answer.ok());
    REQUIRE(internal::WriteJson(in.socket(), auth::Welcome(*answer, kSecret, nonce)).ok());
    auto fetch = internal::ReadHeader(in, 1 << 16, 3000, 3000);
    REQUIRE(fetch.ok());
    REQUIRE(fetch->type == wire::FrameType::kProto);
    REQUIRE(internal::ReadBody(in, *fetch, 3000).ok());
    for (size_t i = 0; i < frames.size(); ++i) {
      const auto& [type, body] = frames[i];
      REQUIRE(internal::WriteFrame(in.socket(), type, body, i + 1 == frames.size() ? fd : -1).ok());
    }
    char byte;
    (void)in.socket().ReadSome(&byte, 1, 3000);  // until the reader closes or pools
  });
}

/// A fetch's verdict (protocol/data.proto) as its kEnd frame's body.
std::string End(bool ok, uint64_t messages = 0, uint64_t bytes = 0, bool handoff = false, std::string code = "") {
  protocol::FetchEnd end;
  end.set_ok(ok);
  end.set_messages(messages);
  end.set_bytes(bytes);
  end.set_handoff(handoff);
  end.set_code(std::move(code));
  return end.SerializeAsString();
}

/// ... that answers with one kEnd frame.
std::thread FakeLocalPeer(internal::Socket& listener, std::string end, int fd) {
  return FakeLocalPeer(listener, Frames{{wire::FrameType::kEnd, std::move(end)}}, fd);
}

/// The first frame of a large message: its announced total and checksum, then `bytes`.
std::string FirstPieceFrame(uint64_t total, const std::string& bytes) {
  std::string body(17, '\0');
  body[0] = internal::kTagFirstPiece;
  internal::PutU64(body.data() + 1, total);
  internal::PutU64(body.data() + 9, 0);
  return body + bytes;
}

/// Resident memory of this process, bytes.
long ResidentBytes() {
  long pages = 0, resident = 0;
  std::ifstream("/proc/self/statm") >> pages >> resident;
  return resident * ::sysconf(_SC_PAGESIZE);
}

}  // namespace

TEST_CASE("RemoteFetch.AHandOverThatDoesNotMatchItsAnnouncementIsRefused" * doctest::timeout(20)) {
  Daemon d;
  d.Put({1, 0, 0, 0}, StorageKind::kFile, {"one", "two"});
  auto stored = d.store->Lookup({1, 0, 0, 0});
  REQUIRE(stored.ok());
  const uint16_t port = 1;  // nothing listens on TCP: only the fake local socket answers
  auto listener = internal::Socket::ListenLocal(LocalSocketName(kHost, port));
  REQUIRE_MESSAGE(listener.ok(), listener.status().ToString());
  RemoteReaderOptions o = Quick();
  o.local_socket = true;
  auto fetch = [&](std::string end, bool attach, int fd_to_pass = -1) {
    const int fd = fd_to_pass >= 0 ? fd_to_pass : attach ? ::open(stored->file.c_str(), O_RDONLY | O_CLOEXEC) : -1;
    std::thread peer = FakeLocalPeer(*listener, std::move(end), fd);
    auto r = OpenRemoteReader(kHost, port, {1, 0, 0, 0}, kSecret, o);
    Status st = r.ok() ? DrainStatus(**r) : r.status();
    r = Status::Cancelled("closed");  // the reader (and its connection) go before the peer is joined
    CloseIdleRemoteConnections();
    peer.join();
    if (fd >= 0) ::close(fd);
    return st;
  };
  const std::string handoff = End(true, 2, 6, /*handoff=*/true);
  CHECK(fetch(handoff, true).ok());
  Status st = fetch(End(true, 3, 6, true), true);
  CHECK(st.code() == StatusCode::kDataLoss);
  CHECK(st.message().find("not the 3 announced") != std::string::npos);
  CHECK(fetch(End(true, 1, 6, true), true).code() == StatusCode::kDataLoss);
  st = fetch(handoff, false);
  CHECK(st.code() == StatusCode::kUnavailable);
  CHECK(st.message().find("no descriptor") != std::string::npos);
  st = fetch(End(true, 2, 6), false);  // messages, but no stream
  CHECK(st.code() == StatusCode::kDataLoss);
  // A pipe instead of a file would block the reader: refused at once.
  int pipe_fds[2];
  REQUIRE(::pipe2(pipe_fds, O_CLOEXEC) == 0);
  st = fetch(handoff, true, pipe_fds[0]);
  ::close(pipe_fds[1]);
  CHECK(st.code() == StatusCode::kDataLoss);
  CHECK(st.message().find("not a regular file") != std::string::npos);
}

TEST_CASE("RemoteFetch.APeersMalformedAnswerIsAnErrorNeitherAnExceptionNorItsAllocation" * doctest::timeout(20)) {
  // A peer that holds the secret may still be broken or of another build: its answer must
  // fail the fetch; a prefetch thread has no one to catch a throw.
  const uint16_t port = 1;
  auto listener = internal::Socket::ListenLocal(LocalSocketName(kHost, port));
  REQUIRE_MESSAGE(listener.ok(), listener.status().ToString());
  RemoteReaderOptions o = Quick();
  o.local_socket = true;
  auto fetch = [&](Frames frames) {
    std::thread peer = FakeLocalPeer(*listener, std::move(frames), -1);
    Status st;
    try {
      auto r = OpenRemoteReader(kHost, port, {1, 0, 0, 0}, kSecret, o);
      st = r.ok() ? DrainStatus(**r) : r.status();
    } catch (const std::exception& e) {
      FAIL("the reader threw: " << std::string(e.what()));
    }
    CloseIdleRemoteConnections();
    peer.join();
    return st;
  };
  const auto end = [](std::string body) { return std::pair{wire::FrameType::kEnd, std::move(body)}; };
  Status st = fetch({end("\xff\xff")});
  CHECK_FALSE(st.ok());
  CHECK_MESSAGE(st.message().find("FetchEnd: the body does not parse") != std::string::npos, st.ToString());
  st = fetch({end(End(false))});
  CHECK_MESSAGE(st.message().find("FetchEnd.code: required when not ok") != std::string::npos, st.ToString());
  st = fetch({end(End(true, 0, 0, false, "NotFound"))});
  CHECK_MESSAGE(st.message().find("FetchEnd.code: must be empty when ok") != std::string::npos, st.ToString());
  st = fetch({end(End(false, 0, 0, /*handoff=*/true, "NotFound"))});
  CHECK_MESSAGE(st.message().find("FetchEnd.handoff: only when ok") != std::string::npos, st.ToString());
  st = fetch({end(End(false, 0, 0, false, "DataLoss"))});  // a verdict the reader passes on
  CHECK(st.code() == StatusCode::kDataLoss);
  st = fetch({{wire::FrameType::kData, FirstPieceFrame(uint64_t{1} << 63, "abc")}, end(End(true))});
  CHECK(st.message().find("stream ended inside a message") != std::string::npos);
  // A total it never sends costs only what it sends.
  const long before = ResidentBytes();
  st = fetch({{wire::FrameType::kData, FirstPieceFrame(uint64_t{1} << 30, "abc")}, end(End(true, 1))});
  CHECK(st.message().find("stream ended inside a message") != std::string::npos);
  CHECK(ResidentBytes() - before < (long{256} << 20));
}

TEST_CASE("RemoteFetch.AServerWithoutTheLocalSocketIsReachedOverTcp" * doctest::timeout(10)) {
  TempDir dir;
  auto store = OutputStore::Make(dir.path() / "outputs", 1 << 20);
  REQUIRE(store.ok());
  auto w = (*store)->CreateWriter({1, 0, 0, 0}, StorageKind::kMemory);
  REQUIRE(w.ok());
  REQUIRE((*w)->Write(Buffer("over tcp")).ok());
  REQUIRE((*w)->Close().ok());
  DataServerOptions so;
  so.local_socket = false;
  auto srv = DataServer::Start(**store, kHost, 0, kSecret, so);
  REQUIRE(srv.ok());
  CHECK_FALSE((*srv)->serves_local());
  const auto before = GetRemotePoolStats();
  RemoteReaderOptions o = Quick();
  o.local_socket = true;
  auto r = OpenRemoteReader(kHost, (*srv)->port(), {1, 0, 0, 0}, kSecret, o);
  REQUIRE_MESSAGE(r.ok(), r.status().ToString());
  CHECK(Drain(**r) == std::vector<std::string>{"over tcp"});
  CHECK(GetRemotePoolStats().local_connections_opened == before.local_connections_opened);
  CHECK((*srv)->handoffs() == 0);
}

}  // namespace copse::chan

namespace copse::chan {

TEST_CASE("RemoteFetch.OutputsAreTakenOnlyFromAPeerThatProvesItHoldsTheSecret" * doctest::timeout(10)) {
  // Anything listening on a peer's local socket name (any local user can bind it first) would
  // otherwise feed a consumer whatever bytes it likes as an output.
  const uint16_t port = 2;  // nothing listens on TCP: only the impostor's local socket answers
  auto listener = internal::Socket::ListenLocal(LocalSocketName(kHost, port));
  REQUIRE_MESSAGE(listener.ok(), listener.status().ToString());
  std::atomic<bool> asked{false};
  std::thread impostor([&] {
    int c = ::accept4(listener->fd(), nullptr, nullptr, SOCK_CLOEXEC);
    if (c < 0) return;
    internal::BufferedSocket in(internal::Socket(c, true));
    (void)internal::WriteJson(in.socket(), Json{{"op", "hello"}, {"nonce", auth::NewNonce()}, {"version", 1}});
    if (!internal::ReadJson(in, 1 << 16, 3000, 3000).ok()) return;
    (void)internal::WriteJson(in.socket(), Json{{"op", "welcome"}});  // no proof: it lacks the secret
    asked = internal::ReadJson(in, 1 << 16, 3000, 3000).ok();         // a fetch it would answer
  });
  RemoteReaderOptions o = Quick();
  o.local_socket = true;
  auto r = OpenRemoteReader(kHost, port, {1, 0, 0, 0}, kSecret, o);
  Status st = r.ok() ? DrainStatus(**r) : r.status();
  r = Status::Cancelled("closed");
  CloseIdleRemoteConnections();
  impostor.join();
  CHECK(st.code() == StatusCode::kPermissionDenied);
  CHECK_MESSAGE(st.message().find("did not prove it holds the secret") != std::string::npos, st.ToString());
  CHECK_FALSE(asked);
}

}  // namespace copse::chan
