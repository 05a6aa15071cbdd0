// Expansion of stages x patterns into vertices, channels, ports and gangs, checked against
// hand-counted graphs.
#include <doctest/doctest.h>

#include <algorithm>

#include "tests/jobmanager/job_test_util.h"

namespace copse::jm {
namespace {
using testing::MustLoad;

std::string TwoStages(int a, int b, const std::string& edge) {
  return R"({"stages": [{"name": "a", "program": "noop", "replicas": )" + std::to_string(a) +
         R"(}, {"name": "b", "program": "noop", "replicas": )" + std::to_string(b) + R"(}], "edges": [)" + edge + "]}";
}

TEST_CASE("Graph.PointwiseJoinsReplicaIToReplicaI") {
  auto g = MustLoad(TwoStages(3, 3, R"({"from": "a", "to": "b"})"));
  CHECK(g->vertices().size() == 6);
  REQUIRE(g->channels().size() == 3);
  for (int i = 0; i < 3; ++i) {
    const auto& ch = g->channels()[i];
    CHECK(g->vertex(ch.from).name == "a[" + std::to_string(i) + "]");
    CHECK(g->vertex(ch.to).name == "b[" + std::to_string(i) + "]");
    CHECK(ch.from_port == 0);
    CHECK(ch.to_port == 0);
  }
  CHECK(g->longest_path() == 2);
}

TEST_CASE("Graph.AllToAllGivesEveryProducerAPortPerConsumer") {
  auto g = MustLoad(TwoStages(4, 2, R"({"from": "a", "to": "b", "pattern": "all_to_all", "channel": "memory"})"));
  CHECK(g->vertices().size() == 6);
  CHECK(g->channels().size() == 8);
  for (int i = 0; i < 4; ++i) CHECK(g->vertex(VertexId(i)).outputs.size() == 2);
  const auto& b1 = g->vertex(g->FindVertex("b[1]"));
  REQUIRE(b1.inputs.size() == 4);
  for (int p = 0; p < 4; ++p) {
    const auto& ch = g->channel(b1.inputs[p]);
    CHECK(g->vertex(ch.from).name == "a[" + std::to_string(p) + "]");  // replicas in index order
    CHECK(ch.from_port == 1);                                          // b[1] is each producer's 2nd output
    CHECK(ch.kind == ChannelKind::kMemory);
  }
}

TEST_CASE("Graph.BroadcastSharesOneOutputPort") {
  auto g = MustLoad(TwoStages(1, 5, R"({"from": "a", "to": "b", "pattern": "broadcast"})"));
  CHECK(g->channels().size() == 5);
  const auto& a = g->vertex(VertexId(0));
  REQUIRE(a.outputs.size() == 1);
  CHECK(a.outputs[0].size() == 5);
}

TEST_CASE("Graph.GatherNumbersInputsByReplica") {
  auto g = MustLoad(TwoStages(3, 1, R"({"from": "a", "to": "b", "pattern": "gather"})"));
  const auto& b = g->vertex(g->FindVertex("b"));
  REQUIRE(b.inputs.size() == 3);
  for (int p = 0; p < 3; ++p) CHECK(g->channel(b.inputs[p]).from.value() == static_cast<uint32_t>(p));
}

TEST_CASE("Graph.InputsAreNumberedInEdgeOrderAndOrderEdgesTakeNoPorts") {
  auto g = MustLoad(R"({"stages": [{"name": "x", "program": "noop"}, {"name": "y", "program": "noop", "replicas": 2},
                                   {"name": "z", "program": "noop"}],
                        "edges": [{"from": "y", "to": "z", "pattern": "gather"}, {"from": "x", "to": "z"},
                                  {"from": "x", "to": "y[1]", "channel": "order"}]})");
  CHECK(g->vertices().size() == 4);
  CHECK(g->channels().size() == 4);
  const auto& z = g->vertex(g->FindVertex("z"));
  REQUIRE(z.inputs.size() == 3);
  CHECK(g->vertex(g->channel(z.inputs[0]).from).name == "y[0]");
  CHECK(g->vertex(g->channel(z.inputs[1]).from).name == "y[1]");
  CHECK(g->vertex(g->channel(z.inputs[2]).from).name == "x[0]");
  const auto& y1 = g->vertex(g->FindVertex("y[1]"));
  CHECK(y1.inputs.empty());
  CHECK(y1.order_in.size() == 1);
  CHECK(g->longest_path() == 3);  // x -> y[1] -> z
}

