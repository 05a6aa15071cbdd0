// Placement policies, called directly with hand-made daemons and requests.
#include <doctest/doctest.h>

#include "jobmanager/placement.h"

namespace copse::jm {
namespace {

std::vector<PlacementDaemon> Daemons() {
  // d0, d1 on host a (rack r1); d2 on host b (rack r1); d3 on host c (rack r2). All free.
  return {{DaemonId(0), "a", "r1", 2, true},
          {DaemonId(1), "a", "r1", 2, true},
          {DaemonId(2), "b", "r1", 2, true},
          {DaemonId(3), "c", "r2", 4, true}};
}

TEST_CASE("Placement.LocalityPrefersBytesOnTheDaemonThenHostThenRack") {
  LocalityPolicy policy(std::chrono::milliseconds(0));
  auto daemons = Daemons();
  PlacementRequest r;
  r.input_bytes = {{DaemonId(2), 100}, {DaemonId(0), 60}, {DaemonId(1), 50}};
  CHECK(policy.Choose(r, daemons) == DaemonId(2));  // most bytes on the daemon itself
  daemons[2].fits = false;
  // d0 has 60 local; host a also holds d1's 50: d0 beats d1 (50 local).
  CHECK(policy.Choose(r, daemons) == DaemonId(0));
  daemons[0].fits = false;
  daemons[1].fits = false;
  // Nothing local fits; d3 (rack r2) holds nothing, but it is the only one that fits.
  CHECK(policy.Choose(r, daemons) == DaemonId(3));
  // With no locality at all, the least loaded daemon wins.
  auto fresh = Daemons();
  CHECK(policy.Choose(PlacementRequest{}, fresh) == DaemonId(3));
}

TEST_CASE("Placement.SameRackBeatsAnotherRack") {
  LocalityPolicy policy(std::chrono::milliseconds(0));
  auto daemons = Daemons();
  daemons[0].fits = false;  // the daemon with the bytes is busy
  daemons[1].fits = false;  // so is its host peer
  PlacementRequest r;
  r.input_bytes = {{DaemonId(0), 1000}};
  CHECK(policy.Choose(r, daemons) == DaemonId(2));  // host b shares rack r1 with the bytes
}

TEST_CASE("Placement.NamedInputHostsCountAsLocality") {
  LocalityPolicy policy(std::chrono::milliseconds(0));
  PlacementRequest r;
  r.input_hosts = {"b"};
  r.input_bytes = {{DaemonId(3), 5'000'000}};
  CHECK(policy.Choose(r, Daemons()) == DaemonId(2));
}

TEST_CASE("Placement.WaitsBrieflyForTheLocalSlotThenGoesRemote") {
  LocalityPolicy policy(std::chrono::milliseconds(100));
  auto daemons = Daemons();
  daemons[3].fits = false;  // the data is here, but the slot is busy
  PlacementRequest r;
  r.input_bytes = {{DaemonId(3), 1000}};
  r.waited = std::chrono::milliseconds(10);
  CHECK_FALSE(policy.Choose(r, daemons).has_value());
  r.waited = std::chrono::milliseconds(150);
  CHECK(policy.Choose(r, daemons).has_value());
}

TEST_CASE("Placement.LoadPolicyIgnoresLocality") {
  LoadPolicy policy;
  PlacementRequest r;
  r.input_bytes = {{DaemonId(0), 1'000'000}};
  CHECK(policy.Choose(r, Daemons()) == DaemonId(3));
  CHECK(MakePlacementPolicy("load", {})->name() == "load");
  CHECK(MakePlacementPolicy("nope", {}) == nullptr);
}

}  // namespace
}  // namespace copse::jm
