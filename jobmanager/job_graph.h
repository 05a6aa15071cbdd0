#pragma once
// JobGraph: a JobSpec expanded into the vertices and channels the scheduler runs.
//
// Expansion rules (../shared/INTERFACE.md):
//   * stage S with R replicas -> vertices S[0] … S[R-1]; ids are dense, stage by stage.
//   * an edge joins its endpoints' vertices by its pattern; each data channel gets a new input
//     port on the consumer and an output port on the producer, numbered in edge order and
//     replica order (broadcast shares one output port among all its consumers).
//   * `order` edges add dependencies without ports.
//   * live channels (stream, shm, nccl) join their ends into a gang: placed and restarted as one.
// A JobGraph is immutable once built and safe to share between threads.
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "common/ids.h"
#include "jobmanager/diagnostics.h"
#include "jobmanager/job_spec.h"

namespace copse::jm {

struct ChannelEdge {
  ChannelId id;
  ChannelKind kind;
  VertexId from;
  int from_port = -1;  // -1 for order edges
  VertexId to;
  int to_port = -1;
  int edge = -1;  // index into JobSpec::edges
};

struct VertexNode {
  VertexId id;
  int stage = 0;  // index into JobSpec::stages
  int replica = 0;
  std::string name;  // "stage[replica]"
  /// The stage's params as JSON text (what tasks carry), with {replica} substituted; shared
  /// by the replicas of a stage whose params do not name {replica}.
  std::shared_ptr<const std::string> params;
  std::vector<ChannelId> inputs;                // data channels by input port
  std::vector<std::vector<ChannelId>> outputs;  // per output port, the channels that read it
  std::vector<ChannelId> order_in;              // order edges into this vertex
  std::vector<ChannelId> order_out;
  GangId gang;  // valid only for members of a gang of two or more
};

struct Gang {
  GangId id;
  std::vector<VertexId> members;  // ascending ids
};

class JobGraph {
 public:
  /// Expands `spec`, reporting every cross-reference and structural error to `diags`.
  /// Returns null when any error was found.
  static std::shared_ptr<const JobGraph> Build(std::shared_ptr<const JobSpec> spec, Diagnostics& diags);

  const JobSpec& spec() const { return *spec_; }
  std::shared_ptr<const JobSpec> spec_ptr() const { return spec_; }
  const std::vector<VertexNode>& vertices() const { return vertices_; }
  const VertexNode& vertex(VertexId id) const { return vertices_[id.value()]; }
  const std::vector<ChannelEdge>& channels() const { return channels_; }
  const ChannelEdge& channel(ChannelId id) const { return channels_[id.value()]; }
  const std::vector<Gang>& gangs() const { return gangs_; }
  const StageSpec& stage_of(VertexId id) const { return spec_->stages[vertices_[id.value()].stage]; }
  /// First vertex id of each stage; vertices of stage s are [stage_base(s), stage_base(s) + replicas).
  VertexId stage_base(int stage) const { return VertexId(stage_base_[stage]); }

  /// Every vertex once, producers before consumers; a gang's members are adjacent.
  const std::vector<VertexId>& topological_order() const { return topo_; }
  /// Vertices on the longest dependency path (a gang counts its longest live-channel path).
  size_t longest_path() const { return longest_path_; }
  /// Number of channels of each kind.
  std::vector<size_t> ChannelCounts() const;
  /// The graph by stage (what the dashboard draws): each (from stage, to stage) pair the edges
  /// join once, with the kind of its first edge, in the job file's order. Made once, at Build.
  struct StageEdge {
    int from, to;
    ChannelKind kind;
  };
  const std::vector<StageEdge>& stage_edges() const { return stage_edges_; }

  /// The vertex called "stage[i]", or "stage" for a one-replica stage; Invalid when none.
  VertexId FindVertex(std::string_view name) const;
  int FindStage(std::string_view name) const;

  /// {"vertices","channels","channels_by_kind","gangs","stages","longest_path"}.
  Json Summary() const;
  /// Graphviz DOT of the expanded graph; gangs drawn as clusters.
  std::string ToDot() const;

 private:
  JobGraph() = default;
  class Builder;

  std::shared_ptr<const JobSpec> spec_;
  std::vector<VertexNode> vertices_;
  std::vector<ChannelEdge> channels_;
  std::vector<Gang> gangs_;
  std::vector<uint32_t> stage_base_;
  std::unordered_map<std::string, int> stage_index_;
  std::vector<VertexId> topo_;
  size_t longest_path_ = 0;
  std::vector<StageEdge> stage_edges_;
};

}  // namespace copse::jm
