// The programs of `copse plan`'s profiling job (ml/profile_graph.h). Unlike the training
// programs these measure time, so a re-executed vertex writes other bytes: nothing downstream
// of them but the plan depends on their output.
#include "ml/programs/profile.h"

#include <algorithm>

#include <fmt/format.h>

#include "ml/device.h"
#include "ml/layer_profile.h"
#include "ml/programs/support.h"
#include "ml/tensor_message.h"

namespace copse::ml::programs {
namespace {

using vertex::VertexContext;
using vertex::VertexProgram;

/// ml.profile: measures the model's layers (ProfileModel) on this daemon. Params: model,
/// sizes (micro-batch sizes), tensor_parallel (group sizes to measure shards of), optimizer,
/// repeats, threads (the CPU threads a training vertex
/// will have: its resources.cpus, not this vertex's, which takes the whole daemon so that
/// nothing else runs beside the measurement). Output 0: the cost table as JSON.
class ProfileProgram final : public VertexProgram {
 public:
  Status Run(VertexContext& ctx) override {
    ProfileOptions o;
    o.model = ctx.param<std::string>("model", "mlp");
    o.optimizer = ctx.param<std::string>("optimizer", "sgd");
    o.repeats = ctx.param<int>("repeats", 5);
    o.microbatch_sizes = ctx.param<std::vector<int64_t>>("sizes", {128});
    o.tensor_parallel = ctx.param<std::vector<int>>("tensor_parallel", {});
    if (std::any_of(o.tensor_parallel.begin(), o.tensor_parallel.end(), [](int r) { return r < 2 || r > 16; }))
      return Status::InvalidArgument(ctx.name + ": param \"tensor_parallel\": expected group sizes of 2..16");
    if (o.repeats < 1 || o.repeats > 1000) return Status::InvalidArgument(ctx.name + ": param \"repeats\": expected 1..1000");
    if (o.microbatch_sizes.empty() || o.microbatch_sizes.size() > 32 ||
        std::any_of(o.microbatch_sizes.begin(), o.microbatch_sizes.end(), [](int64_t b) { return b < 1 || b > (1 << 20); }))
      return Status::InvalidArgument(ctx.name + ": param \"sizes\": expected 1 to 32 micro-batch sizes of 1..2^20");
    const int threads = std::clamp(ctx.param<int>("threads", 1), 1, 256);
    SetCpuThreads(threads);
    COPSE_ASSIGN_OR_RETURN(CostTable table, ProfileModel(o));
    table.threads = threads;
    COPSE_RETURN_NOT_OK(ctx.output(0).Write(chan::Buffer(ToJson(table).dump())));
    return ctx.CloseOutputs();
  }
};

/// A hop record: a tensor message, as the training programs send (ml/tensor_message.h), of one
/// float32 tensor of params.payload_bytes whose name is the record as JSON: {"t": [[start, read,
/// end] per vertex so far, µs]}. The writer makes the tensor (page faults and all) before it
/// takes its end time: what a hand-off measures is the transfer, not the making of the message.
struct HopRecord {
  Json times = Json::array();
};

Result<HopRecord> ParseHop(const VertexContext& ctx, const chan::Buffer& msg) {
  auto tensors = ReadTensorMessage(msg);
  if (!tensors.ok() || tensors->size() != 1) return Status::InvalidArgument(ctx.name + ": input 0 is not a hop record");
  Json head = Json::parse(tensors->front().first, nullptr, false);
  if (head.is_discarded() || !head.is_object() || !head.contains("t") || !head["t"].is_array())
    return Status::InvalidArgument(ctx.name + ": input 0 is not a hop record");
  return HopRecord{head["t"]};
}

/// ml.profile_hop: one link of a chain of vertices that pass a message along, each adding when
/// it started, when it had read its input and when it wrote its output (µs, wall clock). Input
/// 0: the previous link's record (none for the first). Output 0: the record.
class HopProgram final : public VertexProgram {
 public:
  Status Run(VertexContext& ctx) override {
    const int64_t start = WallMicros();
    HopRecord record;
    if (ctx.num_inputs() > 0) {
      COPSE_ASSIGN_OR_RETURN(chan::Buffer msg, ReadOne(ctx, 0));
      COPSE_ASSIGN_OR_RETURN(record, ParseHop(ctx, msg));
    }
    const int64_t read = WallMicros();
    const int64_t payload = std::clamp<int64_t>(ctx.param<int64_t>("payload_bytes", 0), 0, int64_t{256} << 20);
    Tensor padding = Tensor::Zeros({std::max<int64_t>(1, payload / 4)});
    record.times.push_back({start, read, WallMicros()});
    COPSE_RETURN_NOT_OK(ctx.output(0).Write(TensorMessage({{Json{{"t", record.times}}.dump(), std::move(padding)}})));
    return ctx.CloseOutputs();
  }
};

/// A chain's hand-off: from a link's write to the next link having read it, in seconds; the
/// median over consecutive pairs of hand-offs of each pair's mean. Alternating between two
/// daemons, a pair goes there and back, so a clock offset between them cancels out; the median
/// leaves out the first hand-offs' warm-up (fresh buffers, cold caches). `log` gets every one.
Result<double> HandOff(VertexContext& ctx, const HopRecord& r, const char* chain) {
  std::vector<double> each;
  for (size_t k = 0; k + 1 < r.times.size(); ++k) {
    const Json& a = r.times[k];
    const Json& b = r.times[k + 1];
    if (!a.is_array() || !b.is_array() || a.size() != 3 || b.size() != 3 || !a[2].is_number() || !b[1].is_number())
      return Status::InvalidArgument(ctx.name + ": a hop record with a malformed entry");
    each.push_back((b[1].get<double>() - a[2].get<double>()) / 1e6);
  }
  if (each.size() < 2) return Status::InvalidArgument(ctx.name + ": a hop chain needs at least two hand-offs");
  std::vector<double> pairs;
  std::string line;
  for (size_t k = 0; k < each.size(); ++k) {
    line += fmt::format("{}{:.0f}", k ? " " : "", each[k] * 1e6);
    if (k % 2 == 1) pairs.push_back((each[k - 1] + each[k]) / 2);
  }
  ctx.log().info("{} chain hand-offs (us): {}", chain, line);
  std::sort(pairs.begin(), pairs.end());
  const size_t n = pairs.size();
  return n % 2 ? pairs[n / 2] : (pairs[n / 2 - 1] + pairs[n / 2]) / 2;
}

/// ml.profile_collect: the cost table `copse plan` reads. Inputs 0..profiles-1: each daemon's
/// ml.profile table; then the ends of three hop chains: on one daemon (the gap between vertices),
/// across two with small_bytes and with large_bytes of payload (hop latency and bandwidth).
/// Output 0: the median of the tables with the link's costs, as JSON.
class CollectProgram final : public VertexProgram {
 public:
  Status Run(VertexContext& ctx) override {
    const size_t profiles = static_cast<size_t>(std::max(1, ctx.param<int>("profiles", 1)));
    if (ctx.num_inputs() != profiles + 3)
      return Status::InvalidArgument(
          fmt::format("{}: expected {} inputs (tables and 3 hop chains), got {}", ctx.name, profiles + 3, ctx.num_inputs()));
    std::vector<CostTable> tables;
    for (size_t p = 0; p < profiles; ++p) {
      COPSE_ASSIGN_OR_RETURN(chan::Buffer msg, ReadOne(ctx, p));
      Json j = Json::parse(msg.view(), nullptr, false);
      if (j.is_discarded()) return Status::InvalidArgument(fmt::format("{}: input {} is not JSON", ctx.name, p));
      auto table = CostTableFromJson(j);
      if (!table.ok()) return Status::InvalidArgument(fmt::format("{}: input {}: {}", ctx.name, p, table.status().message()));
      tables.push_back(std::move(*table));
    }
    COPSE_ASSIGN_OR_RETURN(CostTable out, MedianTable(tables));
    double hand_off[3];
    const char* chains[3] = {"gap", "hop", "bulk"};
    for (size_t c = 0; c < 3; ++c) {
      COPSE_ASSIGN_OR_RETURN(chan::Buffer msg, ReadOne(ctx, profiles + c));
      COPSE_ASSIGN_OR_RETURN(HopRecord r, ParseHop(ctx, msg));
      COPSE_ASSIGN_OR_RETURN(hand_off[c], HandOff(ctx, r, chains[c]));
    }
    const double small = static_cast<double>(ctx.param<int64_t>("small_bytes", 0));
    const double large = static_cast<double>(ctx.param<int64_t>("large_bytes", 0));
    out.link.gap = std::max(0.0, hand_off[0]);
    // With one daemon the "across" chains stayed on it: the gap is measured, hop and rate keep
    // their defaults.
    out.link.measured = profiles > 1;
    if (out.link.measured) {
      out.link.hop = std::clamp(hand_off[1], out.link.gap, 1.0);
      // What the larger payload added per byte; a noisy chain that saw none keeps the default.
      if (large > small && hand_off[2] > hand_off[1])
        out.link.bytes_per_s = std::clamp((large - small) / (hand_off[2] - hand_off[1]), 1e3, 1e13);
    }
    out.link.gap = std::min(out.link.gap, 1.0);
    ctx.log().info("gap {:.0f} us, hop {:.0f} us, {:.0f} MB/s across daemons", out.link.gap * 1e6, out.link.hop * 1e6,
                   out.link.bytes_per_s / 1e6);
    COPSE_RETURN_NOT_OK(ctx.output(0).Write(chan::Buffer(ToJson(out).dump(2) + "\n")));
    return ctx.CloseOutputs();
  }
};

}  // namespace

void RegisterProfilePrograms(vertex::ProgramRegistry& registry) {
  auto add = [&](const char* name, vertex::ProgramFactory f) { (void)registry.Register(name, std::move(f)); };
  add("ml.profile", [] { return std::make_unique<ProfileProgram>(); });
  add("ml.profile_hop", [] { return std::make_unique<HopProgram>(); });
  add("ml.profile_collect", [] { return std::make_unique<CollectProgram>(); });
}

}  // namespace copse::ml::programs
