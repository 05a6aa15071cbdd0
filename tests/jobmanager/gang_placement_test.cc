// Gang placement, called directly with hand-made members and daemons.
#include <doctest/doctest.h>

#include "jobmanager/gang_placement.h"
#include "tests/jobmanager/job_test_util.h"

namespace copse::jm {
namespace {

/// GangNeeds needs a graph; these tests' affinity groups are in no gang of it, so it only
/// checks that each group's largest vertex fits (1 cpu here).
struct Fixture {
  std::shared_ptr<const JobGraph> graph = testing::MustLoad(
      R"({"stages": [{"name": "a", "program": "noop", "affinity": "ga"}, {"name": "b", "program": "noop", "affinity": "gb"}]})");
  GangNeeds needs{*graph};
  LoadPolicy load;
  LocalityPolicy locality{std::chrono::seconds(10)};
};

GangMember Member(const std::string& name, double cpus, int gpus, const std::string& affinity = "") {
  return {name, Resources{cpus, gpus, 0}, affinity, {}};
}

GangDaemon Daemon(uint32_t id, double cpus, int gpus) { return {DaemonId(id), "", "", cpus, gpus, cpus, gpus}; }

TEST_CASE("GangPlacement.FindsAPlacementAGreedyPassMisses") {
  Fixture f;
  struct Case {
    const char* why;
    std::vector<GangMember> members;
    std::vector<GangDaemon> daemons;
    std::vector<DaemonId> expected;
  };
  const Case cases[] = {
      {"scarce GPUs go first: member by member, the load policy puts the 1-GPU member on d0 (most free cpus), "
       "and the 2-GPU member then fits nowhere",
       {Member("one", 1, 1), Member("two", 1, 2)},
       {Daemon(0, 4, 2), Daemon(1, 2, 1)},
       {DaemonId(1), DaemonId(0)}},
      {"backtracking where the order by size does not settle it: \"gpus\" goes first (more GPUs) to d0 (most free "
       "cpus); \"cpus\" then fits nowhere, d0 having no GPU left and d1 too few cpus; only the swap fits",
       {Member("cpus", 3, 1), Member("gpus", 1, 2)},
       {Daemon(0, 4, 2), Daemon(1, 1, 2)},
       {DaemonId(0), DaemonId(1)}},
  };
  for (const Case& c : cases) {
    INFO(c.why);
    GangRequest r;
    r.members = c.members;
    auto p = PlaceGang(r, c.daemons, f.needs, f.load);
    REQUIRE_MESSAGE(p.placed(), p.why_not);
    CHECK(p.daemons == c.expected);
  }
}

TEST_CASE("GangPlacement.ThePolicysChoiceIsTakenWhereItFits") {
  Fixture f;
  GangRequest r;
  r.members = {Member("reader", 1, 0), Member("other", 1, 0)};
  r.members[0].input_bytes[DaemonId(2)] = 1000;
  auto p = PlaceGang(r, {Daemon(0, 4, 0), Daemon(1, 4, 0), Daemon(2, 1, 0)}, f.needs, f.locality);
  REQUIRE_MESSAGE(p.placed(), p.why_not);
  CHECK(p.daemons[0] == DaemonId(2));  // beside its input, though d0 and d1 have more room
  CHECK(p.daemons[1] != DaemonId(2));  // full now
}

TEST_CASE("GangPlacement.MembersJoinedByShmOrAGroupShareADaemon") {
  Fixture f;
  GangRequest r;
  r.members = {Member("p", 1, 0), Member("q", 1, 0), Member("x", 1, 0, "ga"), Member("y", 1, 0, "ga")};
  r.share_daemon = {{0, 1}};
  auto p = PlaceGang(r, {Daemon(0, 2, 0), Daemon(1, 2, 0)}, f.needs, f.load);
  REQUIRE_MESSAGE(p.placed(), p.why_not);
  CHECK(p.daemons[0] == p.daemons[1]);
  CHECK(p.daemons[2] == p.daemons[3]);
  CHECK(p.daemons[0] != p.daemons[2]);

  SUBCASE("a pinned group is followed") {
    r.pins["ga"] = DaemonId(0);
    auto pinned = PlaceGang(r, {Daemon(0, 2, 0), Daemon(1, 2, 0)}, f.needs, f.load);
    REQUIRE_MESSAGE(pinned.placed(), pinned.why_not);
    CHECK(pinned.daemons[2] == DaemonId(0));
    CHECK(pinned.daemons[0] == DaemonId(1));
  }
}

TEST_CASE("GangPlacement.SaysWhyAGangCannotBePlaced") {
  Fixture f;
  std::vector<GangDaemon> two = {Daemon(0, 2, 0), Daemon(1, 2, 0)};
  SUBCASE("members that must share a daemon need more than any has") {
    GangRequest r;
    r.members = {Member("p", 1.5, 0), Member("q", 1, 0)};
    r.share_daemon = {{0, 1}};
    auto p = PlaceGang(r, two, f.needs, f.load);
    CHECK_FALSE(p.placed());
    CHECK_MESSAGE(p.why_not.find("p, q need 2.5 cpus on one daemon") != std::string::npos, p.why_not);
  }
  SUBCASE("together they do not fit") {
    GangRequest r;
    r.members = {Member("a", 1.5, 0), Member("b", 1.5, 0), Member("c", 1, 0)};  // 4 cpus of 4, but no way to pack them
    auto p = PlaceGang(r, two, f.needs, f.load);
    CHECK_FALSE(p.placed());
    CHECK_MESSAGE(p.why_not.find("do not fit the live daemons' free slots together") != std::string::npos, p.why_not);
  }
  SUBCASE("a group placed on a daemon that is not live") {
    GangRequest r;
    r.members = {Member("x", 1, 0, "ga")};
    r.pins["ga"] = DaemonId(7);
    auto p = PlaceGang(r, two, f.needs, f.load);
    CHECK_MESSAGE(p.why_not.find("affinity group ga was placed, and that daemon is not live") != std::string::npos, p.why_not);
  }
  SUBCASE("members that must share a daemon whose groups are placed apart") {
    GangRequest r;
    r.members = {Member("x", 1, 0, "ga"), Member("y", 1, 0, "gb")};
    r.share_daemon = {{0, 1}};
    r.pins = {{"ga", DaemonId(0)}, {"gb", DaemonId(1)}};
    auto p = PlaceGang(r, two, f.needs, f.load);
    CHECK_MESSAGE(p.why_not.find("groups are placed on two daemons") != std::string::npos, p.why_not);
  }
}

TEST_CASE("GangPlacement.AnInfeasibleGangOnALargeClusterCostsBoundedWork") {
  Fixture f;
  std::vector<GangDaemon> daemons;
  for (uint32_t i = 0; i < 300; ++i) daemons.push_back(Daemon(i, 1, 1));
  GangRequest r;
  for (int i = 0; i < 301; ++i) r.members.push_back(Member("m" + std::to_string(i), 0.5, 1));
  SUBCASE("more than the cluster has free in all is settled without a search") {
    auto p = PlaceGang(r, daemons, f.needs, f.load, /*max_steps=*/0);
    CHECK_MESSAGE(p.why_not.find("need 150.5 cpus and 301 gpus together, and the live daemons have 300 cpus and 300 gpus free") !=
                      std::string::npos,
                  p.why_not);
  }
  SUBCASE("alike daemons are tried once per step") {
    // 300 members of 0.6 cpus on 300 one-GPU daemons, and one more member needing a whole
    // daemon's cpu: in all they fit, but the big one fits nowhere beside a GPU member. The
    // search sees that at each level by trying one of the alike daemons, not all of them.
    r.members.back() = Member("big", 1, 0);
    for (auto& m : r.members) m.need.cpus = m.name == "big" ? 1 : 0.6;
    daemons.push_back(Daemon(300, 0.5, 0));
    auto p = PlaceGang(r, daemons, f.needs, f.load);
    CHECK_MESSAGE(p.why_not.find("do not fit") != std::string::npos, p.why_not);  // settled, not given up on
    daemons.back() = Daemon(300, 1, 0);
    CHECK(PlaceGang(r, daemons, f.needs, f.load).placed());
  }
  SUBCASE("past its budget the search gives up and says so") {
    // Two kinds of daemon (1 and 1.5 cpus) make the search tree grow as 2^depth: "big" fits
    // beside no GPU member, which only trying every mix would show.
    for (uint32_t i = 0; i < 300; i += 2) daemons[i] = Daemon(i, 1.5, 1);
    r.members.back() = Member("big", 1, 0);
    for (auto& m : r.members) m.need.cpus = m.name == "big" ? 1 : 0.6;
    auto capped = PlaceGang(r, daemons, f.needs, f.load, /*max_steps=*/50);
    CHECK_MESSAGE(capped.why_not.find("was found in 90651 steps") != std::string::npos, capped.why_not);  // 50 + 301 * 301
  }
}

TEST_CASE("GangPlacement.ADaemonWithTasksChainedAheadHasNothingToGive") {
  // Chained dispatch takes a slot ahead of time: d0's free count is below zero until its
  // running task ends. It must not count against what d1 has free.
  Fixture f;
  GangRequest r;
  r.members = {Member("a", 1, 0), Member("b", 1, 0)};
  GangDaemon chained{DaemonId(0), "", "", -1, 0, 1, 0};
  auto p = PlaceGang(r, {chained, Daemon(1, 2, 0)}, f.needs, f.load);
  REQUIRE_MESSAGE(p.placed(), p.why_not);
  CHECK(p.daemons == std::vector<DaemonId>{DaemonId(1), DaemonId(1)});
}

TEST_CASE("GangPlacement.ADaemonHoldingAPinThatMattersIsNotTakenForAnAlikeOne") {
  // Groups g and h share another gang that needs 2.5 cpus of one daemon if both are there; h
  // is pinned to d0. d0 and d1 look alike (2 cpus free of 2), but g cannot go to d0. The
  // search first puts "whole" on d1 (its input is there), finds no room for g, and must then
  // try d0 for "whole", not skip it as the same as d1.
  auto graph = testing::MustLoad(R"({"stages": [{"name": "gq", "program": "noop", "affinity": "g"},
                                               {"name": "hq", "program": "noop", "affinity": "h", "resources": {"cpus": 1.5}}],
                                    "edges": [{"from": "gq", "to": "hq", "channel": "stream"}]})");
  GangNeeds needs(*graph);
  LocalityPolicy locality{std::chrono::seconds(10)};
  GangRequest r;
  r.members = {Member("whole", 2, 0), Member("grouped", 1, 0, "g")};
  r.members[0].input_bytes[DaemonId(1)] = 1000;
  r.pins["h"] = DaemonId(0);
  auto p = PlaceGang(r, {Daemon(0, 2, 0), Daemon(1, 2, 0)}, needs, locality);
  REQUIRE_MESSAGE(p.placed(), p.why_not);
  CHECK(p.daemons == std::vector<DaemonId>{DaemonId(0), DaemonId(1)});
}

TEST_CASE("GangPlacement.AGroupIsNotPlacedWhereItsLargestVertexCannotRun") {
  auto graph = testing::MustLoad(R"({"stages": [{"name": "small", "program": "noop", "affinity": "g"},
                                               {"name": "big", "program": "noop", "affinity": "g", "resources": {"cpus": 3}}],
                                    "edges": [{"from": "small", "to": "big"}]})");
  GangNeeds needs(*graph);
  LoadPolicy load;
  GangRequest r;
  r.members = {Member("small", 1, 0, "g")};
  GangDaemon busy_but_big{DaemonId(2), "", "", 1, 0, 3, 0};  // 1 cpu free of 3
  auto p = PlaceGang(r, {Daemon(0, 2.5, 0), Daemon(1, 1.5, 0), busy_but_big}, needs, load);
  REQUIRE_MESSAGE(p.placed(), p.why_not);
  CHECK(p.daemons[0] == DaemonId(2));  // d0 has the most free cpus, but "big" could never run there
}

}  // namespace
}  // namespace copse::jm
