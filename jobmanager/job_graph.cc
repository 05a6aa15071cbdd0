#include "jobmanager/job_graph.h"

#include <algorithm>
#include <numeric>
#include <optional>
#include <set>
#include <sstream>

#include "common/json_util.h"
#include "common/text_util.h"
#include "jobmanager/disjoint_sets.h"

namespace copse::jm {
namespace {

constexpr size_t kMaxChannels = 50'000'000;
// Per-replica params (text, summed over the job): a 10 KB job file must not expand to gigabytes.
constexpr uint64_t kMaxExpandedParamsBytes = uint64_t{256} << 20;
/// Output ports over all vertices, gaps included: a pinned `from_port` (or an `outputs` port)
/// of 65535 on every replica of a wide stage would otherwise allocate billions of them.
constexpr uint64_t kMaxOutputPorts = 50'000'000;

bool ContainsReplicaPlaceholder(const Json& j) {
  if (j.is_string()) return j.get_ref<const std::string&>().find("{replica}") != std::string::npos;
  if (j.is_structured()) {
    for (const auto& v : j) {
      if (ContainsReplicaPlaceholder(v)) return true;
    }
  }
  return false;
}

void SubstituteReplica(Json& j, const std::string& replica) {
  if (j.is_string()) {
    j = ReplaceAll(j.get<std::string>(), "{replica}", replica);
  } else if (j.is_structured()) {
    for (auto& v : j) SubstituteReplica(v, replica);
  }
}

/// A directed graph in compressed sparse rows, for Kahn's algorithm and cycle finding.
struct Csr {
  std::vector<uint32_t> offsets, targets;
  static Csr Make(size_t n, const std::vector<std::pair<uint32_t, uint32_t>>& edges, bool reverse) {
    Csr c;
    c.offsets.assign(n + 1, 0);
    for (auto [a, b] : edges) ++c.offsets[(reverse ? b : a) + 1];
    std::partial_sum(c.offsets.begin(), c.offsets.end(), c.offsets.begin());
    c.targets.resize(edges.size());
    std::vector<uint32_t> pos(c.offsets.begin(), c.offsets.end() - 1);
    for (auto [a, b] : edges) c.targets[pos[reverse ? b : a]++] = reverse ? a : b;
    return c;
  }
};

/// Kahn's algorithm over the nodes flagged in `is_node`; returns them in topological order.
/// Fewer nodes than flagged means a cycle among the rest.
std::vector<uint32_t> KahnOrder(const Csr& out, const std::vector<char>& is_node) {
  size_t n = is_node.size();
  std::vector<uint32_t> indeg(n, 0);
  for (size_t v = 0; v < n; ++v) {
    for (uint32_t i = out.offsets[v]; i < out.offsets[v + 1]; ++i) ++indeg[out.targets[i]];
  }
  std::vector<uint32_t> order;
  order.reserve(n);
  for (uint32_t v = 0; v < n; ++v) {
    if (is_node[v] && indeg[v] == 0) order.push_back(v);
  }
  for (size_t head = 0; head < order.size(); ++head) {
    uint32_t v = order[head];
    for (uint32_t i = out.offsets[v]; i < out.offsets[v + 1]; ++i) {
      if (--indeg[out.targets[i]] == 0) order.push_back(out.targets[i]);
    }
  }
  return order;
}

}  // namespace

class JobGraph::Builder {
 public:
  Builder(JobGraph& g, Diagnostics& diags) : g_(g), diags_(diags), spec_(*g.spec_) {}

  void Run() {
    IndexStages();
    ExpandVertices();
    ExpandEdges();
    if (channels_overflow_) return;
    AssignPorts();
    ApplyOutputs();
    CheckFaults();
    FormGangs();
    OrderAndCheckCycles();
  }

 private:
  struct InRequest {
    std::optional<int> port;
    ChannelId channel;
  };
  struct OutRequest {
    std::optional<int> port;
    std::vector<ChannelId> channels;
  };

