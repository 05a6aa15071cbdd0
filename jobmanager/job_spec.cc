#include "jobmanager/job_spec.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cstring>

namespace copse::jm {

std::string_view ChannelKindName(ChannelKind kind) {
  switch (kind) {
    case ChannelKind::kFile: return "file";
    case ChannelKind::kMemory: return "memory";
    case ChannelKind::kStream: return "stream";
    case ChannelKind::kShm: return "shm";
    case ChannelKind::kNccl: return "nccl";
    case ChannelKind::kOrder: return "order";
    case ChannelKind::kDurable: return "durable";
    case ChannelKind::kMirrored: return "mirrored";
  }
  return "?";
}

std::optional<ChannelKind> ParseChannelKind(std::string_view name) {
  for (auto k : {ChannelKind::kFile, ChannelKind::kMemory, ChannelKind::kStream, ChannelKind::kShm, ChannelKind::kNccl,
                 ChannelKind::kOrder, ChannelKind::kDurable, ChannelKind::kMirrored}) {
    if (ChannelKindName(k) == name) return k;
  }
  return std::nullopt;
}

std::string_view EdgePatternName(EdgePattern pattern) {
  switch (pattern) {
    case EdgePattern::kPointwise: return "pointwise";
    case EdgePattern::kAllToAll: return "all_to_all";
    case EdgePattern::kBroadcast: return "broadcast";
    case EdgePattern::kGather: return "gather";
  }
  return "?";
}

std::optional<EdgePattern> ParseEdgePattern(std::string_view name) {
  for (auto p : {EdgePattern::kPointwise, EdgePattern::kAllToAll, EdgePattern::kBroadcast, EdgePattern::kGather}) {
    if (EdgePatternName(p) == name) return p;
  }
  return std::nullopt;
}

std::string_view FaultKindName(FaultKind kind) {
  switch (kind) {
    case FaultKind::kKillDaemonOf: return "kill_daemon_of";
    case FaultKind::kKillDaemon: return "kill_daemon";
    case FaultKind::kFail: return "fail";
    case FaultKind::kDelay: return "delay";
    case FaultKind::kCorruptOutputOf: return "corrupt_output_of";
    case FaultKind::kDropOutputOf: return "drop_output_of";
  }
  return "?";
}

std::string EndpointRef::ToString() const { return replica ? stage + "[" + std::to_string(*replica) + "]" : stage; }

std::optional<EndpointRef> ParseEndpointRef(std::string_view text) {
  EndpointRef ref;
  size_t open = text.find('[');
  if (open == std::string_view::npos) {
    if (text.empty() || text.find(']') != std::string_view::npos) return std::nullopt;
    ref.stage = std::string(text);
    return ref;
  }
  if (open == 0 || text.back() != ']' || open + 2 > text.size() - 1) return std::nullopt;
  std::string_view digits = text.substr(open + 1, text.size() - open - 2);
  int replica = 0;
  auto [ptr, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), replica);
  if (ec != std::errc() || ptr != digits.data() + digits.size() || replica < 0) return std::nullopt;
  ref.stage = std::string(text.substr(0, open));
  ref.replica = replica;
  return ref;
}

int JobSpec::FindStage(std::string_view stage_name) const {
  for (size_t i = 0; i < stages.size(); ++i) {
    if (stages[i].name == stage_name) return static_cast<int>(i);
  }
  return -1;
}

std::string DaemonNameProblem(const std::string& name) {
  if (name.empty()) return "a daemon needs a name";
  const bool plain = name.size() <= 128 && std::all_of(name.begin(), name.end(), [](unsigned char c) {
                       return std::isalnum(c) || std::strchr("._-:@+=", c) != nullptr;
                     });
  if (!plain) {
    return "daemon name \"" + name.substr(0, 140) + "\" must be 1 to 128 letters, digits and . _ - : @ + = (no spaces or '/')";
  }
  return "";
}

}  // namespace copse::jm
