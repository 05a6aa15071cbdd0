// A daemon's session with the job manager alone (vertex/jm_session.h), against a scripted job
// manager on 127.0.0.1: heartbeats at the rate asked, messages handed over, reconnecting (and
// registering again) when the connection ends, staying away while a cut lasts, giving up after
// the reconnect timeout.
#include "vertex/jm_session.h"

#include <doctest/doctest.h>

#include <atomic>
#include <future>
#include <thread>

#include "protocol/codec.h"
#include "tests/vertex/scripted_job_manager.h"

namespace copse::vertex {
namespace {

using testing::kSecret;
using testing::ScriptedJobManager;

protocol::Register Registering() {
  protocol::Register reg;
  reg.set_name("d0");
  reg.set_cpus(1);
  reg.set_data_host("127.0.0.1");
  reg.set_data_port(4242);
  reg.mutable_stream()->set_tcp("tcp://127.0.0.1:4243");
  return reg;
}

/// A session with what it was handed recorded.
struct Session {
  explicit Session(const ScriptedJobManager& jm, std::chrono::milliseconds reconnect_timeout = std::chrono::milliseconds(0)) {
    DaemonOptions o;
    o.jm_port = jm.port();
    o.name = "d0";
    o.secret = kSecret;
    o.local_socket = false;
    o.reconnect_timeout = reconnect_timeout;
    session =
        std::make_unique<JmSession>(o, JmSession::Handlers{[this] {
                                                             ++registrations;
                                                             return Registering();
                                                           },
                                                           [this](std::string body) {
                                                             auto msg = protocol::DecodeJmToDaemon(body);
                                                             if (!msg.ok()) return;
                                                             if (msg->has_cut())
                                                               return session->CutFor(std::chrono::milliseconds(msg->cut().ms()));
                                                             if (msg->has_release()) released += msg->release().keys_size();
                                                           },
                                                           [this](const Status&) { ++lost; }});
  }
  /// Registers while `jm` accepts, then runs the session on a thread of its own.
  void Start(ScriptedJobManager& jm, int heartbeat_ms = 200) {
    std::thread accept([&] { jm.Accept(heartbeat_ms); });
    Status st = session->Register();
    accept.join();
    REQUIRE_MESSAGE(st.ok(), st.ToString());
    run = std::async(std::launch::async, [this] { return session->Run(); });
  }
  ~Session() {
    if (run.valid()) {
      session->Stop();
      (void)run.get();
    }
  }
  std::unique_ptr<JmSession> session;
  std::future<Status> run;
  std::atomic<int> registrations{0}, lost{0}, released{0};
};

protocol::JmToDaemon Release(int keys) {
  protocol::JmToDaemon m;
  for (int i = 0; i < keys; ++i) {
    protocol::OutputKey& k = *m.mutable_release()->add_keys();
    k.set_job(1);
    k.set_vertex(static_cast<uint32_t>(i));
    k.set_version(1);
  }
  return m;
}

void WaitFor(const std::function<bool()>& done) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!done()) {
    REQUIRE_MESSAGE(std::chrono::steady_clock::now() < deadline, "not within 10 s");
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

TEST_CASE("JmSession.HeartbeatsAtTheRateTheJobManagerAsksAndHandsOverItsMessages" * doctest::timeout(30)) {
  ScriptedJobManager jm;
  Session s(jm);
  s.Start(jm, /*heartbeat_ms=*/25);
  CHECK(s.session->heartbeat_every() == std::chrono::milliseconds(25));
  for (int i = 0; i < 3; ++i) CHECK(jm.Read().has_heartbeat());
  jm.Send(Release(3));
  WaitFor([&] { return s.released == 3; });
  CHECK(s.session->Send(protocol::EncodeFrame(protocol::DaemonToJm())) == true);
  s.session->Stop();
  CHECK(s.run.get().ok());
  CHECK(s.lost == 0);
}

TEST_CASE("JmSession.ReconnectsAndRegistersAgainWhenTheConnectionEnds" * doctest::timeout(30)) {
  ScriptedJobManager jm;
  Session s(jm);
  s.Start(jm);
  CHECK(s.registrations == 1);
  jm.Drop();  // a job manager restarted, or a partition the kernel ended
  jm.Accept();
  CHECK(s.registrations == 2);
  CHECK(s.lost == 1);
  jm.Send(Release(1));  // the new connection serves
  WaitFor([&] { return s.released == 1; });
}

TEST_CASE("JmSession.AnInjectedCutKeepsItAwayForTheTimeGiven" * doctest::timeout(30)) {
  ScriptedJobManager jm;
  Session s(jm);
  s.Start(jm);
  protocol::JmToDaemon cut;
  cut.mutable_cut()->set_ms(600);
  const auto sent = std::chrono::steady_clock::now();
  jm.Send(cut);
  WaitFor([&] { return s.lost == 1; });
  CHECK(!jm.WaitForConnection(300));  // still away halfway through
  jm.Accept();
  CHECK(std::chrono::steady_clock::now() - sent >= std::chrono::milliseconds(600));
  CHECK(s.registrations == 2);
}

TEST_CASE("JmSession.GivesUpAfterTheReconnectTimeoutSayingWhy" * doctest::timeout(30)) {
  ScriptedJobManager jm;
  Session s(jm, /*reconnect_timeout=*/std::chrono::milliseconds(300));
  s.Start(jm);
  jm.Close();  // gone for good: nothing listens any more
  REQUIRE(s.run.wait_for(std::chrono::seconds(10)) == std::future_status::ready);
  const Status st = s.run.get();
  CHECK(!st.ok());
  CHECK_MESSAGE(st.message().find("gave up reconnecting") != std::string::npos, st.ToString());
  CHECK(!s.session->Send(protocol::EncodeFrame(protocol::DaemonToJm())));  // nothing to send on
}

}  // namespace
}  // namespace copse::vertex