  void IndexStages() {
    for (size_t i = 0; i < spec_.stages.size(); ++i) {
      const auto& s = spec_.stages[i];
      if (s.name.empty()) continue;
      auto [it, inserted] = g_.stage_index_.emplace(s.name, static_cast<int>(i));
      if (!inserted) {
        diags_.Error(PointerAppend(s.pointer, "name"),
                     "duplicate stage name \"" + s.name + "\" (first defined at " + spec_.stages[it->second].pointer + ")");
      }
    }
  }

  void ExpandVertices() {
    uint64_t total = 0;
    g_.stage_base_.reserve(spec_.stages.size());
    for (const auto& s : spec_.stages) {
      g_.stage_base_.push_back(static_cast<uint32_t>(total));
      total += static_cast<uint64_t>(s.replicas);
    }
    if (total > 50'000'000) {
      diags_.Error("/stages", "the job expands to " + std::to_string(total) + " vertices; at most 50,000,000 are supported");
      g_.stage_base_.clear();
      return;
    }
    // Per-replica params are copied per vertex: bound what that copying makes.
    std::vector<char> per_replica(spec_.stages.size(), 0);
    uint64_t expanded = 0;
    for (size_t si = 0; si < spec_.stages.size(); ++si) {
      const auto& s = spec_.stages[si];
      per_replica[si] = ContainsReplicaPlaceholder(s.params);
      if (!per_replica[si]) continue;
      const uint64_t each = DumpJson(s.params).size();
      expanded += each * static_cast<uint64_t>(s.replicas);
      if (expanded > kMaxExpandedParamsBytes) {
        diags_.Error(
            "/stages/" + std::to_string(si) + "/params",
            "params holding \"{replica}\" are copied for each replica: " + std::to_string(s.replicas) + " replicas of " +
                std::to_string(each) + " bytes bring the job's copies to " + std::to_string(expanded >> 20) + " MiB; at most " +
                std::to_string(kMaxExpandedParamsBytes >> 20) +
                " MiB are supported (keep what does not vary with the replica in params without \"{replica}\", or in a file)");
        g_.stage_base_.clear();
        return;
      }
    }
    g_.vertices_.resize(total);
    for (size_t si = 0; si < spec_.stages.size(); ++si) {
      const auto& s = spec_.stages[si];
      auto shared = per_replica[si] ? nullptr : std::make_shared<const std::string>(DumpJson(s.params));
      for (int r = 0; r < s.replicas; ++r) {
        uint32_t id = g_.stage_base_[si] + static_cast<uint32_t>(r);
        VertexNode& v = g_.vertices_[id];
        v.id = VertexId(id);
        v.stage = static_cast<int>(si);
        v.replica = r;
        v.name = s.name + "[" + std::to_string(r) + "]";
        if (per_replica[si]) {
          Json p = s.params;
          SubstituteReplica(p, std::to_string(r));
          v.params = std::make_shared<const std::string>(DumpJson(p));
        } else {
          v.params = shared;
        }
      }
    }
    in_req_.resize(total);
    out_req_.resize(total);
  }

  /// The vertices an endpoint names, or nullopt after reporting why it names none.
  std::optional<std::vector<VertexId>> Resolve(const EndpointRef& ref, const std::string& ptr) {
    if (ref.stage.empty()) return std::nullopt;  // already reported by the parser
    auto it = g_.stage_index_.find(ref.stage);
    if (it == g_.stage_index_.end()) {
      std::vector<std::string> names;
      for (const auto& s : spec_.stages) names.push_back(s.name);
      std::string msg = "no stage named \"" + ref.stage + "\"";
      if (auto guess = DidYouMean(ref.stage, names); !guess.empty()) msg += "; did you mean \"" + guess + "\"?";
      diags_.Error(ptr, msg);
      return std::nullopt;
    }
    if (g_.stage_base_.empty()) return std::nullopt;
    const auto& s = spec_.stages[it->second];
    uint32_t base = g_.stage_base_[it->second];
    if (ref.replica) {
      if (*ref.replica >= s.replicas) {
        diags_.Error(ptr, "\"" + ref.ToString() + "\" is out of range: stage \"" + s.name + "\" has " +
                              std::to_string(s.replicas) + " replica(s), indexed from 0");
        return std::nullopt;
      }
      return std::vector<VertexId>{VertexId(base + *ref.replica)};
    }
    std::vector<VertexId> out(s.replicas);
    for (int r = 0; r < s.replicas; ++r) out[r] = VertexId(base + r);
    return out;
  }

