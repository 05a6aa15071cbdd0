// Fuzzes what a copse server reads from a peer before trusting it, and what the job manager
// and a daemon read from each other: a byte stream cut into frames (common/wire.h) and each
// frame's body decoded the way its receiver decodes it.
//   - kProto bodies: both directions' decoders with their schema checks (protocol/codec.h), and
//     the data plane's requests and replies; kEnd bodies: a fetch's verdict (FetchEnd).
//     A message that decodes must encode and decode again to an equal message, and print as
//     JSON, since logs print what came in.
//   - kJson bodies: the JSON reader with its depth limit (common/json_util.h), the
//     control-message check every server makes ("op" a string), and both sides of the
//     handshake (common/auth.h) given the body as the peer's message.
// Properties beyond "no crash, no sanitizer report": the round trip above, and that a header
// DecodeHeader accepts names a known type and a length within the limit it was given.
#include <cstdint>
#include <string>
#include <string_view>

#include <google/protobuf/util/message_differencer.h>

#include "common/auth.h"
#include "common/json_util.h"
#include "common/logging.h"
#include "common/wire.h"
#include "fuzz/fuzz_check.h"
#include "protocol/codec.h"

namespace {

constexpr std::string_view kSecret = "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff";

template <typename Message>
void CheckRoundTrip(const Message& message, copse::Result<Message> (*decode)(std::string_view)) {
  auto again = decode(message.SerializeAsString());
  COPSE_FUZZ_CHECK(again.ok());
  // Compared field by field: a map's bytes come in no fixed order.
  COPSE_FUZZ_CHECK(google::protobuf::util::MessageDifferencer::Equals(*again, message));
  (void)copse::protocol::ToJsonText(message);
  if constexpr (requires { copse::protocol::BodyName(message); }) (void)copse::protocol::BodyName(message);
}

void DecodeJsonBody(std::string_view body) {
  auto parsed = copse::ParseJson(body, "fuzz");
  if (!parsed.ok()) return;
  const copse::Json& msg = *parsed;
  if (!msg.is_object() || !msg.contains("op") || !msg["op"].is_string()) return;
  (void)copse::DumpJson(msg);
  // The client's side: the body as the server's hello, then as its welcome.
  auto answer = copse::auth::AnswerHello(msg, kSecret, "client");
  if (answer.ok()) (void)copse::auth::CheckWelcome(msg, kSecret, *answer);
  copse::auth::HelloAnswer forged{msg, "0123456789abcdef0123456789abcdef", "fedcba9876543210fedcba9876543210"};
  (void)copse::auth::CheckWelcome(msg, kSecret, forged);
  // The server's side: the body as a client's auth message.
  (void)copse::auth::Welcome(msg, kSecret, "0123456789abcdef0123456789abcdef");
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  copse::SetLogLevel("off");
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view in(reinterpret_cast<const char*>(data), size);
  while (in.size() >= copse::wire::kHeaderBytes) {
    auto header = copse::wire::DecodeHeader(in.data(), copse::wire::kMaxControlBytes);
    if (!header.ok()) return 0;  // the receiver drops the peer here
    const uint16_t type = static_cast<uint16_t>(header->type);
    COPSE_FUZZ_CHECK(type >= 1 && type <= 4);
    COPSE_FUZZ_CHECK(header->length <= copse::wire::kMaxControlBytes);
    in.remove_prefix(copse::wire::kHeaderBytes);
    // A body shorter than announced is one the receiver is still waiting for: decode what came.
    const std::string_view body = in.substr(0, header->length);
    in.remove_prefix(body.size());
    switch (header->type) {
      case copse::wire::FrameType::kProto: {
        if (auto m = copse::protocol::DecodeDaemonToJm(body); m.ok()) {
          CheckRoundTrip(*m, copse::protocol::DecodeDaemonToJm);
        }
        if (auto m = copse::protocol::DecodeJmToDaemon(body); m.ok()) {
          CheckRoundTrip(*m, copse::protocol::DecodeJmToDaemon);
        }
        if (auto m = copse::protocol::DecodeDataRequest(body); m.ok()) {
          CheckRoundTrip(*m, copse::protocol::DecodeDataRequest);
        }
        if (auto m = copse::protocol::DecodeDataReply(body); m.ok()) {
          CheckRoundTrip(*m, copse::protocol::DecodeDataReply);
        }
        break;
      }
      case copse::wire::FrameType::kEnd:
        if (auto m = copse::protocol::DecodeFetchEnd(body); m.ok()) CheckRoundTrip(*m, copse::protocol::DecodeFetchEnd);
        break;
      case copse::wire::FrameType::kJson: DecodeJsonBody(body); break;
      case copse::wire::FrameType::kData: break;  // channel data: the data server's readers check it (not covered here)
    }
  }
  return 0;
}
