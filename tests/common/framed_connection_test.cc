// FramedConnection: Send() from many threads at once (a daemon's workers send their reports
// themselves) keeps every frame whole and each thread's frames in order, also when the
// socket is full and frames queue for the io thread.
#include <unistd.h>

#include <asio.hpp>
#include <doctest/doctest.h>

#include <chrono>
#include <fstream>
#include <future>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "common/auth.h"
#include "common/framed_connection.h"
#include "common/json_util.h"
#include "common/wire.h"

namespace copse::net {
namespace {

TEST_CASE("FramedConnection.SendsFromManyThreadsArriveWholeAndInEachThreadsOrder") {
  asio::io_context io;
  asio::ip::tcp::acceptor acceptor(io, asio::ip::tcp::endpoint(asio::ip::make_address("127.0.0.1"), 0));
  asio::io_context reader_io;
  asio::ip::tcp::socket reader(reader_io);
  reader.connect(acceptor.local_endpoint());
  auto conn = std::make_shared<FramedConnection>(acceptor.accept(), wire::kMaxControlBytes);
  conn->Start([](Json) {}, [](const Status&) {});
  auto work = asio::make_work_guard(io);
  std::thread io_thread([&] { io.run(); });

  // Large frames fill the socket's buffer (nobody reads yet), so later ones queue.
  constexpr int kThreads = 4, kPerThread = 200;
  const std::string padding(20000, 'x');
  std::vector<std::thread> senders;
  for (int t = 0; t < kThreads; ++t) {
    senders.emplace_back([&, t] {
      for (int n = 0; n < kPerThread; ++n) conn->Send({{"op", "m"}, {"thread", t}, {"n", n}, {"pad", padding}});
    });
  }
  // Heartbeat-like messages from the io thread itself, interleaved.
  for (int n = 0; n < kPerThread; ++n) asio::post(io, [&, n] { conn->Send({{"op", "m"}, {"thread", kThreads}, {"n", n}}); });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));

  std::vector<int> next(kThreads + 1, 0);
  int received = 0;
  while (received < (kThreads + 1) * kPerThread) {
    char header[wire::kHeaderBytes];
    asio::read(reader, asio::buffer(header));
    auto h = wire::DecodeHeader(header, wire::kMaxControlBytes);
    REQUIRE(h.ok());
    std::string body(h->length, '\0');
    asio::read(reader, asio::buffer(body));
    const Json msg = Json::parse(body);  // throws (fails the test) on a torn frame
    const int t = msg["thread"].get<int>();
    REQUIRE(t >= 0);
    REQUIRE(t <= kThreads);
    CHECK(msg["n"].get<int>() == next[static_cast<size_t>(t)]);
    next[static_cast<size_t>(t)] = msg["n"].get<int>() + 1;
    if (t < kThreads) CHECK(msg["pad"].get<std::string>().size() == padding.size());
    ++received;
  }
  for (auto& s : senders) s.join();
  asio::post(io, [&] { conn->Close(Status::Cancelled("done")); });
  work.reset();
  io_thread.join();
  for (int t = 0; t <= kThreads; ++t) CHECK(next[static_cast<size_t>(t)] == kPerThread);
}

TEST_CASE("FramedConnection.SendAfterCloseIsDropped") {
  asio::io_context io;
  asio::ip::tcp::acceptor acceptor(io, asio::ip::tcp::endpoint(asio::ip::make_address("127.0.0.1"), 0));
  asio::ip::tcp::socket reader(io);
  reader.connect(acceptor.local_endpoint());
  auto conn = std::make_shared<FramedConnection>(acceptor.accept(), wire::kMaxControlBytes);
  conn->Close(Status::Cancelled("done"));
  CHECK_FALSE(conn->open());
  conn->Send({{"op", "m"}});  // neither writes to the closed descriptor nor throws
  io.run();
  char byte;
  std::error_code ec;
  asio::read(reader, asio::buffer(&byte, 1), ec);
  CHECK(ec == asio::error::eof);
}

long ResidentBytes() {
  long pages = 0, resident = 0;
  std::ifstream("/proc/self/statm") >> pages >> resident;
  return resident * ::sysconf(_SC_PAGESIZE);
}

