#include "common/wire.h"

#include <cstring>

namespace copse::wire {
namespace {

void Put16(char* p, uint16_t v) {
  p[0] = static_cast<char>(v & 0xff);
  p[1] = static_cast<char>(v >> 8);
}
void Put32(char* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<char>((v >> (8 * i)) & 0xff);
}
uint16_t Get16(const char* p) { return static_cast<uint16_t>(static_cast<uint8_t>(p[0]) | (static_cast<uint8_t>(p[1]) << 8)); }
uint32_t Get32(const char* p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= static_cast<uint32_t>(static_cast<uint8_t>(p[i])) << (8 * i);
  return v;
}

}  // namespace

std::array<char, kHeaderBytes> EncodeHeader(FrameType type, uint32_t length) {
  std::array<char, kHeaderBytes> h{};
  Put32(h.data(), kMagic);
  Put16(h.data() + 4, kProtocolVersion);
  Put16(h.data() + 6, static_cast<uint16_t>(type));
  Put32(h.data() + 8, length);
  return h;
}

Result<FrameHeader> DecodeHeader(const char* bytes, uint32_t max_body) {
  if (Get32(bytes) != kMagic) return Status::InvalidArgument("not a copse peer (bad frame magic)");
  uint16_t version = Get16(bytes + 4);
  if (version != kProtocolVersion) {
    return Status::InvalidArgument("the peer speaks copse protocol version " + std::to_string(version) + ", this copse " +
                                   std::to_string(kProtocolVersion) +
                                   ", and neither speaks the other's: run one copse release on the job manager, its daemons "
                                   "and its clients");
  }
  uint16_t type = Get16(bytes + 6);
  if (type < 1 || type > 4) return Status::InvalidArgument("unknown frame type " + std::to_string(type));
  uint32_t length = Get32(bytes + 8);
  if (length > max_body) {
    return Status::InvalidArgument("frame of " + std::to_string(length) + " bytes exceeds the limit of " +
                                   std::to_string(max_body));
  }
  return FrameHeader{static_cast<FrameType>(type), length};
}

std::string EncodeFrame(FrameType type, std::string_view body) {
  auto h = EncodeHeader(type, static_cast<uint32_t>(body.size()));
  std::string out;
  out.reserve(kHeaderBytes + body.size());
  out.append(h.data(), h.size());
  out.append(body);
  return out;
}

}  // namespace copse::wire
