#pragma once
// ShmRegistry: `shm` channels, in-process FIFOs between two vertices on the same daemon.
//
// One registry per daemon. A channel is created by whichever end opens first (writer or
// reader, in any order) and forgotten when both ends are gone. Messages are the writer's
// Buffers, handed to the reader without copying. The FIFO is bounded by the options of the end
// that created it (window_bytes / window_messages; a message larger than the window is
// accepted when the FIFO is empty): a writer blocks while it is full.
//
// Failures, as a vertex sees them:
//  * the writer destroyed without Close (its vertex failed): the reader gets the messages
//    already queued, then Unavailable instead of end-of-stream;
//  * the reader destroyed before end-of-stream: Write/Close return Unavailable;
//  * the other end never opens within `open_timeout`: Unavailable;
//  * `options.cancel` set, DropJob of the key's job, or the registry destroyed: Cancelled.
// A second writer (or reader) of the same key gets AlreadyExists.
//
// Thread-safety: every method of the registry may be called from any thread; each reader and
// writer is used by one thread at a time. Readers and writers may outlive the registry (they
// then return Cancelled).
#include <map>
#include <memory>
#include <mutex>

#include "channels/channel.h"
#include "channels/stream_key.h"

namespace copse::chan {

class ShmRegistry {
 public:
  ShmRegistry();
  ~ShmRegistry();
  ShmRegistry(const ShmRegistry&) = delete;
  ShmRegistry& operator=(const ShmRegistry&) = delete;

  Result<std::unique_ptr<ChannelWriter>> OpenWriter(const StreamKey& key, StreamOptions options);
  Result<std::unique_ptr<ChannelReader>> OpenReader(const StreamKey& key, StreamOptions options);
  /// Forget every channel of a job (gang restart or job end): blocked ends return Cancelled.
  void DropJob(uint64_t job);
  /// Channels currently known (for tests and diagnostics).
  size_t channels() const;
  /// Bytes queued in every FIFO (written, not yet read).
  size_t buffered_bytes() const;

  struct Shared;  // internal

 private:
  std::shared_ptr<Shared> shared_;
};

}  // namespace copse::chan
