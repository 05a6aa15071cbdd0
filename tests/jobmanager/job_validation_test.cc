// One bad job file per error class; each asserts the JSON pointer and the message.
#include <doctest/doctest.h>

#include "tests/jobmanager/job_test_util.h"

namespace copse::jm {
namespace {
using testing::Load;

TEST_CASE("Validation.MalformedJsonNamesLineAndColumn") {
  auto load = Load("{\n  \"stages\": [\n    {\"name\": \"a\", \"program\": \"noop\",}\n  ]\n}");
  REQUIRE_FALSE(load.ok());
  CHECK_ERROR(load, "", "test.json:3:");
  CHECK_ERROR(load, "", "malformed JSON");
}

TEST_CASE("Validation.UnknownKeySuggestsTheClosestKnownOne") {
  auto load = Load(R"({"stages": [{"name": "a", "program": "noop", "replcas": 2}]})");
  CHECK_ERROR(load, "/stages/0/replcas", "did you mean \"replicas\"");
  auto top = Load(R"({"stages": [{"name": "a", "program": "noop"}], "edgez": []})");
  CHECK_ERROR(top, "/edgez", "did you mean \"edges\"");
}

TEST_CASE("Validation.WrongTypesNameTheExpectedType") {
  auto load = Load(R"({"stages": [{"name": "a", "program": 7, "replicas": "two", "params": []}]})");
  CHECK_ERROR(load, "/stages/0/program", "expected a string, got number");
  CHECK_ERROR(load, "/stages/0/replicas", "expected an integer, got string");
  CHECK_ERROR(load, "/stages/0/params", "expected an object, got array");
  auto zero = Load(R"({"stages": [{"name": "a", "program": "noop", "replicas": 0}]})");
  CHECK_ERROR(zero, "/stages/0/replicas", "expected an integer from 1");
  auto missing = Load(R"({"stages": [{"program": "noop"}]})");
  CHECK_ERROR(missing, "/stages/0", "missing required key \"name\"");
  auto no_stages = Load(R"({"name": "x"})");
  CHECK_ERROR(no_stages, "", "missing required key \"stages\"");
}

TEST_CASE("Validation.GpuMemoryNeedsGpus") {
  auto cpu_only = Load(R"({"stages": [{"name": "a", "program": "noop", "resources": {"gpu_memory_mb": 1000}}]})");
  CHECK_ERROR(cpu_only, "/stages/0/resources/gpu_memory_mb", "gpu_memory_mb needs gpus >= 1");
  auto negative = Load(R"({"stages": [{"name": "a", "program": "noop", "resources": {"gpus": 1, "gpu_memory_mb": -1}}]})");
  CHECK_ERROR(negative, "/stages/0/resources/gpu_memory_mb", "expected an integer from 0");
  CHECK(Load(R"({"stages": [{"name": "a", "program": "noop", "resources": {"gpus": 1, "gpu_memory_mb": 1000}}]})").ok());
}

TEST_CASE("Validation.PerReplicaParamsMayNotExpandBeyondTheirBound") {
  // 10 KB of params with "{replica}" over 400,000 replicas would be 4 GB of copies in the job
  // manager; the same params without it are shared, whatever the replicas.
  const std::string big(10'000, 'x');
  auto load = Load(R"({"stages": [{"name": "a", "program": "noop", "replicas": 400000,
                                   "params": {"p": "{replica})" +
                   big + R"("}}]})");
  CHECK_ERROR(load, "/stages/0/params", "copied for each replica: 400000 replicas of 10017 bytes");
  CHECK_ERROR(load, "/stages/0/params", "at most 256 MiB");
  auto shared = Load(R"({"stages": [{"name": "a", "program": "noop", "replicas": 400000,
                                     "params": {"p": ")" +
                     big + R"("}}]})");
  CHECK(shared.ok());
}

TEST_CASE("Validation.UnknownProgramIsReportedWithASuggestion") {
  auto load = Load(R"({"stages": [{"name": "a", "program": "checksun"}]})");
  CHECK_ERROR(load, "/stages/0/program", "unknown program \"checksun\"; did you mean \"checksum\"");
}

