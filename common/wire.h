#pragma once
// The wire format every copse connection speaks (job manager <-> daemons <-> clients, daemon
// <-> daemon): length-prefixed frames.
//
//   header (12 bytes, little-endian): u32 magic "CPSE", u16 protocol version, u16 frame type,
//                                     u32 body length
//   body: `length` bytes; kJson frames hold one JSON object with an "op" member (the handshake,
//         client requests, the data server); kProto frames one serialized protocol message
//         (protocol/daemon.proto: the job manager <-> daemon conversation).
//
// A peer that sends a wrong magic, another version, an unknown type or a body over the
// receiver's limit gets an error and is disconnected (DecodeHeader says which).
#include <array>
#include <cstdint>
#include <string>
#include <string_view>

#include "common/status.h"

namespace copse::wire {

constexpr uint32_t kMagic = 0x45535043;  // "CPSE" read as little-endian bytes
// 2: the job manager <-> daemon messages became protocol buffers (kProto); 3: so did the data
// plane's requests and fetch verdicts (protocol/data.proto). Peers of different versions refuse
// each other at the first frame (DecodeHeader says which versions met).
constexpr uint16_t kProtocolVersion = 3;
constexpr size_t kHeaderBytes = 12;
constexpr uint32_t kMaxControlBytes = 64u << 20;   // a control message (job files included)
constexpr uint32_t kMaxHandshakeBytes = 4u << 10;  // what a peer may send before it authenticated
constexpr uint32_t kMaxDataBytes = 256u << 20;     // one data block between daemons

enum class FrameType : uint16_t {
  kJson = 1,   // control message: a JSON object with "op"
  kData = 2,   // one message of a channel: u64 xxh3 checksum, then the bytes
  kEnd = 3,    // end of a channel's data; body: JSON status
  kProto = 4,  // control message: a serialized protocol buffer (protocol/codec.h)
};

struct FrameHeader {
  FrameType type;
  uint32_t length;
};

/// A received frame's type and body.
struct Frame {
  FrameType type;
  std::string body;
};

std::array<char, kHeaderBytes> EncodeHeader(FrameType type, uint32_t length);
/// Checks magic, version, type and `length <= max_body`; the error names what was wrong.
Result<FrameHeader> DecodeHeader(const char* bytes, uint32_t max_body);
/// Header + body in one string, ready to write.
std::string EncodeFrame(FrameType type, std::string_view body);

}  // namespace copse::wire
