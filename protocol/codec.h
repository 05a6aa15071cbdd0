#pragma once
// The codec of the job manager <-> daemon conversation (protocol/daemon.proto) and of the data
// plane (protocol/data.proto): a message goes out as one frame of type kProto (common/wire.h)
// holding its serialized body, and comes in through Decode*, which parses and checks it
// (protocol/checks.h) in one place. A caller never sees a message that breaks a rule its schema
// states.
#include <string>
#include <string_view>

#include "common/status.h"
#include "protocol/daemon.pb.h"
#include "protocol/data.pb.h"
#include "protocol/journal.pb.h"

namespace copse::protocol {

/// Header + serialized `message`, ready to write.
std::string EncodeFrame(const google::protobuf::MessageLite& message);

/// A kProto frame's body from a daemon / from the job manager. InvalidArgument naming the
/// message and the field when it does not parse or breaks a rule of the schema.
Result<DaemonToJm> DecodeDaemonToJm(std::string_view body);
Result<JmToDaemon> DecodeJmToDaemon(std::string_view body);
/// The data plane (protocol/data.proto): a reader's request, a data server's reply outside a
/// fetch, and the kEnd frame's body that ends a fetch's answer.
Result<DataRequest> DecodeDataRequest(std::string_view body);
Result<DataReply> DecodeDataReply(std::string_view body);
Result<FetchEnd> DecodeFetchEnd(std::string_view body);

/// The name of the message an envelope holds ("register", "run", …; "nothing" when empty).
std::string_view BodyName(const DaemonToJm& message);
std::string_view BodyName(const JmToDaemon& message);
std::string_view BodyName(const DataRequest& message);
std::string_view BodyName(const DataReply& message);
std::string_view BodyName(const JournalRecord& message);

/// The job id a journal record names: its job's, or the newest id an ids record says was
/// handed out; 0 for a restart record.
uint64_t JobNamed(const JournalRecord& record);

/// The canonical JSON mapping of `message` with the schema's field names: for logs, tests and
/// what users read.
std::string ToJsonText(const google::protobuf::Message& message);

}  // namespace copse::protocol
