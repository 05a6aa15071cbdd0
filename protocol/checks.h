#pragma once
// The rules of protocol/daemon.proto and protocol/data.proto that protobuf itself does not keep (required fields,
// ranges, which oneof members a field allows), checked once per received message by the codec
// (protocol/codec.h). InvalidArgument names the message and the field path:
// "JmToDaemon.run.tasks[2].inputs[0].stored.key: required". A body that does not parse at all
// (not the message, or a text field that is not UTF-8) is refused by the codec before these.
#include "common/status.h"
#include "protocol/daemon.pb.h"
#include "protocol/data.pb.h"

namespace copse::protocol {

Status Check(const DaemonToJm& message);
Status Check(const JmToDaemon& message);
Status Check(const DataRequest& message);
Status Check(const DataReply& message);
Status Check(const FetchEnd& message);

}  // namespace copse::protocol
