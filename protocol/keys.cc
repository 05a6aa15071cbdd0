#include "protocol/keys.h"

namespace copse::protocol {

OutputKey MakeOutputKey(uint64_t job, uint32_t vertex, uint32_t version, uint32_t port) {
  OutputKey key;
  key.set_job(job);
  key.set_vertex(vertex);
  key.set_version(version);
  key.set_port(port);
  return key;
}

StreamKey MakeStreamKey(uint64_t job, uint32_t channel, uint32_t version) {
  StreamKey key;
  key.set_job(job);
  key.set_channel(channel);
  key.set_version(version);
  return key;
}

std::string ToString(const OutputKey& key) {
  return "job" + std::to_string(key.job()) + "/v" + std::to_string(key.vertex()) + ".v" + std::to_string(key.version()) + "/p" +
         std::to_string(key.port());
}

std::string ToString(const StreamKey& key) {
  return "job" + std::to_string(key.job()) + "/c" + std::to_string(key.channel()) + ".v" + std::to_string(key.version());
}

std::string_view ChannelKindName(ChannelKind kind) {
  switch (kind) {
    case CHANNEL_FILE: return "file";
    case CHANNEL_MEMORY: return "memory";
    case CHANNEL_DURABLE: return "durable";
    case CHANNEL_STREAM: return "stream";
    case CHANNEL_SHM: return "shm";
    case CHANNEL_NCCL: return "nccl";
    default: return "unspecified";
  }
}

std::string_view FailureClassName(FailureClass failure) {
  switch (failure) {
    case FAILURE_PROGRAM_ERROR: return "program_error";
    case FAILURE_DAEMON_LOST: return "daemon_lost";
    case FAILURE_INPUT_LOST: return "input_lost";
    case FAILURE_TIMEOUT: return "timeout";
    case FAILURE_CANCELLED: return "cancelled";
    default: return "unspecified";
  }
}

std::optional<FailureClass> ParseFailureClass(std::string_view name) {
  for (FailureClass c : {FAILURE_PROGRAM_ERROR, FAILURE_DAEMON_LOST, FAILURE_INPUT_LOST, FAILURE_TIMEOUT, FAILURE_CANCELLED}) {
    if (FailureClassName(c) == name) return c;
  }
  return std::nullopt;
}

}  // namespace copse::protocol
