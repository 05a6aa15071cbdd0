#pragma once
// Small helpers over the shared types of protocol/types.proto: building keys, printing them as
// people read them, and the names channel kinds and failure classes have in job files and
// messages for people.
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "protocol/types.pb.h"

namespace copse::protocol {

OutputKey MakeOutputKey(uint64_t job, uint32_t vertex, uint32_t version, uint32_t port);
StreamKey MakeStreamKey(uint64_t job, uint32_t channel, uint32_t version);

/// "job3/v12.v2/p0" and "job3/c7.v2", as the channels print their keys.
std::string ToString(const OutputKey& key);
std::string ToString(const StreamKey& key);

/// "file", "memory", "durable", "stream", "shm", "nccl" (the job file's words); "unspecified".
std::string_view ChannelKindName(ChannelKind kind);
/// "program_error", "daemon_lost", "input_lost", "timeout", "cancelled"; "unspecified".
std::string_view FailureClassName(FailureClass failure);
std::optional<FailureClass> ParseFailureClass(std::string_view name);

}  // namespace copse::protocol
