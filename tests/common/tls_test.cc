// TLS (common/tls.h) under the control plane's connections: the cluster certificate, a
// FramedConnection server and BlockingClient over TLS (and a client handed over to a
// FramedConnection mid-session), what plaintext and foreign peers are told, and that the bytes
// on the wire are not the messages. Loopback only.
#include "common/tls.h"

#include <sys/stat.h>

#include <asio.hpp>
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <future>
#include <mutex>
#include <string>
#include <thread>

#include "common/framed_connection.h"
#include "common/json_util.h"
#include "common/wire.h"

namespace copse::tls {
namespace {

struct TempDir {
  std::filesystem::path path;
  TempDir() {
    char tmpl[] = "/tmp/copse-tls-test-XXXXXX";
    REQUIRE(mkdtemp(tmpl) != nullptr);
    path = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
};

std::shared_ptr<const Context> MakeCluster(const std::filesystem::path& dir) {
  REQUIRE(CreateClusterCertificateIfAbsent(dir).ok());
  auto ctx = Context::Load(dir);
  REQUIRE_MESSAGE(ctx.ok(), ctx.status().ToString());
  return *ctx;
}

/// A FramedConnection server on its own io thread that answers every message with
/// {"op":"echo","n":…,"size":…}, over TLS when given a context.
class EchoServer {
 public:
  explicit EchoServer(std::shared_ptr<const Context> tls)
      : tls_(std::move(tls)), acceptor_(io_, asio::ip::tcp::endpoint(asio::ip::make_address("127.0.0.1"), 0)) {
    Accept();
    thread_ = std::thread([this] { io_.run(); });
  }
  ~EchoServer() {
    asio::post(io_, [this] {
      std::error_code ec;
      acceptor_.close(ec);
      for (auto& c : conns_) c->Close(Status::Cancelled("test over"));
    });
    work_.reset();
    thread_.join();
  }
  uint16_t port() const { return acceptor_.local_endpoint().port(); }
  std::string last_close() {
    std::lock_guard<std::mutex> lock(mu_);
    return last_close_;
  }

 private:
  void Accept() {
    acceptor_.async_accept([this](std::error_code ec, asio::ip::tcp::socket socket) {
      if (ec) return;
      auto conn = std::make_shared<net::FramedConnection>(std::move(socket), wire::kMaxControlBytes);
      if (tls_) conn->UseTls(std::make_unique<Session>(*tls_, Session::Role::kServer, conn->peer()));
      conns_.push_back(conn);
      std::weak_ptr<net::FramedConnection> weak = conn;
      conn->Start(
          [weak](Json msg) {
            if (auto c = weak.lock()) {
              c->Send({{"op", "echo"}, {"n", msg.value("n", -1)}, {"size", StringMember(msg, "pad").size()}});
            }
          },
          [this](const Status& why) {
            std::lock_guard<std::mutex> lock(mu_);
            last_close_ = why.message();
          });
      // A plaintext server greets first, like the job manager.
      if (!tls_) conn->Send({{"op", "hello"}, {"nonce", "0"}, {"version", wire::kProtocolVersion}});
      Accept();
    });
  }