TEST_CASE("Validation.DanglingAndDuplicateNames") {
  auto dangling = Load(R"({"stages": [{"name": "read", "program": "noop"}, {"name": "count", "program": "noop"}],
                           "edges": [{"from": "read", "to": "cuont"}]})");
  CHECK_ERROR(dangling, "/edges/0/to", "no stage named \"cuont\"; did you mean \"count\"");
  auto dup = Load(R"({"stages": [{"name": "a", "program": "noop"}, {"name": "a", "program": "noop"}]})");
  CHECK_ERROR(dup, "/stages/1/name", "duplicate stage name \"a\" (first defined at /stages/0)");
  auto range = Load(R"({"stages": [{"name": "a", "program": "noop", "replicas": 2}, {"name": "b", "program": "noop"}],
                        "edges": [{"from": "a[2]", "to": "b"}]})");
  CHECK_ERROR(range, "/edges/0/from", "\"a[2]\" is out of range: stage \"a\" has 2 replica(s)");
  auto badref = Load(R"({"stages": [{"name": "a", "program": "noop"}], "edges": [{"from": "a[x]", "to": "a"}]})");
  CHECK_ERROR(badref, "/edges/0/from", "expected a stage name or a vertex name like \"stage[3]\"");
}

TEST_CASE("Validation.ReplicaAndPatternMismatches") {
  auto no_pattern =
      Load(R"({"stages": [{"name": "a", "program": "noop", "replicas": 4}, {"name": "b", "program": "noop", "replicas": 2}],
                             "edges": [{"from": "a", "to": "b"}]})");
  CHECK_ERROR(no_pattern, "/edges/0", "give a \"pattern\"");
  auto pointwise =
      Load(R"({"stages": [{"name": "a", "program": "noop", "replicas": 4}, {"name": "b", "program": "noop", "replicas": 2}],
                            "edges": [{"from": "a", "to": "b", "pattern": "pointwise"}]})");
  CHECK_ERROR(pointwise, "/edges/0/pattern", "needs equal counts");
  auto broadcast =
      Load(R"({"stages": [{"name": "a", "program": "noop", "replicas": 2}, {"name": "b", "program": "noop", "replicas": 2}],
                            "edges": [{"from": "a", "to": "b", "pattern": "broadcast"}]})");
  CHECK_ERROR(broadcast, "/edges/0/pattern", "broadcast sends one vertex's output");
  auto gather =
      Load(R"({"stages": [{"name": "a", "program": "noop", "replicas": 2}, {"name": "b", "program": "noop", "replicas": 2}],
                         "edges": [{"from": "a", "to": "b", "pattern": "gather"}]})");
  CHECK_ERROR(gather, "/edges/0/pattern", "gather collects into one vertex");
  auto unknown = Load(R"({"stages": [{"name": "a", "program": "noop"}, {"name": "b", "program": "noop"}],
                          "edges": [{"from": "a", "to": "b", "pattern": "all-to-all", "channel": "tcp"}]})");
  CHECK_ERROR(unknown, "/edges/0/pattern", "did you mean \"all_to_all\"");
  CHECK_ERROR(unknown, "/edges/0/channel", "unknown channel kind \"tcp\"");
}

TEST_CASE("Validation.CycleIsPrintedInEdgeDirection") {
  auto load =
      Load(R"({"stages": [{"name": "a", "program": "noop"}, {"name": "b", "program": "noop"}, {"name": "c", "program": "noop"}],
                       "edges": [{"from": "a", "to": "b"}, {"from": "b", "to": "c"}, {"from": "c", "to": "a"}]})");
  REQUIRE_FALSE(load.ok());
  REQUIRE(load.diags.size() == 1);
  const auto& d = load.diags.items()[0];
  CHECK(d.message.find("cycle") != std::string::npos);
  // Every rotation of a -> b -> c -> a is the same cycle; check the edges appear in order.
  bool ok = d.message.find("a[0] -> b[0] -> c[0] -> a[0]") != std::string::npos ||
            d.message.find("b[0] -> c[0] -> a[0] -> b[0]") != std::string::npos ||
            d.message.find("c[0] -> a[0] -> b[0] -> c[0]") != std::string::npos;
  CHECK_MESSAGE(ok, d.message);
  CHECK(d.pointer.rfind("/edges/", 0) == 0);
}

TEST_CASE("Validation.GangThatWaitsOnItselfIsACycle") {
  // b streams from a, but also needs a's file output: a cannot finish before b reads it.
  auto load = Load(R"({"stages": [{"name": "a", "program": "noop"}, {"name": "b", "program": "noop"}],
                       "edges": [{"from": "a", "to": "b", "channel": "stream"}, {"from": "a", "to": "b", "channel": "file"}]})");
  CHECK_ERROR(load, "/edges/1", "both run at once in one gang");
}