  /// The single vertex an endpoint names (a one-replica stage or "stage[i]").
  std::optional<VertexId> ResolveOne(const EndpointRef& ref, const std::string& ptr) {
    auto set = Resolve(ref, ptr);
    if (!set) return std::nullopt;
    if (set->size() != 1) {
      diags_.Error(ptr, "\"" + ref.stage + "\" has " + std::to_string(set->size()) + " replicas; name one vertex, like \"" +
                            ref.stage + "[0]\"");
      return std::nullopt;
    }
    return set->front();
  }

  ChannelId NewChannel(ChannelKind kind, VertexId from, VertexId to, int edge) {
    ChannelId id(static_cast<uint32_t>(g_.channels_.size()));
    g_.channels_.push_back({id, kind, from, -1, to, -1, edge});
    return id;
  }

  void ExpandEdges() {
    for (size_t ei = 0; ei < spec_.edges.size(); ++ei) {
      const EdgeSpec& e = spec_.edges[ei];
      auto producers = Resolve(e.from, PointerAppend(e.pointer, "from"));
      auto consumers = Resolve(e.to, PointerAppend(e.pointer, "to"));
      if (!producers || !consumers) continue;
      size_t np = producers->size(), nc = consumers->size();
      EdgePattern pattern;
      if (e.pattern) {
        pattern = *e.pattern;
      } else if (np == nc) {
        pattern = EdgePattern::kPointwise;
      } else {
        diags_.Error(e.pointer, "\"" + e.from.ToString() + "\" has " + std::to_string(np) + " vertices and \"" + e.to.ToString() +
                                    "\" has " + std::to_string(nc) +
                                    "; give a \"pattern\": all_to_all, broadcast (from 1) or gather (into 1)");
        continue;
      }
      std::string pattern_ptr = e.pattern ? PointerAppend(e.pointer, "pattern") : e.pointer;
      size_t count = 0;
      switch (pattern) {
        case EdgePattern::kPointwise:
          if (np != nc) {
            diags_.Error(pattern_ptr, "pointwise joins replica i to replica i and needs equal counts; \"" + e.from.ToString() +
                                          "\" has " + std::to_string(np) + ", \"" + e.to.ToString() + "\" has " +
                                          std::to_string(nc));
            continue;
          }
          count = np;
          break;
        case EdgePattern::kAllToAll: count = np * nc; break;
        case EdgePattern::kBroadcast:
          if (np != 1) {
            diags_.Error(pattern_ptr, "broadcast sends one vertex's output to every consumer, but \"" + e.from.ToString() +
                                          "\" has " + std::to_string(np) + " vertices; name one, like \"" + e.from.stage +
                                          "[0]\"");
            continue;
          }
          count = nc;
          break;
        case EdgePattern::kGather:
          if (nc != 1) {
            diags_.Error(pattern_ptr, "gather collects into one vertex, but \"" + e.to.ToString() + "\" has " +
                                          std::to_string(nc) + " vertices");
            continue;
          }
          count = np;
          break;
      }
      bool one_output_each = pattern != EdgePattern::kAllToAll;  // each producer writes one port
      bool one_input_each = pattern == EdgePattern::kPointwise || pattern == EdgePattern::kBroadcast;
      if (e.from_port && !one_output_each) {
        diags_.Error(PointerAppend(e.pointer, "from_port"),
                     "from_port needs a pattern that gives each producer one output (pointwise, broadcast, gather)");
        continue;
      }
      if (e.to_port && !one_input_each) {
        diags_.Error(PointerAppend(e.pointer, "to_port"),
                     "to_port needs a pattern that gives each consumer one input (pointwise, broadcast)");
        continue;
      }
      if (g_.channels_.size() + count > kMaxChannels) {
        diags_.Error(e.pointer, "the job expands to more than " + std::to_string(kMaxChannels) + " channels");
        channels_overflow_ = true;
        return;
      }
      int edge = static_cast<int>(ei);
      auto link = [&](VertexId p, VertexId c) {
        ChannelId ch = NewChannel(e.channel, p, c, edge);
        if (e.channel == ChannelKind::kOrder) {
          g_.vertices_[p.value()].order_out.push_back(ch);
          g_.vertices_[c.value()].order_in.push_back(ch);
        } else {
          in_req_[c.value()].push_back({e.to_port, ch});
        }
        return ch;
      };
      bool data = CarriesData(e.channel);
      switch (pattern) {
        case EdgePattern::kPointwise:
          for (size_t i = 0; i < np; ++i) {
            ChannelId ch = link((*producers)[i], (*consumers)[i]);
            if (data) out_req_[(*producers)[i].value()].push_back({e.from_port, {ch}});
          }
          break;
        case EdgePattern::kAllToAll:
          for (size_t i = 0; i < np; ++i) {
            for (size_t j = 0; j < nc; ++j) {
              ChannelId ch = link((*producers)[i], (*consumers)[j]);
              if (data) out_req_[(*producers)[i].value()].push_back({std::nullopt, {ch}});
            }
          }
          break;
        case EdgePattern::kBroadcast: {
          OutRequest shared{e.from_port, {}};
          for (size_t j = 0; j < nc; ++j) shared.channels.push_back(link(producers->front(), (*consumers)[j]));
          if (data) out_req_[producers->front().value()].push_back(std::move(shared));
          break;
        }
        case EdgePattern::kGather:
          for (size_t i = 0; i < np; ++i) {
            ChannelId ch = link((*producers)[i], consumers->front());
            if (data) out_req_[(*producers)[i].value()].push_back({e.from_port, {ch}});
          }
          break;
      }
    }
  }