  std::shared_ptr<const Context> tls_;
  asio::io_context io_;
  asio::executor_work_guard<asio::io_context::executor_type> work_ = asio::make_work_guard(io_);
  asio::ip::tcp::acceptor acceptor_;
  std::vector<std::shared_ptr<net::FramedConnection>> conns_;
  std::thread thread_;
  std::mutex mu_;
  std::string last_close_;
};

net::Deadline In(int seconds) { return std::chrono::steady_clock::now() + std::chrono::seconds(seconds); }

/// A TCP connection to 127.0.0.1:port, nothing spoken yet.
std::unique_ptr<net::BlockingClient> Dial(uint16_t port) {
  auto c = net::BlockingClient::ConnectTcp({asio::ip::make_address("127.0.0.1"), port}, In(10));
  REQUIRE(c.ok());
  return std::move(*c);
}

std::unique_ptr<net::BlockingClient> ConnectTls(uint16_t port, const Context& ctx) {
  auto c = Dial(port);
  Status st = c->StartTls(ctx, In(10));
  REQUIRE_MESSAGE(st.ok(), st.ToString());
  return c;
}

TEST_CASE("Tls.TheClusterCertificateIsMadeOnceAndItsKeyIsPrivate") {
  TempDir dir;
  REQUIRE(CreateClusterCertificateIfAbsent(dir.path / "tls").ok());
  const std::string first = ReadFile((dir.path / "tls" / kCertFileName).string()).value();
  REQUIRE(CreateClusterCertificateIfAbsent(dir.path / "tls").ok());
  CHECK(ReadFile((dir.path / "tls" / kCertFileName).string()).value() == first);  // a restart keeps it
  struct stat st {};
  REQUIRE(::stat((dir.path / "tls" / kKeyFileName).c_str(), &st) == 0);
  CHECK((st.st_mode & 0777) == 0600);
  CHECK(Context::Load(dir.path / "tls").ok());
}

TEST_CASE("Tls.LoadingSaysWhatIsWrongWithTheDirectory") {
  TempDir dir;
  auto missing = Context::Load(dir.path / "nothing");
  REQUIRE_FALSE(missing.ok());
  CHECK_MESSAGE(missing.status().message().find("has no cluster.crt") != std::string::npos, missing.status().ToString());

  MakeCluster(dir.path / "a");
  MakeCluster(dir.path / "b");
  ::chmod((dir.path / "a" / kKeyFileName).c_str(), 0644);
  auto readable = Context::Load(dir.path / "a");
  REQUIRE_FALSE(readable.ok());
  CHECK_MESSAGE(readable.status().message().find("chmod 600") != std::string::npos, readable.status().ToString());

  std::filesystem::copy_file(dir.path / "b" / kKeyFileName, dir.path / "a" / kKeyFileName,
                             std::filesystem::copy_options::overwrite_existing);
  ::chmod((dir.path / "a" / kKeyFileName).c_str(), 0600);
  auto mismatched = Context::Load(dir.path / "a");
  REQUIRE_FALSE(mismatched.ok());
  CHECK_MESSAGE(mismatched.status().message().find("is not the key of") != std::string::npos, mismatched.status().ToString());

  std::ofstream(dir.path / "b" / kCaFileName) << "not a certificate\n";
  auto bad_ca = Context::Load(dir.path / "b");
  REQUIRE_FALSE(bad_ca.ok());
  CHECK_MESSAGE(bad_ca.status().message().find("ca.crt") != std::string::npos, bad_ca.status().ToString());
}

TEST_CASE("Tls.MessagesOfEverySizeCrossAndAClientCanBeHandedToAFramedConnection") {
  TempDir dir;
  auto ctx = MakeCluster(dir.path);
  EchoServer server(ctx);
  auto client = ConnectTls(server.port(), *ctx);

  // One at a time, then a large one (many TLS records), then many pipelined.
  auto one = client->Call({{"op", "m"}, {"n", 1}});
  REQUIRE_MESSAGE(one.ok(), one.status().ToString());
  CHECK((*one)["n"] == 1);
  const std::string big(3 << 20, 'b');
  auto large = client->Call({{"op", "m"}, {"n", 2}, {"pad", big}});
  REQUIRE(large.ok());
  CHECK((*large)["size"] == big.size());
  for (int n = 0; n < 500; ++n) REQUIRE(client->Send({{"op", "m"}, {"n", n}}, In(10)).ok());
  for (int n = 0; n < 500; ++n) {
    auto reply = client->Receive(In(10));
    REQUIRE(reply.ok());
    REQUIRE((*reply)["n"] == n);
  }

  // Handed over mid-session (a daemon after registering): replies already decrypted come along.
  REQUIRE(client->Send({{"op", "m"}, {"n", 1000}}, In(10)).ok());
  REQUIRE(client->Send({{"op", "m"}, {"n", 1001}}, In(10)).ok());
  auto first = client->Receive(In(10));
  REQUIRE(first.ok());
  CHECK((*first)["n"] == 1000);
  std::this_thread::sleep_for(std::chrono::milliseconds(50));  // the second reply is in by now
  asio::io_context io;
  auto conn = client->Detach(io, wire::kMaxControlBytes);
  REQUIRE(conn.ok());
  CHECK((*conn)->tls());
  std::vector<int> got;
  (*conn)->Start([&](Json msg) { got.push_back(msg["n"].get<int>()); }, [](const Status&) {});
  for (int n = 1002; n < 1200; ++n) (*conn)->Send({{"op", "m"}, {"n", n}, {"pad", std::string(n * 37, 'p')}});
  const auto deadline = In(20);
  while (got.size() < 199 && std::chrono::steady_clock::now() < deadline) io.run_for(std::chrono::milliseconds(10));
  REQUIRE(got.size() == 199);
  for (size_t i = 0; i < got.size(); ++i) CHECK(got[i] == 1001 + static_cast<int>(i));
  (*conn)->Close(Status::Cancelled("done"));
  io.run_for(std::chrono::milliseconds(10));
}

TEST_CASE("Tls.APlaintextClientIsToldTheServerRequiresTls") {
  TempDir dir;
  auto ctx = MakeCluster(dir.path);
  EchoServer server(ctx);
  Status st = Dial(server.port())->Authenticate("secret", "client", In(10));
  REQUIRE_FALSE(st.ok());
  CHECK(st.code() == StatusCode::kFailedPrecondition);
  CHECK_MESSAGE(st.message().find("requires TLS") != std::string::npos, st.ToString());
}

TEST_CASE("Tls.ATlsClientIsToldTheServerSpeaksPlaintext") {
  TempDir dir;
  auto ctx = MakeCluster(dir.path);
  EchoServer server(nullptr);
  Status st = Dial(server.port())->StartTls(*ctx, In(10));
  REQUIRE_FALSE(st.ok());
  CHECK(st.code() == StatusCode::kFailedPrecondition);
  CHECK_MESSAGE(st.message().find("speaks plaintext") != std::string::npos, st.ToString());
}

TEST_CASE("Tls.APeerOfAnotherClusterIsRefused") {
  TempDir dir;
  auto ours = MakeCluster(dir.path / "ours");
  auto theirs = MakeCluster(dir.path / "theirs");
  EchoServer server(ours);
  {  // The client does not trust the server's certificate.
    Status st = Dial(server.port())->StartTls(*theirs, In(10));
    REQUIRE_FALSE(st.ok());
    CHECK(st.code() == StatusCode::kUnavailable);
    CHECK_MESSAGE(st.message().find("certificate") != std::string::npos, st.ToString());
  }
  // The server does not trust the client's: one that trusts ours but holds another cluster's key.
  std::filesystem::create_directories(dir.path / "intruder");
  for (const char* f : {kCertFileName, kKeyFileName})
    std::filesystem::copy_file(dir.path / "theirs" / f, dir.path / "intruder" / f);
  std::filesystem::copy_file(dir.path / "ours" / kCertFileName, dir.path / "intruder" / kCaFileName);
  auto intruder = Context::Load(dir.path / "intruder");
  REQUIRE(intruder.ok());
  auto client = Dial(server.port());
  Status st = client->StartTls(**intruder, In(10));
  if (st.ok()) st = client->Call({{"op", "m"}, {"n", 1}}, In(10)).status();  // TLS 1.3: refused after the client's Finished
  CHECK_FALSE(st.ok());
  // The server's alert reaches the client: it says why, not just that the connection closed.
  CHECK_MESSAGE(st.message().find("alert") != std::string::npos, st.ToString());
  const auto deadline = In(10);
  while (server.last_close().find("certificate") == std::string::npos && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  CHECK_MESSAGE(server.last_close().find("TLS handshake") != std::string::npos, server.last_close());
  CHECK_MESSAGE(server.last_close().find("certificate") != std::string::npos, server.last_close());
}

TEST_CASE("Tls.TheBytesOnTheWireAreNotTheMessages") {
  TempDir dir;
  auto ctx = MakeCluster(dir.path);
  EchoServer server(ctx);
  // A relay between client and server that keeps a copy of every byte either way.
  asio::io_context io;
  asio::ip::tcp::acceptor relay(io, asio::ip::tcp::endpoint(asio::ip::make_address("127.0.0.1"), 0));
  std::mutex mu;
  std::string seen;
  std::thread relay_thread([&] {
    asio::ip::tcp::socket down = relay.accept();
    asio::ip::tcp::socket up(io);
    up.connect({asio::ip::make_address("127.0.0.1"), server.port()});
    auto pump = [&](asio::ip::tcp::socket& from, asio::ip::tcp::socket& to) {
      char buf[4096];
      std::error_code ec;
      while (true) {
        const size_t n = from.read_some(asio::buffer(buf), ec);
        if (ec) break;
        {
          std::lock_guard<std::mutex> lock(mu);
          seen.append(buf, n);
        }
        asio::write(to, asio::buffer(buf, n), ec);
        if (ec) break;
      }
      to.shutdown(asio::socket_base::shutdown_both, ec);
    };
    std::thread back([&] { pump(up, down); });
    pump(down, up);
    back.join();
  });
  {
    auto client = ConnectTls(relay.local_endpoint().port(), *ctx);
    auto reply = client->Call({{"op", "m"}, {"n", 7}, {"pad", "the-quick-brown-fox-says-hello"}});
    REQUIRE(reply.ok());
    CHECK((*reply)["size"] == 30);
  }
  relay_thread.join();
  std::lock_guard<std::mutex> lock(mu);
  CHECK(seen.find("requires TLS") != std::string::npos);  // the banner is plaintext, by design
  CHECK(seen.find("the-quick-brown-fox") == std::string::npos);
  CHECK(seen.find("\"op\"") == seen.rfind("\"op\""));  // only the banner's
}

}  // namespace
}  // namespace copse::tls
