#pragma once
// The protocol's shared types (protocol/types.proto) as the channels spell them: the daemon is
// where the two meet (the channels library knows nothing of the protocol).
#include "channels/output_store.h"
#include "channels/stream_key.h"
#include "protocol/types.pb.h"

namespace copse::vertex {

inline chan::OutputKey FromProtocol(const protocol::OutputKey& k) { return {k.job(), k.vertex(), k.version(), k.port()}; }
inline chan::StreamKey FromProtocol(const protocol::StreamKey& k) { return {k.job(), k.channel(), k.version()}; }
inline chan::StreamPeer FromProtocol(const protocol::StreamEndpoints& e) { return {e.tcp(), e.ipc(), e.host()}; }

inline protocol::OutputKey ToProtocol(const chan::OutputKey& k) {
  protocol::OutputKey out;
  out.set_job(k.job);
  out.set_vertex(k.vertex);
  out.set_version(k.version);
  out.set_port(k.port);
  return out;
}

inline protocol::StreamEndpoints ToProtocol(const chan::StreamPeer& p) {
  protocol::StreamEndpoints out;
  out.set_tcp(p.tcp);
  out.set_ipc(p.ipc);
  out.set_host(p.host);
  return out;
}

}  // namespace copse::vertex
