#include "protocol/codec.h"

#include <google/protobuf/util/json_util.h>

#include "common/wire.h"
#include "protocol/checks.h"

namespace copse::protocol {
namespace {

template <class Envelope>
Result<Envelope> Decode(std::string_view body, const char* what) {
  Envelope message;
  if (!message.ParseFromArray(body.data(), static_cast<int>(body.size()))) {
    return Status::InvalidArgument(std::string(what) + ": the body does not parse (" + std::to_string(body.size()) +
                                   " bytes: not this message, or a text field that is not UTF-8)");
  }
  COPSE_RETURN_NOT_OK(Check(message));
  return message;
}

template <class Envelope>
std::string_view NameOf(const Envelope& message) {
  const auto* oneof = message.GetDescriptor()->FindOneofByName("body");
  const auto* field = message.GetReflection()->GetOneofFieldDescriptor(message, oneof);
  return field ? std::string_view(field->name()) : std::string_view("nothing");
}

}  // namespace

std::string EncodeFrame(const google::protobuf::MessageLite& message) {
  const size_t size = message.ByteSizeLong();
  std::string frame;
  frame.resize(wire::kHeaderBytes + size);
  const auto header = wire::EncodeHeader(wire::FrameType::kProto, static_cast<uint32_t>(size));
  std::copy(header.begin(), header.end(), frame.begin());
  message.SerializeWithCachedSizesToArray(reinterpret_cast<uint8_t*>(frame.data() + wire::kHeaderBytes));
  return frame;
}

Result<DaemonToJm> DecodeDaemonToJm(std::string_view body) { return Decode<DaemonToJm>(body, "DaemonToJm"); }
Result<JmToDaemon> DecodeJmToDaemon(std::string_view body) { return Decode<JmToDaemon>(body, "JmToDaemon"); }
Result<DataRequest> DecodeDataRequest(std::string_view body) { return Decode<DataRequest>(body, "DataRequest"); }
Result<DataReply> DecodeDataReply(std::string_view body) { return Decode<DataReply>(body, "DataReply"); }
Result<FetchEnd> DecodeFetchEnd(std::string_view body) { return Decode<FetchEnd>(body, "FetchEnd"); }

std::string_view BodyName(const DaemonToJm& message) { return NameOf(message); }
std::string_view BodyName(const JmToDaemon& message) { return NameOf(message); }
std::string_view BodyName(const DataRequest& message) { return NameOf(message); }
std::string_view BodyName(const DataReply& message) { return NameOf(message); }
std::string_view BodyName(const JournalRecord& message) { return NameOf(message); }

uint64_t JobNamed(const JournalRecord& r) {
  switch (r.body_case()) {
    case JournalRecord::kJob: return r.job().job();
    case JournalRecord::kDone: return r.done().job();
    case JournalRecord::kRegen: return r.regen().job();
    case JournalRecord::kEnd: return r.end().job();
    case JournalRecord::kIds: return r.ids().up_to();
    default: return 0;
  }
}

std::string ToJsonText(const google::protobuf::Message& message) {
  google::protobuf::util::JsonPrintOptions options;
  options.preserve_proto_field_names = true;
  std::string out;
  if (!google::protobuf::util::MessageToJsonString(message, &out, options).ok()) return "{}";
  return out;
}

}  // namespace copse::protocol
