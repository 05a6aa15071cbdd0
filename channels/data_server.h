#pragma once
// DataServer: serves a daemon's OutputStore to other daemons and to clients over TCP.
//
// Protocol (common/wire.h frames, one request at a time per connection, connections reused):
//   server -> {"op":"hello","nonce":N,"version":3}
//   client -> {"op":"auth","role":"peer"|"client","mac":HMAC(secret,N),"nonce":C}
//   server -> {"op":"welcome","proof":…} (common/auth.h), or {"op":"error","message":…} and closes
//   then, repeatedly, protocol buffers of protocol/data.proto (its comments are the contract):
//   client -> DataRequest{fetch{key, wait_ms}}   (kProto; with wait_ms, an output not stored
//             yet is waited for up to that long, at most 5 s, before the answer: a consumer
//             chained after a producer still running. One that has not appeared by then ends
//             with code "Timeout", and the consumer asks again; one removed meanwhile (a
//             fault) ends "NotFound".)
//   server -> kData frames (record_format.h: batches of whole messages, or pieces of a large
//             one; every message carries its xxh3), then one kEnd frame whose body is a
//             FetchEnd: {ok, messages, bytes} or {code: "NotFound"…, message}
//   client -> DataRequest{ping}  server -> DataReply{pong}   (kProto)
//
// Same host: the server also listens on a local (Unix domain) socket in Linux's abstract
// namespace, LocalSocketName(host, port), reachable only from this host and network namespace.
// The protocol there is the same, over a socket that skips the TCP/IP stack, except that a fetch
// of a file output with messages is answered by one kEnd frame
// FetchEnd{ok, messages, bytes, handoff: true} carrying the file's descriptor (SCM_RIGHTS),
// opened read-only: the reader reads the page cache itself, and no byte crosses the socket. The
// fast path for daemons on one host (`copse run`; one daemon per GPU).
//
// A peer that sends garbage, a wrong version, an oversized frame, a request that breaks the
// schema (the error names the field) or a bad MAC gets {"op":"error","message":…} (when the
// connection still allows it) and is disconnected.
//
// Threads: one acceptor thread and one thread per connection (blocking I/O; a slow or hostile
// peer only ever blocks its own thread). The whole handshake must finish within
// `handshake_timeout_ms`, however slowly its bytes trickle in (the acceptor shuts down a
// connection that overruns it), and at most `max_handshaking` connections may be in their
// handshake at once (a new one beyond that closes the oldest, so idle unauthenticated peers
// cannot lock real ones out); an idle authenticated connection may stay open (the fetching
// side pools it). Out of descriptors or threads, the acceptor closes what it cannot serve and backs off
// rather than spin or end the daemon. Stop() closes every connection and joins every thread.
#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "channels/output_store.h"
#include "common/status.h"
#include "common/tls.h"

namespace copse::chan {

struct DataServerOptions {
  int handshake_timeout_ms = 10'000;
  int frame_timeout_ms = 30'000;  // for the rest of a frame once its first byte arrived
  /// Also serve readers on this host through LocalSocketName.
  bool local_socket = true;
  /// At most this many connections in their handshake (each holds a thread, and a peer need
  /// not know the secret to open them): a new one beyond them closes the oldest.
  int max_handshaking = 64;
  /// When set, TCP connections run over TLS (common/tls.h: the banner, the handshake, then the
  /// protocol above); the local socket stays plaintext.
  std::shared_ptr<const tls::Context> tls;
};

/// The abstract-namespace name of the local socket of the data server listening on host:port.
std::string LocalSocketName(const std::string& host, uint16_t port);

class DataServer {
 public:
  /// Listens on host:port (port 0 = any free port). `store` must outlive the server.
  static Result<std::unique_ptr<DataServer>> Start(OutputStore& store, const std::string& host, uint16_t port, std::string secret,
                                                   DataServerOptions options = {});
  ~DataServer();
  DataServer(const DataServer&) = delete;
  DataServer& operator=(const DataServer&) = delete;

  uint16_t port() const;
  /// Closes the listener and every connection; idempotent (also run by the destructor).
  void Stop();

  /// Connections accepted since Start (pooling keeps this far below the number of fetches).
  uint64_t connections_accepted() const;
  /// Fetch requests served (complete or not).
  uint64_t fetches() const;
  /// Fetches of file outputs answered with the file's descriptor (same-host readers).
  uint64_t handoffs() const;
  /// Whether the local socket is up (false when disabled or when its name was taken).
  bool serves_local() const;

 private:
  struct Impl;
  explicit DataServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace copse::chan