  /// The highest pinned output port among `outs`, or -1.
  static int HighestPinnedPort(const std::vector<OutRequest>& outs) {
    int highest = -1;
    for (const auto& req : outs) {
      if (req.port) highest = std::max(highest, *req.port);
    }
    return highest;
  }

  void AssignPorts() {
    uint64_t ports = 0;
    for (const auto& outs : out_req_) ports += std::max<uint64_t>(HighestPinnedPort(outs) + 1, outs.size());
    if (ports > kMaxOutputPorts) {
      diags_.Error("/edges", "the job's vertices have " + std::to_string(ports) +
                                 " output ports (pinned from_port numbers count every port below them); at most " +
                                 std::to_string(kMaxOutputPorts) + " are supported");
      in_req_.clear();
      out_req_.clear();
      return;
    }
    output_ports_ = ports;
    for (auto& v : g_.vertices_) {
      auto& ins = in_req_[v.id.value()];
      v.inputs.assign(ins.size(), ChannelId::Invalid());
      std::vector<const InRequest*> autos;
      for (const auto& req : ins) {
        if (!req.port) {
          autos.push_back(&req);
          continue;
        }
        const std::string ptr = PointerAppend(spec_.edges[g_.channels_[req.channel.value()].edge].pointer, "to_port");
        if (*req.port >= static_cast<int>(ins.size())) {
          diags_.Error(ptr, "input port " + std::to_string(*req.port) + " of " + v.name + " leaves a gap: it has " +
                                std::to_string(ins.size()) + " inputs, numbered 0 to " + std::to_string(ins.size() - 1));
        } else if (v.inputs[*req.port].valid()) {
          diags_.Error(ptr, "input port " + std::to_string(*req.port) + " of " + v.name + " is already fed by another channel");
        } else {
          v.inputs[*req.port] = req.channel;
        }
      }
      size_t next = 0;
      for (const InRequest* req : autos) {
        while (next < v.inputs.size() && v.inputs[next].valid()) ++next;
        if (next < v.inputs.size()) v.inputs[next] = req->channel;
      }
      for (size_t port = 0; port < v.inputs.size(); ++port) {
        if (v.inputs[port].valid()) g_.channels_[v.inputs[port].value()].to_port = static_cast<int>(port);
      }

      auto& outs = out_req_[v.id.value()];
      v.outputs.resize(HighestPinnedPort(outs) + 1);
      std::vector<char> taken(v.outputs.size(), 0);
      for (const auto& req : outs) {
        if (req.port) taken[*req.port] = 1;
      }
      size_t next_out = 0;
      for (const auto& req : outs) {
        size_t port;
        if (req.port) {
          port = *req.port;
        } else {
          while (next_out < taken.size() && taken[next_out]) ++next_out;
          port = next_out++;
          if (port >= v.outputs.size()) {
            v.outputs.resize(port + 1);
            taken.resize(port + 1, 0);
          }
          taken[port] = 1;
        }
        for (ChannelId ch : req.channels) {
          v.outputs[port].push_back(ch);
          g_.channels_[ch.value()].from_port = static_cast<int>(port);
        }
      }
      // A port is written once, as one kind of output, whatever number of edges read it.
      for (size_t port = 0; port < v.outputs.size(); ++port) {
        if (v.outputs[port].empty()) continue;
        const ChannelEdge& first = g_.channels_[v.outputs[port].front().value()];
        for (ChannelId ch : v.outputs[port]) {
          const ChannelEdge& c = g_.channels_[ch.value()];
          if (c.kind == first.kind) continue;
          diags_.Error(PointerAppend(spec_.edges[c.edge].pointer, "channel"),
                       "output port " + std::to_string(port) + " of " + v.name + " is already a " +
                           std::string(ChannelKindName(first.kind)) + " channel (" + spec_.edges[first.edge].pointer + "), not " +
                           std::string(ChannelKindName(c.kind)) + ": a port is written once, as one kind");
          break;
        }
      }
    }
    in_req_.clear();
    out_req_.clear();
  }