TEST_CASE("FramedConnection.AnAnnouncedBodyCostsOnlyTheBytesThatArrive") {
  // An authenticated peer may announce the largest frame and send nothing more; the server
  // must not allocate what it announced.
  asio::io_context io;
  asio::ip::tcp::acceptor acceptor(io, asio::ip::tcp::endpoint(asio::ip::make_address("127.0.0.1"), 0));
  asio::ip::tcp::socket peer(io);
  peer.connect(acceptor.local_endpoint());
  auto conn = std::make_shared<FramedConnection>(acceptor.accept(), 1u << 30);
  std::vector<Json> got;
  conn->Start([&](Json m) { got.push_back(std::move(m)); }, [](const Status&) {});
  const long before = ResidentBytes();
  const auto h = wire::EncodeHeader(wire::FrameType::kJson, 1u << 30);
  asio::write(peer, asio::buffer(h.data(), h.size()));
  asio::write(peer, asio::buffer(std::string(1000, ' ')));
  io.run_for(std::chrono::milliseconds(200));
  CHECK(ResidentBytes() - before < (64l << 20));
  CHECK(conn->open());
  // A whole message still arrives, large ones included.
  peer.close();
  io.restart();
  asio::ip::tcp::socket peer2(io);
  peer2.connect(acceptor.local_endpoint());
  auto conn2 = std::make_shared<FramedConnection>(acceptor.accept(), 1u << 30);
  conn2->Start([&](Json m) { got.push_back(std::move(m)); }, [](const Status&) {});
  const std::string big = Json{{"op", "big"}, {"pad", std::string(3'000'000, 'y')}}.dump();
  asio::write(peer2, asio::buffer(wire::EncodeFrame(wire::FrameType::kJson, big)));
  for (int i = 0; i < 50 && got.empty(); ++i) io.run_for(std::chrono::milliseconds(20));
  REQUIRE(got.size() == 1);
  CHECK(got[0]["pad"].get<std::string>().size() == 3'000'000);
  conn->Close(Status::Cancelled("done"));
  conn2->Close(Status::Cancelled("done"));
}

TEST_CASE("FramedConnection.APeerThatDoesNotReadIsDisconnectedOnceTooMuchWaits") {
  asio::io_context io;
  asio::ip::tcp::acceptor acceptor(io, asio::ip::tcp::endpoint(asio::ip::make_address("127.0.0.1"), 0));
  asio::ip::tcp::socket peer(io);
  peer.connect(acceptor.local_endpoint());
  auto conn = std::make_shared<FramedConnection>(acceptor.accept(), wire::kMaxControlBytes);
  Status closed = Status::OK();
  conn->Start([](Json) {}, [&](const Status& why) { closed = why; });
  const std::string pad(1 << 20, 'z');
  // Nobody reads `peer`: after the socket buffers fill, messages queue, up to the cap.
  const size_t sends = FramedConnection::kMaxQueuedBytes / pad.size() + 64;
  for (size_t i = 0; i < sends && conn->open(); ++i) {
    conn->Send({{"op", "m"}, {"pad", pad}});
    io.poll();
  }
  io.run_for(std::chrono::milliseconds(100));
  CHECK_FALSE(conn->open());
  CHECK(closed.message().find("does not read") != std::string::npos);
}

/// One side of a control connection in a test: raw frames over a blocking asio socket.
void WriteJsonFrame(asio::ip::tcp::socket& s, const Json& msg) {
  asio::write(s, asio::buffer(wire::EncodeFrame(wire::FrameType::kJson, DumpJson(msg))));
}
template <class Socket>
Json ReadJsonFrame(Socket& s) {
  char header[wire::kHeaderBytes];
  asio::read(s, asio::buffer(header));
  auto h = wire::DecodeHeader(header, wire::kMaxControlBytes);
  if (!h.ok()) throw std::runtime_error(h.status().ToString());
  std::string body(h->length, '\0');
  asio::read(s, asio::buffer(body));
  return Json::parse(body);
}

