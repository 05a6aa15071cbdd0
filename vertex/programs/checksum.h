#pragma once
// The `checksum` program's digest, exposed so tests can compute the expected result of a
// whole graph of checksum vertices and prove every channel delivered exactly what was
// produced.
//
// digest = XXH3-64 over: name, 0, params.dump(), 0, then for each input port in order every
// message as (u64 little-endian length, bytes) followed by the port terminator u64 max.
// Output: one message "<16 hex digits>\n", then params.bytes deterministic bytes derived from
// the digest (in messages of at most 1 MiB).
#include <cstdint>
#include <string>
#include <string_view>

#include <xxhash.h>

namespace copse::vertex {

class ChecksumHasher {
 public:
  ChecksumHasher(std::string_view vertex_name, std::string_view params_json);
  ~ChecksumHasher();
  ChecksumHasher(const ChecksumHasher&) = delete;
  ChecksumHasher& operator=(const ChecksumHasher&) = delete;

  void AddMessage(std::string_view bytes);
  void EndPort();
  uint64_t Digest() const;

 private:
  XXH3_state_t* state_;
};

/// "<16 lowercase hex digits>\n".
std::string DigestLine(uint64_t digest);
/// `n` bytes determined by `digest` (splitmix64 stream).
std::string DeterministicBytes(uint64_t digest, size_t n);
/// Bytes [offset, offset + n) of that stream; `offset` must be a multiple of 8. Lets a
/// producer emit gigabytes without holding them.
std::string DeterministicBytesAt(uint64_t digest, uint64_t offset, size_t n);

}  // namespace copse::vertex
