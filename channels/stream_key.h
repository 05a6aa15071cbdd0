#pragma once
// StreamKey and StreamOptions: what names one live channel execution (`stream`, `shm`) and
// how its two ends behave (window, timeouts, cancellation). Shared by StreamHub
// (channels/stream_hub.h) and ShmRegistry (channels/shm_registry.h). Plain values.
#include <atomic>
#include <chrono>
#include <compare>
#include <cstddef>
#include <cstdint>
#include <string>

#include "common/json_util.h"
#include "common/status.h"

namespace copse::chan {

/// Identifies one live channel execution: the job, the channel id in the expanded graph, and
/// the gang's version (all members of a gang restart together with a new version, so a stale
/// producer never feeds a new consumer).
struct StreamKey {
  uint64_t job = 0;
  uint32_t channel = 0;
  uint32_t version = 0;

  /// "job3/c7.v2"
  std::string ToString() const;
  /// {"job":3,"channel":7,"version":2}
  Json ToJson() const;
  /// InvalidArgument naming the member that is missing or not an unsigned integer in range.
  static Result<StreamKey> FromJson(const Json& j);
  friend auto operator<=>(const StreamKey&, const StreamKey&) = default;
};

/// Where a hub takes live channels (StreamHub::endpoints()), as the job manager relays it to
/// producers.
struct StreamPeer {
  std::string tcp;   // "tcp://host:port"
  std::string ipc;   // "ipc://path", or empty: none
  std::string host;  // its host label: a writer whose hub has the same label uses ipc

  /// {"tcp", "ipc" (when set), "host"}: for tools that pass a peer along as JSON.
  Json ToJson() const;
  /// InvalidArgument naming the member that is not a string.
  static Result<StreamPeer> FromJson(const Json& j);
};

/// How one end of a live channel behaves. Both ends of a channel should use the same window;
/// the producer's governs (it is sent to the consumer when the channel opens).
struct StreamOptions {
  /// Most bytes in flight per channel (written, not yet read): the writer blocks beyond it.
  /// A single message larger than the window is still sent, alone.
  size_t window_bytes = 8 << 20;
  /// Most messages in flight per channel.
  size_t window_messages = 64;
  /// Silence from the peer (no data, no credit, no heartbeat) longer than this: Unavailable.
  /// Hubs heartbeat every 100 ms, so keep this at 300 ms or more. Unused by shm channels,
  /// whose peer dies with the process.
  std::chrono::milliseconds peer_timeout{1000};
  /// How long one end waits for the other end to appear at all (a consumer whose producer
  /// never connects, a producer whose consumer hub never answers or whose shm reader never
  /// opens): Unavailable after it, so a gang member that never started cannot hang its peers.
  std::chrono::milliseconds open_timeout{60000};
  /// When set, a blocked reader/writer returns Cancelled promptly (polled every few ms).
  const std::atomic<bool>* cancel = nullptr;
};

}  // namespace copse::chan