TEST_CASE("Validation.ShmEndsPinnedToDifferentDaemonsAreRejected") {
  auto load = Load(R"({"stages": [{"name": "a", "program": "noop", "affinity": "left"},
                                  {"name": "b", "program": "noop", "affinity": "right"}],
                       "edges": [{"from": "a", "to": "b", "channel": "shm"}]})");
  CHECK_ERROR(load, "/edges/0/channel", "shm ends must share a daemon");
  auto nccl = Load(R"({"stages": [{"name": "a", "program": "noop"}, {"name": "b", "program": "noop"}],
                       "edges": [{"from": "a", "to": "b", "channel": "nccl"}]})");
  CHECK_ERROR(nccl, "/edges/0/channel", "an nccl channel joins GPUs");
}

TEST_CASE("Validation.FaultsMustNameExistingVertices") {
  auto load = Load(R"({"stages": [{"name": "count", "program": "noop", "replicas": 2}],
                       "faults": [{"kill_daemon_of": "count[5]"}, {"fail": "cuont[0]", "attempts": [1, 2]},
                                  {"delay": "count[0]"}, {"fail": "count[0]", "ms": 3},
                                  {"kill_daemon": "d0", "when": {"completed": 1, "after_ms": 2}}, {"kill_daemon": ""}]})");
  CHECK_ERROR(load, "/faults/0/kill_daemon_of", "out of range");
  CHECK_ERROR(load, "/faults/1/fail", "did you mean \"count\"");
  CHECK_ERROR(load, "/faults/2", "missing required key \"ms\"");
  CHECK_ERROR(load, "/faults/3/ms", "belongs to a \"delay\" fault only");
  CHECK_ERROR(load, "/faults/4/when", "not both");
  CHECK_ERROR(load, "/faults/5/kill_daemon", "a daemon needs a name");  // as a daemon's --name would be told
}

TEST_CASE("Validation.OutputsNameOneVertexAndAPathInside") {
  auto load = Load(R"({"stages": [{"name": "count", "program": "noop", "replicas": 2}],
                       "outputs": [{"from": "count", "path": "a.txt"}, {"from": "count[0]", "path": "../x"},
                                   {"from": "count[1]", "path": "a.txt"}]})");
  CHECK_ERROR(load, "/outputs/0/from", "name one vertex, like \"count[0]\"");
  CHECK_ERROR(load, "/outputs/1/path", "expected a relative path");
  CHECK_ERROR(load, "/outputs/2/path", "already written by /outputs/0");
}

TEST_CASE("Validation.ReportsEveryErrorNotOnlyTheFirst") {
  auto load = Load(R"({"version": 2, "stages": [{"name": "a", "program": "nope"}, {"name": "b", "program": "noop", "colour": 1}],
                       "edges": [{"from": "a", "to": "zz"}]})");
  CHECK(load.diags.size() >= 4);
  CHECK_ERROR(load, "/version", "unsupported version 2");
}

TEST_CASE("Validation.RetainAndInputHostsAreTypeChecked") {
  auto load = Load(R"({"stages": [{"name": "a", "program": "noop", "replicas": 3, "retain": "yes",
                                  "input_hosts": ["h0", "h1"]}]})");
  CHECK_ERROR(load, "/stages/0/retain", "expected true, false or an array of output ports, got string");
  auto negative = Load(R"({"stages": [{"name": "a", "program": "noop", "retain": [0, -1]}]})");
  CHECK_ERROR(negative, "/stages/0/retain/1", "expected an output port (0 to 65535), got -1");  // which element
  CHECK_ERROR(load, "/stages/0/input_hosts", "an array of 3 host names, one per replica");
  auto ok = Load(R"({"stages": [{"name": "a", "program": "noop", "replicas": 3, "retain": true,
                                "input_hosts": "node-{replica}"}]})");
  CHECK(ok.ok());
}