  void ApplyOutputs() {
    std::unordered_map<std::string, std::string> paths;
    for (const auto& o : spec_.outputs) {
      auto v = ResolveOne(o.from, PointerAppend(o.pointer, "from"));
      if (v) {
        auto& outs = g_.vertices_[v->value()].outputs;
        if (outs.size() <= static_cast<size_t>(o.port)) {
          output_ports_ += o.port + 1 - outs.size();
          if (output_ports_ > kMaxOutputPorts) {
            diags_.Error(PointerAppend(o.pointer, "port"), "port " + std::to_string(o.port) +
                                                               " brings the job's output ports to more than " +
                                                               std::to_string(kMaxOutputPorts));
            return;
          }
          outs.resize(o.port + 1);
        }
      }
      if (o.path.empty()) continue;
      auto [it, inserted] = paths.emplace(o.path, o.pointer);
      if (!inserted)
        diags_.Error(PointerAppend(o.pointer, "path"), "path \"" + o.path + "\" is already written by " + it->second);
    }
  }

  void CheckFaults() {
    for (const auto& f : spec_.faults) {
      if (f.vertex) ResolveOne(*f.vertex, PointerAppend(f.pointer, FaultKindName(f.kind)));
    }
  }

  void FormGangs() {
    size_t n = g_.vertices_.size();
    DisjointSets sets(n);
    for (const auto& ch : g_.channels_) {
      if (IsLive(ch.kind)) sets.Union(ch.from.value(), ch.to.value());
    }
    rep_.resize(n);
    std::vector<int> gang_of_rep(n, -1);
    std::vector<uint32_t> size(n, 0);
    for (uint32_t v = 0; v < n; ++v) ++size[rep_[v] = sets.Find(v)];
    for (uint32_t v = 0; v < n; ++v) {
      uint32_t r = rep_[v];
      if (size[r] < 2) continue;
      if (gang_of_rep[r] < 0) {
        gang_of_rep[r] = static_cast<int>(g_.gangs_.size());
        g_.gangs_.push_back({GangId(static_cast<uint32_t>(g_.gangs_.size())), {}});
      }
      g_.gangs_[gang_of_rep[r]].members.push_back(VertexId(v));
      g_.vertices_[v].gang = GangId(static_cast<uint32_t>(gang_of_rep[r]));
    }
    CheckLiveChannelRules(sets);
  }