TEST_CASE("Graph.ExplicitPortsAreHonouredAndAutoPortsFillTheRest") {
  auto g = MustLoad(
      R"({"stages": [{"name": "a", "program": "noop"}, {"name": "b", "program": "noop"}, {"name": "c", "program": "noop"}],
                        "edges": [{"from": "a", "to": "c"}, {"from": "b", "to": "c", "to_port": 0}]})");
  const auto& c = g->vertex(g->FindVertex("c"));
  REQUIRE(c.inputs.size() == 2);
  CHECK(g->vertex(g->channel(c.inputs[0]).from).name == "b[0]");
  CHECK(g->vertex(g->channel(c.inputs[1]).from).name == "a[0]");
}

TEST_CASE("Graph.ReplicaPlaceholderIsSubstitutedInParams") {
  auto g = MustLoad(R"({"stages": [{"name": "read", "program": "noop", "replicas": 3,
                                    "params": {"path": "data/part-{replica}.txt", "nested": ["{replica}", 5]}}]})");
  const Json params2 = Json::parse(*g->vertex(VertexId(2)).params), params1 = Json::parse(*g->vertex(VertexId(1)).params);
  CHECK(params2["path"] == "data/part-2.txt");
  CHECK(params1["nested"][0] == "1");
  CHECK(params1["nested"][1] == 5);
}

TEST_CASE("Graph.LiveChannelsFormGangsIncludingRings") {
  auto g = MustLoad(R"({"stages": [{"name": "src", "program": "noop"}, {"name": "p", "program": "noop", "replicas": 3},
                                   {"name": "ring", "program": "noop", "replicas": 2}],
                        "edges": [{"from": "src", "to": "p[0]", "channel": "stream"},
                                  {"from": "p[0]", "to": "p[1]", "channel": "shm"},
                                  {"from": "p[1]", "to": "p[2]", "channel": "stream"},
                                  {"from": "ring[0]", "to": "ring[1]", "channel": "stream"},
                                  {"from": "ring[1]", "to": "ring[0]", "channel": "stream"},
                                  {"from": "p[2]", "to": "ring[0]", "channel": "file"}]})");
  REQUIRE(g->gangs().size() == 2);
  CHECK(g->gangs()[0].members.size() == 4);
  CHECK(g->gangs()[1].members.size() == 2);
  // Topological order keeps gangs together and producers first.
  const auto& order = g->topological_order();
  REQUIRE(order.size() == 6);
  auto pos = [&](const char* name) { return std::find(order.begin(), order.end(), g->FindVertex(name)) - order.begin(); };
  CHECK(pos("p[2]") < pos("ring[0]"));
  CHECK(g->Summary()["gangs"] == 2);
}

TEST_CASE("Graph.WordCountExampleCounts") {
  auto g = MustLoad(R"({"stages": [{"name": "read", "program": "text.read_lines", "replicas": 4},
                                   {"name": "count", "program": "text.count_words", "replicas": 2},
                                   {"name": "merge", "program": "text.merge_counts"}],
                        "edges": [{"from": "read", "to": "count", "pattern": "all_to_all", "channel": "memory"},
                                  {"from": "count", "to": "merge", "pattern": "gather"}],
                        "outputs": [{"from": "merge", "path": "counts.txt"}]})");
  CHECK(g->vertices().size() == 7);
  CHECK(g->channels().size() == 4 * 2 + 2);
  CHECK(g->vertex(g->FindVertex("merge")).outputs.size() == 1);  // declared by outputs
  CHECK(g->longest_path() == 3);
  auto counts = g->ChannelCounts();
  CHECK(counts[static_cast<size_t>(ChannelKind::kMemory)] == 8);
  CHECK(counts[static_cast<size_t>(ChannelKind::kFile)] == 2);
  std::string dot = g->ToDot();
  CHECK(dot.find("\"read[3]\" -> \"count[1]\" [label=\"memory\"]") != std::string::npos);
}

}  // namespace
}  // namespace copse::jm
