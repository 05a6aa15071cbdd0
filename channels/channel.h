#pragma once
// The two ends of a channel as a vertex program sees them: an ordered sequence of messages
// ending in end-of-stream. Every channel kind (file, memory, stream, shm, nccl) implements
// these; a program never knows which kind it reads or writes.
//
// One reader or writer is used by one vertex thread at a time (not thread-safe).
#include <optional>

#include "channels/buffer.h"
#include "common/status.h"

namespace copse::chan {

class ChannelReader {
 public:
  virtual ~ChannelReader() = default;
  /// The next message, or nullopt at end of stream. Errors: DataLoss when stored bytes fail
  /// their checksum or are gone (the producer must be re-run), Unavailable when the producer's
  /// daemon cannot be reached, Cancelled when the vertex was cancelled.
  virtual Result<std::optional<Buffer>> Next() = 0;
};

class ChannelWriter {
 public:
  virtual ~ChannelWriter() = default;
  /// Appends one message. May block for back-pressure on live channels.
  virtual Status Write(Buffer message) = 0;
  /// Marks end of stream; the channel's data becomes visible to consumers as complete.
  virtual Status Close() = 0;
};

}  // namespace copse::chan
