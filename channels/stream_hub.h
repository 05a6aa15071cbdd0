#pragma once
// StreamHub: `stream` channels, live pipes over ZeroMQ between vertices on different daemons
// (or different processes on one host).
//
// One hub per daemon. It receives stream data for this daemon's consumers on one ROUTER socket
// (bound to tcp:// and, for same-host peers, ipc://) and sends its producers' data to peer hubs
// through one DEALER per peer hub. Every ZeroMQ socket lives on the hub's I/O thread; readers
// and writers talk to it through a command queue woken by an eventfd.
//
// Flow control is credit-based, per channel: a writer may have at most `window_bytes` /
// `window_messages` written and not yet read by the consumer vertex (a single message larger
// than the window goes alone); beyond that Write() blocks. The consumer's hub returns credit
// as its reader consumes messages (batched: a quarter window, or whenever its queue runs dry),
// on the same connection. So the bytes a consumer hub holds for a channel never exceed the
// producer's window (see buffered_bytes()), and ZeroMQ's own high-water marks are off.
//
// Failure detection: both hubs heartbeat every 100 ms on every connection that carries a live
// channel. A reader whose producer's hub has been silent longer than `peer_timeout` (killed,
// partitioned, hung) gets Unavailable; so does a writer blocked on credit whose consumer's hub
// is silent. A writer destroyed without Close() (its vertex failed) sends an abort: the reader
// gets Unavailable at once. A reader destroyed before end-of-stream aborts its writer likewise.
// Per-channel sequence numbers turn messages lost across a ZeroMQ reconnect into Unavailable.
//
// Authentication: a channel's first frame (open) carries HMAC-SHA256(secret, key, nonce,
// window); frames for a channel that was not opened by an authenticated open from the same
// connection, and malformed frames, are dropped and counted (dropped_frames()), never fatal.
// Without encryption the data itself is neither encrypted nor MACed. With it (Start's
// `encrypt`, which a daemon sets when its cluster runs TLS), every connection of the hub runs
// CurveZMQ: each hub's ROUTER is a CURVE server with one key pair derived from the cluster's
// secret (HMAC-SHA256(secret, "copse-stream-curve/1") as the Curve25519 secret key), so any
// member of the cluster knows every hub's public key and nobody else does; DEALERs connect with
// a key pair of their own, made at Start. A peer without the key, or without CURVE, is refused
// by ZeroMQ's handshake before any frame reaches the hub. A producer that
// sends beyond the window it opened with fails the channel (DataLoss) and is aborted; one that
// opens with a window above the caps below (another build's) is aborted with the reason.
//
// Wire format (ZeroMQ multipart; DEALER->ROUTER frames gain the routing id in front):
//   part 1: 40-byte header, little-endian: u32 magic "CPSS", u8 type, 3 pad, u64 job,
//           u32 channel, u32 version, u64 a, u64 b; then type-specific bytes
//   open      P->C  a=window bytes (<= 1 GiB), b=window messages (<= 2^20); then nonce (32 hex) + mac (64 hex)
//   data      P->C  a=sequence number; part 2: the message bytes
//   end       P->C  a=messages sent
//   abort     both  the other end failed or went away; then a reason (text)
//   credit    C->P  a=bytes, b=messages consumed
//   heartbeat both  key unused
//
// Thread-safety: every hub method may be called from any thread; each reader and writer is
// used by one thread at a time. Readers and writers may outlive the hub (they then return
// Cancelled).
//
// Usage:
//   auto hub = StreamHub::Start("10.0.0.7", 0, work_dir / "ipc", secret);   // each daemon
//   publish (*hub)->endpoints() through the job manager
//   producer: auto w = hub->OpenWriter(consumer_endpoints, key, {}); w->Write(b) …; w->Close();
//   consumer: auto r = hub->OpenReader(key, {}); while (auto m = r->Next(); m.ok() && *m) …
#include <atomic>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>

#include "channels/channel.h"
#include "channels/stream_key.h"
#include "common/json_util.h"

namespace copse::chan {

class StreamHub {
 public:
  /// Binds tcp://host:port (0 = any free port) and, unless `ipc_dir` is empty, an ipc://
  /// endpoint (a socket file) under `ipc_dir` (created if absent). `secret` authenticates peers;
  /// with `encrypt`, every connection runs CurveZMQ (above), ipc:// ones included.
  static Result<std::unique_ptr<StreamHub>> Start(const std::string& host, uint16_t port, std::filesystem::path ipc_dir,
                                                  std::string secret, bool encrypt = false);
  ~StreamHub();
  StreamHub(const StreamHub&) = delete;
  StreamHub& operator=(const StreamHub&) = delete;

  /// What to publish to the job manager: tcp "tcp://127.0.0.1:5555", ipc
  /// "ipc:///…/stream-123-0.sock" (empty without an ipc_dir), host "<hostname>".
  StreamPeer endpoints() const;

  /// Producer side: messages go to the hub at `peer` (its endpoints()): over ipc:// when the
  /// peer's "host" equals ours and it has an ipc endpoint, else over tcp://. Write() blocks
  /// while the window is full; Close() queues end-of-stream and returns. AlreadyExists when
  /// this hub already has a writer for `key`; InvalidArgument when `peer`'s endpoint is not
  /// tcp:// or ipc://.
  Result<std::unique_ptr<ChannelWriter>> OpenWriter(const StreamPeer& peer, const StreamKey& key, StreamOptions options);

  /// Consumer side: the messages a producer sends for `key`, in order, then end-of-stream. May
  /// be opened before or after the producer starts (data arriving first is held, within the
  /// producer's window). Unavailable when the producer goes silent longer than peer_timeout,
  /// aborts, or never appears within open_timeout; Cancelled on options.cancel or DropJob.
  Result<std::unique_ptr<ChannelReader>> OpenReader(const StreamKey& key, StreamOptions options);

  /// Forget every channel of a job (gang restart or job end): blocked readers/writers of it
  /// return Cancelled, and their peers are told (they get Unavailable).
  void DropJob(uint64_t job);

  /// Bytes received and held for consumers (not yet read), over every channel.
  size_t buffered_bytes() const;
  /// Bytes written by this hub's producers and not yet credited by their consumers.
  size_t in_flight_bytes() const;
  /// Frames dropped as malformed or unauthenticated since Start.
  uint64_t dropped_frames() const;

  struct Impl;  // internal

 private:
  explicit StreamHub(std::shared_ptr<Impl> impl);
  std::shared_ptr<Impl> impl_;
};

}  // namespace copse::chan