  /// shm ends must be able to share a daemon; nccl ends need GPUs.
  void CheckLiveChannelRules(DisjointSets& gang_sets) {
    size_t n = g_.vertices_.size();
    DisjointSets shm(n);
    for (const auto& ch : g_.channels_) {
      if (ch.kind == ChannelKind::kShm) shm.Union(ch.from.value(), ch.to.value());
    }
    // The affinity group each shm component is pinned to, and the vertex that pinned it.
    std::unordered_map<uint32_t, std::pair<std::string, uint32_t>> pinned;
    std::set<int> reported_edges;
    for (const auto& ch : g_.channels_) {
      if (ch.kind == ChannelKind::kNccl) {
        for (VertexId v : {ch.from, ch.to}) {
          if (g_.stage_of(v).resources.gpus < 1 && reported_edges.insert(ch.edge).second) {
            diags_.Error(PointerAppend(spec_.edges[ch.edge].pointer, "channel"),
                         "an nccl channel joins GPUs, but " + g_.vertices_[v.value()].name +
                             " asks for none; set \"resources\": {\"gpus\": 1} on stage \"" + g_.stage_of(v).name + "\"");
          }
        }
      }
      if (ch.kind != ChannelKind::kShm) continue;
      for (VertexId v : {ch.from, ch.to}) {
        const std::string& group = g_.stage_of(v).affinity;
        if (group.empty()) continue;
        uint32_t comp = shm.Find(v.value());
        auto [it, inserted] = pinned.emplace(comp, std::make_pair(group, v.value()));
        if (!inserted && it->second.first != group && reported_edges.insert(ch.edge).second) {
          diags_.Error(PointerAppend(spec_.edges[ch.edge].pointer, "channel"),
                       "shm ends must share a daemon, but " + g_.vertices_[it->second.second].name +
                           " is pinned to affinity group \"" + it->second.first + "\" and " + g_.vertices_[v.value()].name +
                           " to \"" + group + "\"");
        }
      }
    }
    (void)gang_sets;
  }

  std::string NodeName(uint32_t rep) const {
    const VertexNode& v = g_.vertices_[rep];
    if (!v.gang.valid()) return v.name;
    return v.name + " (gang of " + std::to_string(g_.gangs_[v.gang.value()].members.size()) + ")";
  }

  void OrderAndCheckCycles() {
    size_t n = g_.vertices_.size();
    if (n == 0) return;
    // Contract every gang to its representative; live channels inside a gang impose no order.
    std::vector<std::pair<uint32_t, uint32_t>> edges;
    edges.reserve(g_.channels_.size());
    std::set<uint32_t> reported_gangs;
    std::set<int> self_edges;  // edges reported for a vertex feeding itself
    for (const auto& ch : g_.channels_) {
      uint32_t a = rep_[ch.from.value()], b = rep_[ch.to.value()];
      if (a != b) {
        edges.emplace_back(a, b);
      } else if (ch.from == ch.to) {
        // Placed, a vertex reading its own output would wait on itself for ever.
        if (self_edges.insert(ch.edge).second) {
          diags_.Error(spec_.edges[ch.edge].pointer,
                       g_.vertices_[ch.from.value()].name +
                           (IsLive(ch.kind) ? " cannot read its own output (" : " cannot wait for itself to complete (") +
                           (ch.kind == ChannelKind::kOrder ? "an " : "a ") + std::string(ChannelKindName(ch.kind)) +
                           " channel from it to itself)");
        }
      } else if (!IsLive(ch.kind) && reported_gangs.insert(a).second) {
        diags_.Error(spec_.edges[ch.edge].pointer, g_.vertices_[ch.to.value()].name + " must wait for " +
                                                       g_.vertices_[ch.from.value()].name + " to complete (a " +
                                                       std::string(ChannelKindName(ch.kind)) +
                                                       " channel), but both run at once in one gang joined by live channels");
      }
    }
    std::vector<char> is_node(n, 0);
    for (uint32_t v = 0; v < n; ++v) is_node[v] = rep_[v] == v;
    Csr out = Csr::Make(n, edges, /*reverse=*/false);
    std::vector<uint32_t> order = KahnOrder(out, is_node);
    size_t nodes = std::count(is_node.begin(), is_node.end(), 1);
    if (order.size() != nodes) {
      ReportCycle(edges, order, is_node);
      return;
    }
    g_.topo_.reserve(n);
    for (uint32_t r : order) {
      const VertexNode& v = g_.vertices_[r];
      if (v.gang.valid()) {
        for (VertexId m : g_.gangs_[v.gang.value()].members) g_.topo_.push_back(m);
      } else {
        g_.topo_.push_back(v.id);
      }
    }
    ComputeLongestPath(out, order);
  }

