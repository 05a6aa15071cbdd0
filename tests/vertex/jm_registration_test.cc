// A daemon's registration alone (vertex/jm_registration.h), against a scripted job manager on
// 127.0.0.1: what it sends, what it takes from the reply, and what it refuses before
// connecting. The daemon's own tests (daemon_chain_test.cc) cover impostors and silence.
#include "vertex/jm_registration.h"

#include <doctest/doctest.h>

#include <thread>

#include "tests/vertex/scripted_job_manager.h"

namespace copse::vertex {
namespace {

using testing::kSecret;
using testing::ScriptedJobManager;

DaemonOptions OptionsFor(const ScriptedJobManager& jm) {
  DaemonOptions o;
  o.jm_port = jm.port();
  o.name = "d0";
  o.secret = kSecret;
  o.local_socket = false;
  o.handshake_timeout = std::chrono::milliseconds(10000);
  return o;
}

protocol::Register Registering() {
  protocol::Register reg;
  reg.set_name("d0");
  reg.set_cpus(3);
  reg.set_data_host("127.0.0.1");
  reg.set_data_port(4242);
  reg.mutable_stream()->set_tcp("tcp://127.0.0.1:4243");
  (*reg.mutable_labels())["rack"] = "r1";
  protocol::OutputKey& held = *reg.add_outputs();
  held.set_job(7);
  held.set_vertex(2);
  held.set_version(1);
  return reg;
}

TEST_CASE("JmRegistration.SendsWhatTheDaemonHoldsAndTakesTheHeartbeatTheJobManagerAsks" * doctest::timeout(30)) {
  ScriptedJobManager jm;
  protocol::Register received;
  std::thread accept([&] { received = jm.Accept(/*heartbeat_ms=*/350); });
  auto registered = RegisterWithJobManager(OptionsFor(jm), Registering());
  accept.join();
  REQUIRE_MESSAGE(registered.ok(), registered.status().ToString());
  CHECK(registered->heartbeat_every == std::chrono::milliseconds(350));
  REQUIRE(registered->client);
  CHECK(!registered->client->local());
  CHECK(received.cpus() == 3);
  CHECK(received.data_port() == 4242);
  CHECK(received.labels().at("rack") == "r1");
  REQUIRE(received.outputs_size() == 1);
  CHECK(received.outputs(0).job() == 7);
}

TEST_CASE("JmRegistration.RefusesWhatTheJobManagerCouldNotParseBeforeConnecting" * doctest::timeout(30)) {
  ScriptedJobManager jm;
  protocol::Register reg = Registering();
  (*reg.mutable_labels())["zone"] = "\xff\xfe";
  auto registered = RegisterWithJobManager(OptionsFor(jm), reg);
  CHECK(registered.status().code() == StatusCode::kInvalidArgument);
  CHECK_MESSAGE(registered.status().message().find("its label \"zone\" is not UTF-8 text") != std::string::npos,
                registered.status().ToString());
  CHECK(!jm.WaitForConnection(100));  // nothing was sent

  DaemonOptions named = OptionsFor(jm);
  named.jm_host = "jm.example";
  auto unresolved = RegisterWithJobManager(named, Registering());
  CHECK(unresolved.status().code() == StatusCode::kInvalidArgument);
  CHECK(unresolved.status().message().find("\"jm.example\" is not an IP address") != std::string::npos);
}

TEST_CASE("JmRegistration.ASilentJobManagerFailsTheAttemptWithinTheHandshakeTimeout" * doctest::timeout(30)) {
  ScriptedJobManager jm;
  DaemonOptions o = OptionsFor(jm);
  o.handshake_timeout = std::chrono::milliseconds(500);
  std::thread accept([&] { jm.AcceptAndFallSilent(); });
  auto registered = RegisterWithJobManager(o, Registering());
  accept.join();
  CHECK(registered.status().code() == StatusCode::kTimeout);
  CHECK_MESSAGE(registered.status().message().find("did not finish the handshake within 500 ms") != std::string::npos,
                registered.status().ToString());
}

}  // namespace
}  // namespace copse::vertex
