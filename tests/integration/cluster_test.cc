// A job manager and three daemons as separate processes on loopback, running real jobs.
#include <doctest/doctest.h>

#include <array>
#include <functional>
#include <map>
#include <random>
#include <set>
#include <sstream>

#include "channels/remote_reader.h"
#include "cli/job_watch.h"
#include "cli/program_catalog.h"
#include "cli/trace_client.h"
#include "common/auth.h"
#include "jobmanager/job_loader.h"
#include "protocol/codec.h"
#include "tests/integration/test_cluster.h"
#include "vertex/programs/checksum.h"

namespace copse::testing {

std::string TestCluster::Output(uint64_t job, const std::string& path) {
  auto out_dir = dir_ / ("out-" + std::to_string(job));
  auto written = cli::FetchOutputs(client(), job, out_dir, secret(), tls());
  REQUIRE_MESSAGE(written.ok(), written.status().ToString());
  return ReadFile((out_dir / path).string()).value();
}

namespace {

/// Whether process `pid` (a child not reaped yet) is still running: not gone, not a zombie.
bool Running(pid_t pid) {
  auto stat = ReadFile("/proc/" + std::to_string(pid) + "/stat");
  if (!stat.ok()) return false;
  const size_t close = stat->rfind(')');  // the state follows the command name, which may hold spaces
  return close != std::string::npos && close + 2 < stat->size() && (*stat)[close + 2] != 'Z';
}

/// What the sink of a graph of checksum vertices (params.bytes = 0) must output: every
/// vertex's digest recomputed from the expanded graph, in topological order.
std::map<uint32_t, std::string> ExpectedChecksums(const Json& job) {
  auto load = jm::LoadJobJson(job, "expected", cli::Catalog());
  REQUIRE(load.ok());
  const auto& g = *load.graph;
  std::map<uint32_t, std::string> out;
  for (VertexId v : g.topological_order()) {
    const auto& node = g.vertex(v);
    vertex::ChecksumHasher h(node.name, *node.params);
    for (ChannelId ch : node.inputs) {
      h.AddMessage(out.at(g.channel(ch).from.value()));
      h.EndPort();
    }
    out[v.value()] = vertex::DigestLine(h.Digest());
  }
  return out;
}

TEST_CASE("Cluster.WordCountMatchesADirectCount") {
  TestCluster cluster(3);
  std::mt19937 rng(42);
  std::map<std::string, int64_t> expected;
  const char* words[] = {"alpha", "beta", "gamma", "delta", "copse", "vertex", "channel"};
  for (int shard = 0; shard < 6; ++shard) {
    std::ofstream f(cluster.dir() / ("shard-" + std::to_string(shard) + ".txt"));
    for (int line = 0; line < 400; ++line) {
      for (int w = 0; w < 1 + static_cast<int>(rng() % 9); ++w) {
        std::string word = words[rng() % 7];
        f << word << (w % 3 == 2 ? "  " : " ");
        ++expected[word];
      }
      f << "\n";
    }
  }
  Json job = {
      {"name", "wc"},
      {"stages",
       {{{"name", "read"}, {"program", "text.read_lines"}, {"replicas", 6}, {"params", {{"path", "shard-{replica}.txt"}}}},
        {{"name", "count"}, {"program", "text.count_words"}, {"replicas", 3}},
        {{"name", "merge"}, {"program", "text.merge_counts"}}}},
      {"edges",
       {{{"from", "read"}, {"to", "count"}, {"pattern", "all_to_all"}, {"channel", "memory"}},
        {{"from", "count"}, {"to", "merge"}, {"pattern", "gather"}}}},
      {"outputs", {{{"from", "merge"}, {"path", "counts.txt"}}}}};
  uint64_t id = cluster.Submit(job);
  Json status = cluster.Wait(id);
  REQUIRE_MESSAGE(status["state"] == "completed", status.dump());
  std::string want;
  for (const auto& [w, n] : expected) want += w + "\t" + std::to_string(n) + "\n";
  CHECK(cluster.Output(id, "counts.txt") == want);
}

TEST_CASE("Cluster.DiamondAndRandomDagOfChecksumsDeliverEveryByte") {
  TestCluster cluster(3);
  SUBCASE("diamond") {
    Json job = ReadJsonFile(std::string(COPSE_SOURCE_DIR) + "/examples/diamond.json").value();
    // The example adds bytes at the source; drop them so the digest chain is easy to recompute.
    job["stages"][0]["params"] = Json::object();
    uint64_t id = cluster.Submit(job);
    Json status = cluster.Wait(id);
    REQUIRE_MESSAGE(status["state"] == "completed", status.dump());
    auto expected = ExpectedChecksums(job);
    CHECK(cluster.Output(id, "digest.txt") == expected.rbegin()->second);
  }
  SUBCASE("random 1000-vertex DAG") {
    std::mt19937 rng(7);
    Json job = {{"name", "random-dag"}, {"stages", Json::array()}, {"edges", Json::array()}};
    const int n = 1000;
    for (int i = 0; i < n; ++i) {
      job["stages"].push_back({{"name", "v" + std::to_string(i)}, {"program", "checksum"}, {"params", {{"i", i}}}});
      int fan_in = i == 0 ? 0 : 1 + static_cast<int>(rng() % 3);
      for (int k = 0; k < fan_in; ++k) {
        int from = static_cast<int>(rng() % i);
        job["edges"].push_back(
            {{"from", "v" + std::to_string(from)}, {"to", "v" + std::to_string(i)}, {"channel", rng() % 2 ? "memory" : "file"}});
      }
    }
    // One sink gathering every vertex without consumers, so one digest covers the whole graph.
    job["stages"].push_back({{"name", "sink"}, {"program", "checksum"}});
    std::vector<bool> has_consumer(n, false);
    for (const auto& e : job["edges"]) has_consumer[std::stoi(e["from"].get<std::string>().substr(1))] = true;
    for (int i = 0; i < n; ++i) {
      if (!has_consumer[i]) job["edges"].push_back({{"from", "v" + std::to_string(i)}, {"to", "sink"}});
    }
    job["outputs"] = {{{"from", "sink"}, {"path", "digest.txt"}}};
    uint64_t id = cluster.Submit(job);
    Json status = cluster.Wait(id);
    REQUIRE_MESSAGE(status["state"] == "completed", status.dump());
    auto expected = ExpectedChecksums(job);
    CHECK(cluster.Output(id, "digest.txt") == expected.at(n));
  }
}

TEST_CASE("Cluster.ExecVerticesRunChildProcesses") {
  TestCluster cluster(2);
  Json job = {
      {"name", "exec"},
      {"stages",
       {{{"name", "gen"}, {"program", "exec"}, {"params", {{"argv", {"sh", "-c", "seq 1 100"}}}}},
        {{"name", "sum"}, {"program", "exec"}, {"params", {{"argv", {"sh", "-c", "awk '{s+=$1} END {print s}' {input0}"}}}}}}},
      {"edges", {{{"from", "gen"}, {"to", "sum"}}}},
      {"outputs", {{{"from", "sum"}, {"path", "sum.txt"}}}}};
  uint64_t id = cluster.Submit(job);
  Json status = cluster.Wait(id);
  REQUIRE_MESSAGE(status["state"] == "completed", status.dump());
  CHECK(cluster.Output(id, "sum.txt") == "5050\n");
}

TEST_CASE("Cluster.CancellingARunningJobStopsIt") {
  TestCluster cluster(2);
  Json job = {{"name", "slow"},
              {"stages", {{{"name", "sleep"}, {"program", "checksum"}, {"replicas", 4}, {"params", {{"sleep_ms", 30000}}}}}}};
  uint64_t id = cluster.Submit(job);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  auto reply = cluster.client().Call({{"op", "cancel"}, {"job", id}});
  REQUIRE(reply.ok());
  auto started = std::chrono::steady_clock::now();
  Json status = cluster.Wait(id, std::chrono::seconds(10));
  CHECK(status["state"] == "cancelled");
  CHECK(std::chrono::steady_clock::now() - started < std::chrono::seconds(5));
  // The daemons' slots are free again: a new job runs at once.
  uint64_t next = cluster.Submit({{"stages", {{{"name", "a"}, {"program", "noop"}, {"replicas", 4}}}}});
  CHECK(cluster.Wait(next, std::chrono::seconds(20))["state"] == "completed");
}

TEST_CASE("Cluster.AFailingVertexFailsItsJobWithTheVertexAndMessage") {
  TestCluster cluster(2);
  Json job = {{"name", "failing"},
              {"stages",
               {{{"name", "ok"}, {"program", "noop"}},
                {{"name", "bad"},
                 {"program", "exec"},
                 {"max_attempts", 2},
                 {"params", {{"argv", {"sh", "-c", "echo disk full >&2; exit 4"}}}}}}},
              {"edges", {{{"from", "ok"}, {"to", "bad"}}}}};
  uint64_t id = cluster.Submit(job);
  Json status = cluster.Wait(id);
  CHECK(status["state"] == "failed");
  std::string failure = status.value("failure", "");
  CHECK_MESSAGE(failure.find("bad[0]") != std::string::npos, failure);
  CHECK_MESSAGE(failure.find("disk full") != std::string::npos, failure);
  CHECK_MESSAGE(failure.find("2 of 2 attempts") != std::string::npos, failure);
}

TEST_CASE("Cluster.UnauthenticatedAndGarbagePeersAreRefusedWhileAJobRuns") {
  TestCluster cluster(2);
  uint64_t id =
      cluster.Submit({{"stages", {{{"name", "s"}, {"program", "checksum"}, {"replicas", 8}, {"params", {{"sleep_ms", 300}}}}}}});
  // A client with the wrong secret.
  auto bad = cluster.Connect(std::string(64, 'a'), "client");
  CHECK_FALSE(bad.ok());
  CHECK(bad.status().code() == StatusCode::kPermissionDenied);
  CHECK(bad.status().message().find("authentication failed") != std::string::npos);
  // Garbage bytes, a wrong protocol version, an oversized frame, a body that is not UTF-8 (the
  // error quoting it must still be sendable), an auth whose role is not a string.
  for (std::string payload : {std::string("GET / HTTP/1.1\r\n\r\n"),
                              [] {
                                auto h = wire::EncodeHeader(wire::FrameType::kJson, 2);
                                h[4] = 9;
                                return std::string(h.data(), h.size()) + "{}";
                              }(),
                              [] {
                                auto h = wire::EncodeHeader(wire::FrameType::kJson, 0x7fffffff);
                                return std::string(h.data(), h.size());
                              }(),
                              wire::EncodeFrame(wire::FrameType::kJson, "\xff"),
                              wire::EncodeFrame(wire::FrameType::kJson, R"({"op":"auth","role":5,"mac":"x"})"),
                              // a number beyond a double: nlohmann's out_of_range, not parse_error
                              wire::EncodeFrame(wire::FrameType::kJson, R"({"op":"auth","x":1e999})"),
                              // 1 MiB announced before authenticating: refused from its header
                              [] {
                                auto h = wire::EncodeHeader(wire::FrameType::kJson, 1u << 20);
                                return std::string(h.data(), h.size()) + "{}";
                              }()}) {
    asio::io_context io;
    asio::ip::tcp::socket s(io);
    s.connect({asio::ip::make_address("127.0.0.1"), cluster.jm_port()});
    const timeval five_s{5, 0};  // a job manager still waiting for a body fails the check, not the suite's clock
    ::setsockopt(s.native_handle(), SOL_SOCKET, SO_RCVTIMEO, &five_s, sizeof five_s);
    asio::write(s, asio::buffer(payload));
    std::string got(4096, '\0');
    std::error_code ec;
    size_t total = 0;
    while (!ec && total < got.size()) total += s.read_some(asio::buffer(got.data() + total, got.size() - total), ec);
    CHECK(ec == asio::error::eof);  // the job manager hung up on it
    CHECK(got.find("error") != std::string::npos);
  }
  // Authenticated requests the job manager must refuse without falling over.
  auto chaos = cluster.client().Call({{"op", "chaos"}, {"action", "random"}, {"kinds", Json::array()}});
  CHECK_MESSAGE(!chaos.ok(), "random chaos with no kinds was accepted");
  Json deep = Json::array();
  for (size_t i = 0; i < kMaxJsonDepth; ++i) deep = Json::array({std::move(deep)});
  Json nested_job = {{"stages", {{{"name", "s"}, {"program", "noop"}, {"params", {{"x", deep}}}}}}};
  auto own = cli::ConnectToJm(cluster.address());  // a frame refused closes its connection
  REQUIRE(own.ok());
  auto nested = (*own)->Call({{"op", "submit"}, {"job", nested_job}, {"job_dir", cluster.dir().string()}});
  CHECK(!nested.ok());
  CHECK_MESSAGE(nested.status().message().find("nested deeper than") != std::string::npos, nested.status().ToString());
  Json status = cluster.Wait(id);
  CHECK(status["state"] == "completed");
  CHECK(cluster.client().Call({{"op", "daemons"}}).ok());
}

TEST_CASE("Cluster.AFloodOfRefusedHandshakesLogsALineASecond") {
  // The hostile test: each refused handshake logged a line (1.3 MB in 40 s of flood).
  TestCluster cluster(1);
  for (int i = 0; i < 40; ++i) {
    auto bad = cluster.Connect(std::string(64, 'b'), "client");
    CHECK(bad.status().code() == StatusCode::kPermissionDenied);
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(1100));
  auto last = cluster.Connect(std::string(64, 'b'), "client");
  CHECK_FALSE(last.ok());
  CHECK(cluster.client().Call({{"op", "daemons"}}).ok());
  const std::string log = ReadFile((cluster.dir() / "jm.log").string()).ValueOr("");
  size_t lines = 0;
  for (size_t at = log.find("refused unauthenticated peer"); at != std::string::npos;
       at = log.find("refused unauthenticated peer", at + 1)) {
    ++lines;
  }
  CHECK(lines >= 2);
  CHECK(lines <= 3);
  CHECK(log.find("more since the last such line") != std::string::npos);
}

TEST_CASE("Cluster.ARegistrationWithImpossibleValuesIsRefusedAndTheRestGoesOn") {
  TestCluster cluster(1);
  // Each breaks one rule: the schema's (the codec names the field) or the job manager's.
  using Change = std::function<void(protocol::Register&)>;
  const std::vector<std::pair<Change, std::string>> cases = {
      {[](auto& r) { r.set_data_port(70000); }, "DaemonToJm.register.data_port: must be 1 to 65535, got 70000"},
      {[](auto& r) { r.set_data_port(0); }, "DaemonToJm.register.data_port: must be 1 to 65535, got 0"},
      {[](auto& r) { r.set_cpus(-1); }, "DaemonToJm.register.cpus: must be 0 to 1,000,000"},
      {[](auto& r) { r.set_cpus(1e300); }, "DaemonToJm.register.cpus: must be 0 to 1,000,000"},
      {[](auto& r) { r.set_gpus(-2); }, "DaemonToJm.register.gpus: must be 0 to 1000000, got -2"},
      {[](auto& r) { r.set_gpus(int64_t{1} << 40); }, "DaemonToJm.register.gpus: must be 0 to 1000000"},
      {[](auto& r) { r.set_memory_mb(-1); }, "DaemonToJm.register.memory_mb: must not be negative"},
      {[](auto& r) { r.set_name(""); }, "DaemonToJm.register.name: required"},
      {[](auto& r) { r.set_name("a b/c"); }, "register: "},
      {[](auto& r) { r.set_data_host("a b\n"); }, "register: data_host"},
      {[](auto& r) { r.set_data_host(""); }, "DaemonToJm.register.data_host: required"},
      {[](auto& r) { r.clear_stream(); }, "DaemonToJm.register.stream.tcp: required"},
      {[](auto& r) { (*r.mutable_labels())["host"] = "\xff"; }, "DaemonToJm: the body does not parse"},
  };
  for (const auto& [change, error] : cases) {
    CAPTURE(error);
    auto daemon = cluster.Connect(cluster.secret(), "daemon");
    REQUIRE(daemon.ok());
    protocol::DaemonToJm bad;
    protocol::Register& r = *bad.mutable_register_();
    r.set_name("x");
    r.set_cpus(1);
    r.set_data_host("127.0.0.1");
    r.set_data_port(9);
    r.mutable_stream()->set_tcp("tcp://127.0.0.1:9");
    change(r);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    REQUIRE((*daemon)->SendFrame(protocol::EncodeFrame(bad), deadline).ok());
    auto reply = (*daemon)->ReceiveFrame(deadline);
    CHECK_FALSE(reply.ok());
    CHECK_MESSAGE(reply.status().message().find(error) != std::string::npos, reply.status().ToString());
  }
  {  // A daemon that speaks JSON (an older build past the header check) is told what to speak.
    auto daemon = cluster.Connect(cluster.secret(), "daemon");
    REQUIRE(daemon.ok());
    auto reply = (*daemon)->Call({{"op", "register"}, {"name", "x"}});
    CHECK_MESSAGE(reply.status().message().find("protocol frames") != std::string::npos, reply.status().ToString());
  }
  Json daemons = (*cluster.client().Call({{"op", "daemons"}}))["daemons"];
  CHECK(daemons.size() == 1);
  CHECK(cluster.Wait(cluster.Submit({{"stages", {{{"name", "s"}, {"program", "noop"}}}}}))["state"] == "completed");
  // Logs of a vertex the job does not have: an error, not the job's own lines.
  auto logs = cluster.client().Call({{"op", "logs"}, {"job", 1}, {"vertex", "a[99999999999]"}});
  CHECK(!logs.ok());
  CHECK_MESSAGE(logs.status().message().find("has no vertex") != std::string::npos, logs.status().ToString());
  // A job named by something other than its id: said so, not "no job 18446744073709551615".
  auto named = cluster.client().Call({{"op", "status"}, {"job", "x"}});
  CHECK(!named.ok());
  CHECK_MESSAGE(named.status().message().find("\"job\": expected a job id (a whole number), got \"x\"") != std::string::npos,
                named.status().ToString());
}

TEST_CASE("Cluster.AVertexWhoseErrorIsNotUtf8FailsAloneAndItsDaemonLives") {
  TestCluster cluster(1);
  // Its stderr: a two-byte character, then a byte that is never UTF-8.
  Json job = {{"stages",
               {{{"name", "bad"},
                 {"program", "exec"},
                 {"max_attempts", 1},
                 {"params", {{"argv", {"sh", "-c", "printf 'x\\303\\251\\377' >&2; exit 3"}}}}}}}};
  Json status = cluster.Wait(cluster.Submit(job), std::chrono::seconds(30));  // a daemon killed by it: no daemon left
  CHECK(status["state"] == "failed");
  CHECK_MESSAGE(status.value("failure", "").find("x\u00e9\ufffd") != std::string::npos, status.dump());
  uint64_t next = cluster.Submit({{"stages", {{{"name", "s"}, {"program", "checksum"}, {"replicas", 2}}}}});
  CHECK(cluster.Wait(next)["state"] == "completed");
  Json daemons = (*cluster.client().Call({{"op", "daemons"}}))["daemons"];
  CHECK(daemons.size() == 1);  // the same registration throughout
}

TEST_CASE("Cluster.AVertexThatKillsItsDaemonFailsTheJobAtMaxDaemonLossesAndSparesTheRest") {
  TestCluster cluster(3);
  // Each attempt of `killer` takes its daemon down, as a program crashing in-process would: the
  // test SIGKILLs whichever daemon runs it (an exec child can no longer signal its daemon).
  Json job = {
      {"stages", {{{"name", "killer"}, {"program", "exec"}, {"max_daemon_losses", 2}, {"params", {{"argv", {"sleep", "30"}}}}}}}};
  const uint64_t id = cluster.Submit(job);
  std::vector<pid_t> all = cluster.pids();
  std::set<std::string> killed;
  for (int attempt = 0; attempt < 2; ++attempt) {
    std::string runner;
    for (int i = 0; i < 1000 && runner.empty(); ++i) {
      const Json listing = *cluster.client().Call({{"op", "daemons"}});
      for (const auto& d : listing["daemons"]) {
        if (d["alive"] == true && d["running"] == 1 && !killed.count(d["name"].get<std::string>())) {
          runner = d["name"].get<std::string>();
        }
      }
      if (runner.empty()) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    REQUIRE_MESSAGE(!runner.empty(),
                    "no daemon ran killer[0]: " << (*cluster.client().Call({{"op", "daemons"}})).dump()
                                                << (*cluster.client().Call({{"op", "status"}, {"job", id}})).dump());
    ::kill(all[std::stoi(runner.substr(1))], SIGKILL);
    killed.insert(runner);
  }
  Json status = cluster.Wait(id, std::chrono::seconds(30));
  CHECK(status["state"] == "failed");
  CHECK_MESSAGE(
      status.value("failure", "").find("killer[0] reached max_daemon_losses 2: its daemon was lost with no fault injected") !=
          std::string::npos,
      status.dump());
  uint64_t next = cluster.Submit({{"stages", {{{"name", "s"}, {"program", "checksum"}, {"replicas", 2}}}}});
  CHECK(cluster.Wait(next)["state"] == "completed");
  std::vector<pid_t> daemons = cluster.pids();
  daemons.pop_back();  // the job manager's
  int running = 0;     // the daemon the killer never reached
  for (pid_t pid : daemons) running += Running(pid);
  CHECK_MESSAGE(running == 1, (*cluster.client().Call({{"op", "daemons"}}))["daemons"].dump());
}

TEST_CASE("Cluster.ADaemonIsNotLostForHeartbeatsTheJobManagerWasTooBusyToRead") {
  // A 150 ms timeout: d0 heartbeats every 30 ms, as the job manager tells it at registration.
  if (TlsMode()) return;  // it speaks the plaintext handshake byte by byte; TLS's is timed alike by the others
  TestCluster cluster(1, 2, /*heartbeat_timeout_ms=*/150);
  cluster.WaitForDaemons(1);
  // A million vertices no daemon can run: building them keeps the job manager's io thread from
  // reading for about twice the timeout (0.33 s here), while d0's heartbeats wait in its
  // socket; the tick timer that expired meanwhile may run before they are read (whichever
  // became ready first), and must not count the job manager's own silence against d0.
  uint64_t big = cluster.Submit(
      {{"stages", {{{"name", "big"}, {"program", "noop"}, {"replicas", 1000000}, {"resources", {{"cpus", 64}}}}}}});
  REQUIRE(cluster.client().Call({{"op", "cancel"}, {"job", big}}).ok());
  uint64_t job = cluster.Submit({{"stages", {{{"name", "s"}, {"program", "checksum"}, {"replicas", 2}}}}});
  CHECK(cluster.Wait(job)["state"] == "completed");
  std::this_thread::sleep_for(std::chrono::seconds(1));  // idle: heartbeats alone keep d0 known
  // A loss would not show in the listing once d0 is back within its return grace: the log tells.
  const std::string log = ReadFile((cluster.dir() / "jm.log").string()).ValueOr("");
  CHECK_MESSAGE(log.find("daemon d0 lost") == std::string::npos, log);
  WARN_MESSAGE(log.find("busy for") != std::string::npos,
               "building the job did not stall the job manager for half the timeout: "
               "only the heartbeat pace was tested");
}

TEST_CASE("Cluster.ATraceLargerThanOnePartArrivesWholeAndInOrder") {
  // 25,000 attempts: three parts of the streamed answer (jobmanager/trace_streamer.h). Before
  // the answer was streamed, a million-attempt trace stalled the job manager for seconds and
  // then exceeded the largest frame.
  TestCluster cluster(2);
  const int n = 25000;
  uint64_t id = cluster.Submit({{"stages", {{{"name", "s"}, {"program", "noop"}, {"replicas", n}}}}});
  REQUIRE(cluster.Wait(id)["state"] == "completed");
  std::ostringstream out;
  REQUIRE(cli::WriteTrace(cluster.client(), id, out).ok());
  const Json trace = Json::parse(out.str());
  size_t spans = 0, processes = 0;
  double last_ts = -1;
  bool ordered = true;
  for (const auto& e : trace["traceEvents"]) {
    if (e["ph"] == "X") {
      ++spans;
      ordered &= e["ts"].get<double>() >= last_ts;
      last_ts = e["ts"].get<double>();
    }
    processes += e["name"] == "process_name";
  }
  CHECK(spans == n);
  CHECK(ordered);
  CHECK(processes >= 1);
  CHECK(trace["otherData"]["job"] == id);
  CHECK(trace["otherData"]["state"] == "completed");
  // A job that does not exist: the job manager's error, and the connection still serves.
  std::ostringstream none;
  Status missing = cli::WriteTrace(cluster.client(), 999, none);
  CHECK(missing.code() == StatusCode::kFailedPrecondition);
  CHECK(missing.message().find("no job 999") != std::string::npos);
  CHECK(cluster.client().Call({{"op", "daemons"}}).ok());
}

TEST_CASE("Cluster.APeerSlowerThanTheHeartbeatTimeoutStillAuthenticates") {
  // The hostile test: with --heartbeat-timeout-ms 150 a client 200 ms away was cut off in its
  // handshake at the heartbeat timeout, every time. Here the answer to the hello goes 400 ms late.
  if (TlsMode()) return;  // it speaks the plaintext handshake byte by byte; TLS's is timed alike by the others
  TestCluster cluster(1, 2, /*heartbeat_timeout_ms=*/150);
  cluster.WaitForDaemons(1);
  asio::io_context io;
  asio::ip::tcp::socket s(io);
  s.connect({asio::ip::make_address("127.0.0.1"), cluster.jm_port()});
  const timeval five_s{5, 0};
  ::setsockopt(s.native_handle(), SOL_SOCKET, SO_RCVTIMEO, &five_s, sizeof five_s);
  auto read_frame = [&] {
    std::array<char, wire::kHeaderBytes> header{};
    asio::read(s, asio::buffer(header));
    auto h = wire::DecodeHeader(header.data(), 1 << 20);
    REQUIRE(h.ok());
    std::string body(h->length, '\0');
    asio::read(s, asio::buffer(body));
    return Json::parse(body);
  };
  const Json hello = read_frame();
  std::this_thread::sleep_for(std::chrono::milliseconds(400));
  auto answer = auth::AnswerHello(hello, cluster.secret(), "client");
  REQUIRE(answer.ok());
  asio::write(s, asio::buffer(wire::EncodeFrame(wire::FrameType::kJson, answer->message.dump())));
  const Json welcome = read_frame();
  CHECK(auth::CheckWelcome(welcome, cluster.secret(), *answer).ok());
}

TEST_CASE("Cluster.ADaemonGivenOnlyTheStateDirFindsTheJobManager") {
  TestCluster cluster(0);
  cluster.AddDaemonFromStateDir("d0", 2);
  cluster.WaitForDaemons(1);
  uint64_t id = cluster.Submit({{"stages", {{{"name", "s"}, {"program", "checksum"}, {"replicas", 2}}}}});
  CHECK(cluster.Wait(id)["state"] == "completed");
}

TEST_CASE("Cluster.ADaemonGivenOnlyTheStateDirFollowsAJobManagerStartedAgainOnAnotherPort") {
  TestCluster cluster(0);
  cluster.AddDaemonFromStateDir("d0", 2);
  cluster.WaitForDaemons(1);
  const std::string before = cluster.address().jm;
  cluster.KillJm();
  cluster.RestartJm({}, "127.0.0.1:0");
  CHECK(cluster.address().jm != before);
  cluster.WaitForDaemons(1);  // d0 read the new jm.addr when it reconnected
  uint64_t id = cluster.Submit({{"stages", {{{"name", "s"}, {"program", "checksum"}, {"replicas", 2}}}}});
  CHECK(cluster.Wait(id)["state"] == "completed");
}

TEST_CASE("Cluster.ADaemonWithoutTheTlsDirectoryIsRefusedEvenThroughTheLocalSocket") {
  // The local socket is plaintext; a daemon that reached a TLS job manager there would have
  // served its outputs and streams in plaintext to members that speak only TLS.
  if (TlsMode()) return;  // the TLS run passes --tls already
  TestCluster cluster(0, 2, 1000, {"--tls"});
  cluster.AddDaemon("plain", 1);  // no --tls-dir: the job manager's local socket, in plaintext
  const auto log = cluster.dir() / "plain.log";
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  std::string text;
  while (text.find("has no TLS directory") == std::string::npos && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    text = ReadFile(log.string()).ValueOr("");
  }
  CHECK_MESSAGE(text.find("runs TLS, and this daemon has no TLS directory") != std::string::npos, text);
  auto reply = cluster.client().Call({{"op", "daemons"}});  // the client found STATE_DIR/tls
  REQUIRE_MESSAGE(reply.ok(), reply.status().ToString());
  CHECK((*reply)["daemons"].empty());
}

TEST_CASE("Cluster.DaemonsOnTheJobManagersHostConnectThroughItsLocalSocket") {
  if (TlsMode()) return;  // the TLS run keeps every daemon off the local socket
  TestCluster cluster(1);
  cluster.AddDaemon("tcp-only", 2, {"--no-local-socket"});
  cluster.WaitForDaemons(2);
  std::map<std::string, std::string> control;
  auto reply = cluster.client().Call({{"op", "daemons"}});
  REQUIRE(reply.ok());
  for (const auto& d : (*reply)["daemons"]) control[d["name"].get<std::string>()] = d.value("control", "");
  INFO((*reply)["daemons"].dump());
  CHECK(control["d0"] == "local socket");
  CHECK(control["tcp-only"] == "tcp");
  // Both carry work: the job spreads over them.
  uint64_t id =
      cluster.Submit({{"stages", {{{"name", "s"}, {"program", "checksum"}, {"replicas", 8}, {"params", {{"sleep_ms", 50}}}}}}});
  Json status = cluster.Wait(id);
  CHECK(status["state"] == "completed");
  // The local socket asks for the secret like the TCP port does.
  asio::io_context io;
  asio::local::stream_protocol::socket s(io);
  s.connect(net::AbstractEndpoint(net::ControlLocalSocketName("127.0.0.1", cluster.jm_port())));
  const std::string garbage = "GET / HTTP/1.1\r\n\r\n";
  asio::write(s, asio::buffer(garbage));
  std::string got(4096, '\0');
  std::error_code ec;
  size_t total = 0;
  while (!ec && total < got.size()) total += s.read_some(asio::buffer(got.data() + total, got.size() - total), ec);
  CHECK((ec == asio::error::eof || ec == asio::error::connection_reset));  // it hung up on it
  CHECK(got.find("error") != std::string::npos);
}

}  // namespace
}  // namespace copse::testing
