#include "channels/stream_key.h"

#include <limits>

namespace copse::chan {

namespace {
Result<uint64_t> Unsigned(const Json& j, const char* name, uint64_t max) {
  auto it = j.find(name);
  if (it == j.end()) return Status::InvalidArgument(std::string("stream key: /") + name + " is missing");
  if (!it->is_number_unsigned() && !(it->is_number_integer() && it->get<int64_t>() >= 0))
    return Status::InvalidArgument(std::string("stream key: /") + name + ": expected an unsigned integer, not " +
                                   JsonTypeName(*it));
  uint64_t v = it->get<uint64_t>();
  if (v > max) return Status::InvalidArgument(std::string("stream key: /") + name + ": out of range");
  return v;
}
}  // namespace

std::string StreamKey::ToString() const {
  return "job" + std::to_string(job) + "/c" + std::to_string(channel) + ".v" + std::to_string(version);
}

Json StreamKey::ToJson() const { return Json{{"job", job}, {"channel", channel}, {"version", version}}; }

Result<StreamKey> StreamKey::FromJson(const Json& j) {
  if (!j.is_object()) return Status::InvalidArgument("stream key must be an object, not " + JsonTypeName(j));
  constexpr uint64_t k32 = std::numeric_limits<uint32_t>::max();
  StreamKey k;
  COPSE_ASSIGN_OR_RETURN(k.job, Unsigned(j, "job", std::numeric_limits<uint64_t>::max()));
  COPSE_ASSIGN_OR_RETURN(uint64_t channel, Unsigned(j, "channel", k32));
  COPSE_ASSIGN_OR_RETURN(uint64_t version, Unsigned(j, "version", k32));
  k.channel = static_cast<uint32_t>(channel);
  k.version = static_cast<uint32_t>(version);
  return k;
}

Json StreamPeer::ToJson() const {
  Json j = {{"tcp", tcp}, {"host", host}};
  if (!ipc.empty()) j["ipc"] = ipc;
  return j;
}

Result<StreamPeer> StreamPeer::FromJson(const Json& j) {
  if (!j.is_object()) return Status::InvalidArgument("stream peer must be an object, not " + JsonTypeName(j));
  StreamPeer peer;
  for (auto [name, field] : {std::pair{"tcp", &peer.tcp}, {"ipc", &peer.ipc}, {"host", &peer.host}}) {
    auto it = j.find(name);
    if (it == j.end()) continue;
    if (!it->is_string())
      return Status::InvalidArgument(std::string("stream peer: /") + name + ": expected a string, not " + JsonTypeName(*it));
    *field = it->get<std::string>();
  }
  return peer;
}

}  // namespace copse::chan