  void ReportCycle(const std::vector<std::pair<uint32_t, uint32_t>>& edges, const std::vector<uint32_t>& order,
                   const std::vector<char>& is_node) {
    size_t n = is_node.size();
    std::vector<char> left = is_node;
    for (uint32_t v : order) left[v] = 0;
    // Every node left after Kahn has a predecessor that is also left: walk back until a repeat.
    Csr in = Csr::Make(n, edges, /*reverse=*/true);
    uint32_t start = 0;
    while (!left[start]) ++start;
    std::vector<int> seen_at(n, -1);
    std::vector<uint32_t> walk;
    uint32_t cur = start;
    while (seen_at[cur] < 0) {
      seen_at[cur] = static_cast<int>(walk.size());
      walk.push_back(cur);
      for (uint32_t i = in.offsets[cur]; i < in.offsets[cur + 1]; ++i) {
        if (left[in.targets[i]]) {
          cur = in.targets[i];
          break;
        }
      }
    }
    std::vector<uint32_t> cycle(walk.begin() + seen_at[cur], walk.end());
    std::reverse(cycle.begin(), cycle.end());  // walked backwards; print in edge direction
    std::string text;
    for (uint32_t v : cycle) text += NodeName(v) + " -> ";
    text += NodeName(cycle.front());
    // Name the edge that closes the cycle so the user knows where to look.
    std::string pointer = "/edges";
    for (const auto& ch : g_.channels_) {
      if (rep_[ch.from.value()] == cycle.back() && rep_[ch.to.value()] == cycle.front()) {
        pointer = spec_.edges[ch.edge].pointer;
        break;
      }
    }
    diags_.Error(pointer, "the graph has a cycle: " + text);
  }

  void ComputeLongestPath(const Csr& contracted, const std::vector<uint32_t>& contracted_order) {
    size_t n = g_.vertices_.size();
    // Prefer the vertex-level path (a gang counts its live-channel chain); fall back to the
    // contracted graph (a gang counts its size) when live channels form a ring.
    std::vector<std::pair<uint32_t, uint32_t>> edges;
    edges.reserve(g_.channels_.size());
    for (const auto& ch : g_.channels_) edges.emplace_back(ch.from.value(), ch.to.value());
    Csr out = Csr::Make(n, edges, false);
    std::vector<uint32_t> order = KahnOrder(out, std::vector<char>(n, 1));
    const Csr* graph = &out;
    if (order.size() != n) {
      order = contracted_order;
      graph = &contracted;
    }
    std::vector<uint32_t> depth(n, 0);
    size_t best = 0;
    for (uint32_t v : order) {
      uint32_t w =
          graph == &out
              ? 1
              : static_cast<uint32_t>(g_.vertices_[v].gang.valid() ? g_.gangs_[g_.vertices_[v].gang.value()].members.size() : 1);
      depth[v] += w;
      best = std::max<size_t>(best, depth[v]);
      for (uint32_t i = graph->offsets[v]; i < graph->offsets[v + 1]; ++i) {
        uint32_t t = graph->targets[i];
        depth[t] = std::max(depth[t], depth[v]);
      }
    }
    g_.longest_path_ = best;
  }

