#pragma once
// The consumer side of a `file` or `memory` channel whose producer ran on another daemon:
// fetches the output from that daemon's DataServer (protocol in data_server.h).
//
// Streaming: messages are read from the connection as Next() asks for them, so an output never
// needs to fit in memory. Every message's xxh3 is verified (DataLoss on mismatch).
// Errors: Unavailable when the peer cannot be reached, drops the connection or stays silent
// past `read_timeout_ms`; NotFound/DataLoss when the peer does not hold the output;
// PermissionDenied when it refuses the secret.
//
// Same host: when the peer's data server has a local socket (data_server.h), the reader
// connects there instead of over TCP, and reads a file output from the descriptor the server
// hands over; nothing changes for the caller.
//
// Connections are pooled per (host, port, secret) across readers and threads: a reader takes an
// idle authenticated connection (or opens one), and returns it when it has read the whole
// output. A reader destroyed mid-stream closes its connection instead. A pooled connection the
// peer has closed meanwhile is detected on first use and replaced transparently.
//
// Usage:
//   COPSE_ASSIGN_OR_RETURN(auto in, OpenRemoteReader("10.0.0.7", 7410, key, secret));
//   while (true) { COPSE_ASSIGN_OR_RETURN(auto m, in->Next()); if (!m) break; Use(*m); }
#include <cstdint>
#include <memory>
#include <string>

#include "channels/channel.h"
#include "channels/output_store.h"
#include "common/tls.h"

namespace copse::chan {

struct RemoteReaderOptions {
  int connect_timeout_ms = 5'000;  // connect + handshake
  int read_timeout_ms = 60'000;    // the longest wait for the next bytes of the output
  /// > 0: an output the peer does not hold yet is waited for up to this long (data_server.h);
  /// Timeout when it has not appeared by then.
  int wait_ms = 0;
  /// Use the peer's local socket when it is on this host (data_server.h).
  bool local_socket = true;
  /// TCP connections over TLS with this context (common/tls.h); null: plaintext.
  std::shared_ptr<const tls::Context> tls;
};

/// A reader of `key` as stored on the daemon whose DataServer listens on host:port.
/// Safe to call from many threads.
Result<std::unique_ptr<ChannelReader>> OpenRemoteReader(const std::string& host, uint16_t port, const OutputKey& key,
                                                        const std::string& secret);
Result<std::unique_ptr<ChannelReader>> OpenRemoteReader(const std::string& host, uint16_t port, const OutputKey& key,
                                                        const std::string& secret, const RemoteReaderOptions& options);

/// Pool figures, for tests and diagnostics.
struct RemotePoolStats {
  uint64_t connections_opened = 0;
  uint64_t local_connections_opened = 0;  // of which to a peer's local socket (same host)
  uint64_t connections_reused = 0;
  uint64_t idle = 0;
};
RemotePoolStats GetRemotePoolStats();
/// Closes every idle pooled connection (e.g. before a daemon exits, or in tests).
void CloseIdleRemoteConnections();
/// Ends at once every fetch from the data server at host:port, in any thread of this process:
/// their readers fail with Unavailable (as if the peer had dropped them), and idle pooled
/// connections to it close. For a peer the job manager declared lost: a stopped or cut-off
/// daemon accepts connections and then says nothing, and its consumers would otherwise wait
/// for `read_timeout_ms` holding their slots. Returns how many fetches it ended.
size_t AbortFetchesFrom(const std::string& host, uint16_t port);

}  // namespace copse::chan
