#pragma once
// The rules of protocol/daemon.proto, data.proto and journal.proto that protobuf itself does not keep (required fields,
// ranges, which oneof members a field allows), checked once per received message by the codec
// (protocol/codec.h). InvalidArgument names the message and the field path:
// "JmToDaemon.run.tasks[2].inputs[0].stored.key: required". A body that does not parse at all
// (not the message, or a text field that is not UTF-8) is refused by the codec before these.
#include "common/status.h"
#include "protocol/daemon.pb.h"
#include "protocol/data.pb.h"
#include "protocol/journal.pb.h"

namespace copse::protocol {

/// The largest job id a journal may name: below 2^53, so they stay exact in any JSON reader, far from the
/// invalid id and from wrapping.
inline constexpr uint64_t kLargestJobId = (uint64_t{1} << 53) - 1;

Status Check(const DaemonToJm& message);
Status Check(const JmToDaemon& message);
Status Check(const DataRequest& message);
Status Check(const DataReply& message);
Status Check(const FetchEnd& message);
/// A journal record (protocol/journal.proto), checked by the scheduler's replay.
Status Check(const JournalRecord& message);

}  // namespace copse::protocol