  JobGraph& g_;
  Diagnostics& diags_;
  const JobSpec& spec_;
  std::vector<std::vector<InRequest>> in_req_;
  std::vector<std::vector<OutRequest>> out_req_;
  uint64_t output_ports_ = 0;  // over all vertices, once AssignPorts has made them
  std::vector<uint32_t> rep_;
  bool channels_overflow_ = false;
};

std::shared_ptr<const JobGraph> JobGraph::Build(std::shared_ptr<const JobSpec> spec, Diagnostics& diags) {
  std::shared_ptr<JobGraph> g(new JobGraph());
  g->spec_ = std::move(spec);
  size_t before = diags.size();
  Builder(*g, diags).Run();
  if (diags.size() != before) return nullptr;
  std::set<std::pair<int, int>> joined;
  for (const EdgeSpec& e : g->spec_->edges) {
    const int from = g->FindStage(e.from.stage), to = g->FindStage(e.to.stage);
    if (joined.insert({from, to}).second) g->stage_edges_.push_back({from, to, e.channel});
  }
  return g;
}

std::vector<size_t> JobGraph::ChannelCounts() const {
  std::vector<size_t> counts(kChannelKinds, 0);
  for (const auto& ch : channels_) ++counts[static_cast<size_t>(ch.kind)];
  return counts;
}

int JobGraph::FindStage(std::string_view name) const {
  auto it = stage_index_.find(std::string(name));
  return it == stage_index_.end() ? -1 : it->second;
}

VertexId JobGraph::FindVertex(std::string_view name) const {
  auto ref = ParseEndpointRef(name);
  if (!ref) return VertexId::Invalid();
  int s = FindStage(ref->stage);
  if (s < 0) return VertexId::Invalid();
  int replicas = spec_->stages[s].replicas;
  if (!ref->replica) return replicas == 1 ? VertexId(stage_base_[s]) : VertexId::Invalid();
  if (*ref->replica >= replicas) return VertexId::Invalid();
  return VertexId(stage_base_[s] + *ref->replica);
}

Json JobGraph::Summary() const {
  Json by_kind = Json::object();
  auto counts = ChannelCounts();
  for (size_t k = 0; k < counts.size(); ++k) {
    if (counts[k]) by_kind[std::string(ChannelKindName(static_cast<ChannelKind>(k)))] = counts[k];
  }
  return {{"name", spec_->name},          {"stages", spec_->stages.size()}, {"vertices", vertices_.size()},
          {"channels", channels_.size()}, {"channels_by_kind", by_kind},    {"gangs", gangs_.size()},
          {"longest_path", longest_path_}};
}

std::string JobGraph::ToDot() const {
  auto quote = [](const std::string& s) { return "\"" + ReplaceAll(s, "\"", "\\\"") + "\""; };
  std::ostringstream os;
  os << "digraph " << quote(spec_->name) << " {\n  rankdir=LR;\n  node [shape=box, fontname=\"Helvetica\"];\n";
  for (const auto& gang : gangs_) {
    os << "  subgraph cluster_gang" << gang.id.value() << " {\n    label=\"gang " << gang.id.value() << "\"; style=dashed;\n";
    for (VertexId m : gang.members) os << "    " << quote(vertices_[m.value()].name) << ";\n";
    os << "  }\n";
  }
  for (const auto& v : vertices_) {
    if (!v.gang.valid() && v.inputs.empty() && v.outputs.empty() && v.order_in.empty() && v.order_out.empty()) {
      os << "  " << quote(v.name) << ";\n";
    }
  }
  for (const auto& ch : channels_) {
    os << "  " << quote(vertices_[ch.from.value()].name) << " -> " << quote(vertices_[ch.to.value()].name) << " [label=\""
       << ChannelKindName(ch.kind) << "\"";
    if (ch.kind == ChannelKind::kOrder) os << ", style=dashed";
    if (IsLive(ch.kind)) os << ", style=bold";
    os << "];\n";
  }
  os << "}\n";
  return os.str();
}

}  // namespace copse::jm
