#pragma once
// Building the job manager's tasks (protocol/daemon.proto) in daemon tests.
#include <string>

#include "channels/output_store.h"
#include "protocol/daemon.pb.h"
#include "vertex/protocol_types.h"

namespace copse::vertex::testing {

/// An input in this daemon's own store.
inline protocol::Input LocalInput(const chan::OutputKey& key) {
  protocol::Input in;
  *in.mutable_stored()->mutable_key() = ToProtocol(key);
  in.mutable_stored()->mutable_store()->set_local(true);
  return in;
}

/// An input served by the data server at host:port.
inline protocol::Input RemoteInput(const chan::OutputKey& key, const std::string& host, uint16_t port) {
  protocol::Input in;
  *in.mutable_stored()->mutable_key() = ToProtocol(key);
  auto& at = *in.mutable_stored()->mutable_store();
  at.set_local(false);
  at.set_host(host);
  at.set_port(port);
  return in;
}

/// An input whose producer wrote nothing.
inline protocol::Input EmptyInput() {
  protocol::Input in;
  in.mutable_empty();
  return in;
}

/// An output into this daemon's store (CHANNEL_FILE or CHANNEL_MEMORY).
inline protocol::Output StoredOutput(protocol::ChannelKind kind) {
  protocol::Output out;
  out.set_stored(kind);
  return out;
}

}  // namespace copse::vertex::testing
