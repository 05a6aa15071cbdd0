// A real Daemon (in-process) driven by a fake job manager on 127.0.0.1 that speaks the typed
// protocol (protocol/daemon.proto) frame by frame: the chained-task protocol as the daemon sees
// it, with message orders a live job manager only hits by chance, and malformed messages.
#include <poll.h>
#include <sys/socket.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <future>
#include <limits>
#include <optional>
#include <thread>
#include <variant>

#include <doctest/doctest.h>

#include "common/json_util.h"
#include "protocol/codec.h"
#include "tests/vertex/scripted_job_manager.h"
#include "vertex/daemon.h"

namespace copse::vertex {
namespace {

using chan::internal::Socket;
using testing::kSecret;
using testing::ScriptedJobManager;

/// A noop task of job 1, version 1, chained after version 1 of `after` (when given).
protocol::Task Task(uint32_t vertex, std::optional<uint32_t> after = std::nullopt) {
  protocol::Task t;
  t.set_job(1);
  t.set_vertex(vertex);
  t.set_version(1);
  t.set_name("v" + std::to_string(vertex));
  t.set_program("noop");
  t.set_threads(1);
  if (after) {
    t.add_after()->set_vertex(*after);
    t.mutable_after(0)->set_version(1);
  }
  return t;
}

/// A Run message of these tasks.
protocol::JmToDaemon Run(std::initializer_list<protocol::Task> tasks) {
  protocol::JmToDaemon m;
  for (const auto& t : tasks) *m.mutable_run()->add_tasks() = t;
  return m;
}

DaemonOptions OptionsFor(const ScriptedJobManager& jm, const std::filesystem::path& dir, int gpus = 0) {
  DaemonOptions o;
  o.jm_port = jm.port();
  o.name = "d0";
  o.secret = kSecret;
  o.cpus = 2;
  o.gpus = gpus;
  o.work_dir = dir;
  o.reconnect_timeout = std::chrono::milliseconds(1);  // give up at once
  return o;
}

struct DaemonUnderTest {
  explicit DaemonUnderTest(ScriptedJobManager& jm, int gpus = 0) {
    dir = std::filesystem::temp_directory_path() / ("copse-daemon-test-" + std::to_string(::getpid()));
    DaemonOptions o = OptionsFor(jm, dir, gpus);
    std::thread accept([&] { jm.Accept(); });
    auto started = Daemon::Start(o);
    accept.join();
    REQUIRE_MESSAGE(started.ok(), started.status().ToString());
    daemon = std::move(*started);
    runner = std::thread([this] { (void)daemon->Run(); });
  }
  ~DaemonUnderTest() {
    daemon->Stop();
    runner.join();
    daemon.reset();
    std::filesystem::remove_all(dir);
  }
  std::filesystem::path dir;
  std::unique_ptr<Daemon> daemon;
  std::thread runner;
};

TEST_CASE("Daemon.RegistersOnlyWithAJobManagerThatProvesItHoldsTheSecret" * doctest::timeout(30)) {
  // Anything listening where a daemon connects (the job manager's local socket is a name any
  // local user can bind first) would otherwise have it run the tasks it sends.
  for (bool forged : {false, true}) {
    ScriptedJobManager jm;
    const auto dir = std::filesystem::temp_directory_path() / ("copse-daemon-impostor-" + std::to_string(::getpid()));
    std::thread accept([&] { jm.AcceptAsImpostor(forged); });
    auto started = Daemon::Start(OptionsFor(jm, dir));
    accept.join();
    CHECK(started.status().code() == StatusCode::kPermissionDenied);
    CHECK_MESSAGE(
        started.status().message().find(forged ? "proof is wrong" : "did not prove it holds the secret") != std::string::npos,
        started.status().ToString());
    std::filesystem::remove_all(dir);
  }
}

TEST_CASE("Daemon.GivesUpOnAJobManagerThatAcceptsButNeverFinishesTheHandshake" * doctest::timeout(60)) {
  // Registration is synchronous: without a bound, a job manager that accepts and then says
  // nothing (never accepted: the kernel completes the connection anyway; or stuck after its
  // hello) held the daemon for ever, past its reconnect timeout, never exiting.
  for (bool greets : {false, true}) {
    CAPTURE(greets);
    ScriptedJobManager jm;
    const uint16_t port = jm.port();
    const auto dir = std::filesystem::temp_directory_path() / ("copse-daemon-silent-" + std::to_string(::getpid()));
    DaemonOptions o = OptionsFor(jm, dir);
    o.handshake_timeout = std::chrono::milliseconds(1000);  // time for the test's thread to greet, under load
    std::thread accept;
    if (greets) accept = std::thread([&] { jm.AcceptAndFallSilent(); });
    auto started = std::async(std::launch::async, [&] { return Daemon::Start(o); });
    const bool ended = started.wait_for(std::chrono::seconds(10)) == std::future_status::ready;
    if (accept.joinable()) accept.join();
    jm.Close();  // a daemon still waiting now sees the connection end, so a regression fails, not hangs
    CHECK_MESSAGE(ended, "the daemon still waits after 10 s");
    auto result = started.get();
    if (ended) {
      CHECK(result.status().code() == StatusCode::kTimeout);
      CHECK_MESSAGE(result.status().message().find("the job manager at 127.0.0.1:" + std::to_string(port) +
                                                   " did not finish the handshake within 1000 ms") != std::string::npos,
                    result.status().ToString());
    }
    std::filesystem::remove_all(dir);
  }
}

TEST_CASE("Daemon.RegistersOverTcpWhenTheJobManagersLocalSocketQueueIsFull" * doctest::timeout(60)) {
  // A non-blocking Unix connect to a full accept queue fails with EAGAIN (asio takes it for a
  // connect in progress): the daemon must not give up, nor use an unconnected socket.
  ScriptedJobManager jm;
  const std::string name = net::ControlLocalSocketName("127.0.0.1", jm.port());
  auto local = Socket::ListenLocal(name);
  REQUIRE_MESSAGE(local.ok(), local.status().ToString());
  REQUIRE(::listen(local->fd(), 0) == 0);  // room for one connection waiting
  auto first = Socket::ConnectLocal(name, 1000);
  REQUIRE_MESSAGE(first.ok(), first.status().ToString());
  const auto dir = std::filesystem::temp_directory_path() / ("copse-daemon-busy-local-" + std::to_string(::getpid()));
  {
    auto started = std::async(std::launch::async, [&] { return Daemon::Start(OptionsFor(jm, dir)); });
    const bool over_tcp = jm.WaitForConnection(10000);
    CHECK_MESSAGE(over_tcp, "the daemon never connected over TCP");
    if (over_tcp) jm.Accept();
    auto daemon = started.get();
    CHECK_MESSAGE(daemon.ok(), daemon.status().ToString());
  }
  std::filesystem::remove_all(dir);
}

TEST_CASE("Daemon.ATaskChainedAfterOneWithdrawnOnArrivalIsWithdrawnToo" * doctest::timeout(30)) {
  // v1 fails and has ended before v2 (chained after it) and v3 (chained after v2) arrive: v2 is
  // withdrawn as it arrives, and so must v3 be, in the same batch or a later one — not held
  // for ever behind a task that will never run.
  ScriptedJobManager jm;
  DaemonUnderTest d(jm);
  protocol::Task failing = Task(1);
  failing.set_inject_failure("boom");
  jm.Send(Run({failing}));
  protocol::AttemptReport r1 = jm.NextReport();
  CHECK(r1.vertex() == 1);
  CHECK_FALSE(r1.ok());

  jm.Send(Run({Task(2, 1), Task(3, 2)}));
  protocol::AttemptReport r2 = jm.NextReport(), r3 = jm.NextReport();
  CHECK(r2.vertex() == 2);
  CHECK(r2.failure() == protocol::FAILURE_CANCELLED);
  CHECK(r3.vertex() == 3);
  CHECK(r3.failure() == protocol::FAILURE_CANCELLED);

  jm.Send(Run({Task(4, 3)}));  // later still
  protocol::AttemptReport r4 = jm.NextReport();
  CHECK(r4.vertex() == 4);
  CHECK(r4.failure() == protocol::FAILURE_CANCELLED);
}

TEST_CASE("Daemon.AMalformedMessageFromTheJobManagerDropsItNamingTheField" * doctest::timeout(30)) {
  // A job manager that holds the secret may still be of another build, or broken: the codec
  // checks every message before anything reads it, and the daemon hangs up saying which
  // message and field were wrong (then reconnects: here there is nothing to reconnect to).
  auto malformed_run = [] {
    protocol::JmToDaemon bad = Run({Task(7), Task(8)});
    bad.mutable_run()->mutable_tasks(1)->set_version(0);
    std::string body;
    REQUIRE(bad.SerializeToString(&body));
    return body;
  };
  struct Case {
    std::string body;
    std::string error;
  };
  for (const Case& c : {Case{"\xff\xff\xff", "JmToDaemon: the body does not parse"},
                        Case{malformed_run(), "JmToDaemon.run.tasks[1].version: required (>= 1)"}}) {
    CAPTURE(c.error);
    ScriptedJobManager jm;
    DaemonUnderTest d(jm);
    jm.Send(Run({Task(6)}));  // served before the bad message
    protocol::AttemptReport r = jm.NextReport();
    CHECK(r.vertex() == 6);
    CHECK(r.ok());
    jm.SendBody(c.body);
    const std::string error = jm.NextError();
    CHECK_MESSAGE(error.find(c.error) != std::string::npos, error);
    jm.Close();  // its reconnect finds nobody
  }
}

TEST_CASE("Daemon.AnAttemptWaitsForTheGpuAnEndingAttemptStillHolds" * doctest::timeout(30)) {
  // The job manager counts a cancelled attempt's GPU free once it sends the cancel, so the next
  // attempt can arrive while the old one still runs here: it must wait for the device, not run
  // without one (an NCCL member then failed, and its gang restarted).
  ScriptedJobManager jm;
  DaemonUnderTest d(jm, /*gpus=*/1);
  protocol::Task holder = Task(1);
  holder.set_program("checksum");
  holder.set_params_json(R"({"sleep_ms": 600})");
  holder.set_gpus(1);
  jm.Send(Run({holder}));
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  protocol::Task next = Task(2);
  next.set_gpus(1);
  jm.Send(Run({next}));
  protocol::AttemptReport a = jm.NextReport(), b = jm.NextReport();
  protocol::AttemptReport r2 = a.vertex() == 2 ? a : b;
  CHECK_MESSAGE(r2.ok(), r2.DebugString());
  CHECK_MESSAGE(r2.duration_ms() > 250, r2.DebugString());  // it waited out most of v1's 600 ms
}

TEST_CASE("Daemon.AChainTwoDeepRunsInOrderOnceItsHeadSucceeds" * doctest::timeout(30)) {
  ScriptedJobManager jm;
  DaemonUnderTest d(jm);
  protocol::Task head = Task(1);
  head.set_delay_ms(50);  // still running when the chain arrives
  jm.Send(Run({head, Task(2, 1), Task(3, 2)}));
  for (uint32_t v : {1u, 2u, 3u}) {
    protocol::AttemptReport r = jm.NextReport();
    CHECK(r.vertex() == v);
    CHECK(r.ok());
  }
}

/// How many threads of this process are named `name` (/proc/self/task/*/comm).
int ThreadsNamed(const std::string& name) {
  int n = 0;
  for (const auto& task : std::filesystem::directory_iterator("/proc/self/task")) {
    std::ifstream comm(task.path() / "comm");
    std::string line;
    if (std::getline(comm, line) && line == name) ++n;
  }
  return n;
}

TEST_CASE("Daemon.ItsThreadsAreNamedForProfiles" * doctest::timeout(30)) {
  ScriptedJobManager jm;
  DaemonUnderTest d(jm);
  // Each thread names itself as it starts: give them a moment.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while ((ThreadsNamed("copse-vertex") < 2 || ThreadsNamed("copse-data-acc") < 1) &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  CHECK(ThreadsNamed("copse-vertex") == 2);  // one per cpu
  CHECK(ThreadsNamed("copse-data-acc") == 1);
}

}  // namespace
}  // namespace copse::vertex