TEST_CASE("BlockingClient.ConnectsToALocalSocketOnlyWhenSomeoneListensAndHandsItsConnectionOver" * doctest::timeout(60)) {
  // A daemon registers over the job manager's local socket when there is one, then keeps the
  // connection as its asynchronous FramedConnection.
  const std::string name = "copse-test-blocking-client/" + std::to_string(::getpid());
  const auto soon = [] { return std::chrono::steady_clock::now() + std::chrono::seconds(5); };
  SUBCASE("nothing listens") {
    auto c = BlockingClient::ConnectLocal(name, soon());
    CHECK(c.status().code() == StatusCode::kNotFound);
  }
  asio::io_context io;
  asio::local::stream_protocol::acceptor acceptor(io);
  acceptor.open();
  acceptor.bind(AbstractEndpoint(name));
  SUBCASE("its accept queue is full") {
    // A connect to a full accept queue fails (asio may take the kernel's EAGAIN for a connect
    // in progress): the client must not come back as connected.
    acceptor.listen(0);  // room for one connection waiting
    asio::local::stream_protocol::socket first(io);
    first.connect(AbstractEndpoint(name));
    auto c = BlockingClient::ConnectLocal(name, soon());
    CHECK_MESSAGE(!c.ok(), "came back connected to a full queue");
  }
  SUBCASE("a server accepts: the conversation goes on asynchronously") {
    acceptor.listen();
    auto c = BlockingClient::ConnectLocal(name, soon());
    REQUIRE_MESSAGE(c.ok(), c.status().ToString());
    auto server = acceptor.accept();
    const std::string hi = wire::EncodeFrame(wire::FrameType::kJson, R"({"op":"hi"})");
    asio::write(server, asio::buffer(hi));
    auto reply = (*c)->Receive(std::chrono::seconds(5));
    REQUIRE_MESSAGE(reply.ok(), reply.status().ToString());
    CHECK((*reply)["op"] == "hi");

    asio::io_context later;
    auto conn = (*c)->Detach(later, wire::kMaxControlBytes);
    REQUIRE_MESSAGE(conn.ok(), conn.status().ToString());
    CHECK((*conn)->local());
    std::vector<std::string> got;
    (*conn)->Start(
        [&](Json m) {
          got.push_back(m["op"]);
          later.stop();
        },
        [&](const Status&) { later.stop(); });
    const std::string again = wire::EncodeFrame(wire::FrameType::kJson, R"({"op":"again"})");
    asio::write(server, asio::buffer(again));
    later.run_for(std::chrono::seconds(5));
    CHECK(got == std::vector<std::string>{"again"});
    (*conn)->Send({{"op", "back"}});
    CHECK(ReadJsonFrame(server)["op"] == "back");
    (*conn)->Close(Status::Cancelled("done"));
  }
}

TEST_CASE("BlockingClient.EveryStepOfAConversationIsBounded" * doctest::timeout(60)) {
  // A CLI must not hang on a server that accepts and says nothing, on one whose accept queue is
  // full (its SYNs go unanswered), or on one that stops reading.
  const std::string secret = "blocking-client-test-secret-0123456789";
  const auto timeout = std::chrono::milliseconds(300);
  asio::io_context io;
  asio::ip::tcp::acceptor acceptor(io);
  const asio::ip::tcp::endpoint loopback(asio::ip::make_address("127.0.0.1"), 0);
  acceptor.open(loopback.protocol());
  acceptor.bind(loopback);
  const uint16_t port = acceptor.local_endpoint().port();

  // Each call runs beside the test, which ends the server after 10 s: a call that waits for
  // ever then fails the test instead of hanging it.
  auto bounded = [&](auto call, auto end_server) {
    auto result = std::async(std::launch::async, call);
    const bool ended = result.wait_for(std::chrono::seconds(10)) == std::future_status::ready;
    end_server();
    CHECK_MESSAGE(ended, "still waiting after 10 s");
    return result.get();
  };
  auto close_acceptor = [&] { acceptor.close(); };
  SUBCASE("a full accept queue") {
    acceptor.listen(0);  // room for one connection waiting to be accepted
    asio::ip::tcp::socket first(io);
    first.connect(acceptor.local_endpoint());
    auto c = bounded([&] { return BlockingClient::Connect("127.0.0.1", port, secret, "client", timeout); }, close_acceptor);
    // (With SYN cookies a second SYN may, rarely, be answered before the first connection is
    // queued: then it is the greeting that does not come.)
    CHECK_MESSAGE(
        (c.status().message().find("no answer within 300 ms") != std::string::npos || c.status().code() == StatusCode::kTimeout),
        c.status().ToString());
  }
  SUBCASE("a server that never greets") {
    acceptor.listen();
    auto c = bounded([&] { return BlockingClient::Connect("127.0.0.1", port, secret, "client", timeout); }, close_acceptor);
    CHECK(c.status().code() == StatusCode::kTimeout);
  }
  SUBCASE("a server that stops reading") {
    acceptor.listen();
    asio::ip::tcp::socket server(io);
    std::thread serve([&] {
      try {  // on a thread of its own: an exception there would end the run
        server = acceptor.accept();
        const std::string nonce = auth::NewNonce();
        WriteJsonFrame(server, {{"op", "hello"}, {"nonce", nonce}, {"version", 1}});
        WriteJsonFrame(server, auth::Welcome(ReadJsonFrame(server), secret, nonce));
      } catch (const std::exception&) {  // the client gave up; its REQUIRE below says so
      }
    });
    auto c = BlockingClient::Connect("127.0.0.1", port, secret, "client", std::chrono::seconds(10));
    serve.join();
    REQUIRE_MESSAGE(c.ok(), c.status().ToString());
    const std::string pad(1 << 20, 'z');
    Status sent = bounded(
        [&] {
          Status st;
          for (int i = 0; i < 64 && st.ok(); ++i) st = (*c)->Send({{"op", "m"}, {"pad", pad}}, timeout);
          return st;
        },
        [&] { server.close(); });
    CHECK(sent.code() == StatusCode::kTimeout);
  }
}

}  // namespace
}  // namespace copse::net