TEST_CASE("Validation.AnOutputPortIsOneKindOfChannel") {
  auto mixed = Load(R"({"stages": [{"name": "a", "program": "noop"}, {"name": "b", "program": "noop"},
                                   {"name": "c", "program": "noop"}],
                        "edges": [{"from": "a", "from_port": 0, "to": "b", "channel": "durable"},
                                  {"from": "a", "from_port": 0, "to": "c", "channel": "memory"}]})");
  CHECK_ERROR(mixed, "/edges/1/channel", "output port 0 of a[0] is already a durable channel (/edges/0), not memory");
  auto dir = Load(R"({"durable_dir": "", "stages": [{"name": "a", "program": "noop"}]})");
  CHECK_ERROR(dir, "/durable_dir", "expected a directory");
  auto kind = Load(R"({"stages": [{"name": "a", "program": "noop"}, {"name": "b", "program": "noop"}],
                       "edges": [{"from": "a", "to": "b", "channel": "durabel"}]})");
  CHECK_ERROR(kind, "/edges/0/channel", "did you mean \"durable\"");
}

TEST_CASE("Validation.ExplicitPortsMustBeDenseAndUnique") {
  auto load =
      Load(R"({"stages": [{"name": "a", "program": "noop"}, {"name": "b", "program": "noop"}, {"name": "c", "program": "noop"}],
                       "edges": [{"from": "a", "to": "c", "to_port": 0}, {"from": "b", "to": "c", "to_port": 0}]})");
  CHECK_ERROR(load, "/edges/1/to_port", "already fed by another channel");
  auto gap = Load(R"({"stages": [{"name": "a", "program": "noop"}, {"name": "c", "program": "noop"}],
                      "edges": [{"from": "a", "to": "c", "to_port": 3}]})");
  CHECK_ERROR(gap, "/edges/0/to_port", "leaves a gap");
}

TEST_CASE("Validation.HugeNamesAndNumbersAreErrorsNotCrashes") {
  // A 100,000-character name once overflowed the stack of the regex that checked it.
  const std::string long_name(100'000, 'a');
  CHECK(Load(R"({"stages": [{"name": ")" + long_name + R"(", "program": "noop"}]})").ok());
  auto bad = Load(R"({"stages": [{"name": ")" + long_name + R"(!", "program": "noop"}]})");
  CHECK_ERROR(bad, "/stages/0/name", "");
  CHECK_FALSE(bad.ok());
  // A float beyond int64 was converted anyway and reported as -9223372036854775808.
  auto huge = Load(R"({"stages": [{"name": "a", "program": "noop", "replicas": 1e300}]})");
  CHECK_ERROR(huge, "/stages/0/replicas", "expected an integer from 1 to 10000000, got 1e+300");
  auto edge = Load(R"({"stages": [{"name": "a", "program": "noop"}, {"name": "b", "program": "noop"}],
                       "edges": [{"from": "a", "to": "b", "from_port": 9.3e18}]})");
  CHECK_ERROR(edge, "/edges/0/from_port", "got 9.3e+18");
}

TEST_CASE("Validation.AVertexFeedingItselfIsAnError") {
  // Placed, it would wait on itself for ever; a live self-edge used to pass.
  auto live = Load(R"({"stages": [{"name": "a", "program": "noop"}], "edges": [{"from": "a", "to": "a", "channel": "stream"}]})");
  CHECK_ERROR(live, "/edges/0", "a[0] cannot read its own output (a stream channel from it to itself)");
  auto file = Load(R"({"stages": [{"name": "a", "program": "noop"}], "edges": [{"from": "a", "to": "a"}]})");
  CHECK_ERROR(file, "/edges/0", "a[0] cannot wait for itself to complete (a file channel from it to itself)");
  CHECK(file.diags.size() == 1);
  auto order = Load(R"({"stages": [{"name": "a", "program": "noop"}], "edges": [{"from": "a", "to": "a", "channel": "order"}]})");
  CHECK_ERROR(order, "/edges/0", "a[0] cannot wait for itself to complete (an order channel from it to itself)");
}

TEST_CASE("Validation.PinnedOutputPortsAreBoundedOverTheJob") {
  // Every replica's outputs below a pinned from_port exist: 100,000 x 65,536 of them was
  // billions of allocations, ending in bad_alloc.
  auto wide = Load(
      R"({"stages": [{"name": "a", "program": "noop", "replicas": 100000}, {"name": "b", "program": "noop", "replicas": 100000}],
                       "edges": [{"from": "a", "to": "b", "from_port": 65535}]})");
  CHECK_ERROR(wide, "/edges", "the job's vertices have 6553600000 output ports");
  auto narrow =
      Load(R"({"stages": [{"name": "a", "program": "noop", "replicas": 10}, {"name": "b", "program": "noop", "replicas": 10}],
                         "edges": [{"from": "a", "to": "b", "from_port": 65535}]})");
  CHECK(narrow.ok());
}

}  // namespace
}  // namespace copse::jm
