#pragma once
// The protocol's shared types (protocol/types.proto) as the channels spell them: output keys,
// stream keys and stream endpoints, converted where a message meets the channels (the data
// plane's requests here; the daemon's tasks in vertex/).
#include "channels/output_store.h"
#include "channels/stream_key.h"
#include "protocol/types.pb.h"

namespace copse::chan {

inline OutputKey FromProtocol(const protocol::OutputKey& k) { return {k.job(), k.vertex(), k.version(), k.port()}; }
inline StreamKey FromProtocol(const protocol::StreamKey& k) { return {k.job(), k.channel(), k.version()}; }
inline StreamPeer FromProtocol(const protocol::StreamEndpoints& e) { return {e.tcp(), e.ipc(), e.host()}; }

inline protocol::OutputKey ToProtocol(const OutputKey& k) {
  protocol::OutputKey out;
  out.set_job(k.job);
  out.set_vertex(k.vertex);
  out.set_version(k.version);
  out.set_port(k.port);
  return out;
}

inline protocol::StreamEndpoints ToProtocol(const StreamPeer& p) {
  protocol::StreamEndpoints out;
  out.set_tcp(p.tcp);
  out.set_ipc(p.ipc);
  out.set_host(p.host);
  return out;
}

}  // namespace copse::chan
