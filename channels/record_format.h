#pragma once
// Internal: the record layout shared by stored files and the data-server wire format, and the
// checksum every stored or transferred message carries.
//
//   record := u32 length | u64 xxh3_64(bytes) | bytes[length]      (little-endian)
//
// An output file is an 8-byte magic ("CPSEOUT1") followed by its records; a data frame of the
// `M` form (see data_server.h) is a tag byte followed by records in the same layout.
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <xxhash.h>

namespace copse::chan::internal {

constexpr size_t kRecordHeaderBytes = 12;
constexpr char kFileMagic[8] = {'C', 'P', 'S', 'E', 'O', 'U', 'T', '1'};

inline uint64_t Checksum(std::string_view bytes) { return XXH3_64bits(bytes.data(), bytes.size()); }

/// Checksum() of the concatenation of `spans` (a message gathered in place: Buffer::spans()).
inline uint64_t Checksum(const std::vector<std::string_view>& spans) {
  if (spans.empty()) return Checksum(std::string_view());
  if (spans.size() == 1) return Checksum(spans[0]);
  std::unique_ptr<XXH3_state_t, XXH_errorcode (*)(XXH3_state_t*)> state(XXH3_createState(), XXH3_freeState);
  XXH3_64bits_reset(state.get());
  for (std::string_view p : spans) XXH3_64bits_update(state.get(), p.data(), p.size());
  return XXH3_64bits_digest(state.get());
}

inline void PutU32(char* p, uint32_t v) { std::memcpy(p, &v, 4); }  // x86-64/aarch64: little-endian
inline void PutU64(char* p, uint64_t v) { std::memcpy(p, &v, 8); }
inline uint32_t GetU32(const char* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}
inline uint64_t GetU64(const char* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}

inline void EncodeRecordHeader(char* p, uint32_t length, uint64_t checksum) {
  PutU32(p, length);
  PutU64(p + 4, checksum);
}

// Data frames (wire::FrameType::kData) start with a tag byte:
//   'M'  whole messages: records as above, until the end of the frame
//   'P'  the first piece of a message too large for one frame: u64 total length, u64 xxh3,
//        then bytes up to the end of the frame
//   'C'  the next piece of that message: bytes up to the end of the frame
constexpr char kTagMessages = 'M';
constexpr char kTagFirstPiece = 'P';
constexpr char kTagContinuation = 'C';
constexpr size_t kBatchBytes = 1 << 20;      // a frame of small messages is sent once this full
constexpr size_t kBatchRecords = 256;        // ... or holding this many
constexpr size_t kMaxPieceBytes = 64 << 20;  // larger messages travel in pieces

/// A std::string of `n` bytes whose contents the caller overwrites at once.
inline std::string UninitializedString(size_t n) {
  std::string s;
  s.resize(n);  // C++20 libstdc++ has no resize_and_overwrite; the memset costs ~5% of a read
  return s;
}

}  // namespace copse::chan::internal
