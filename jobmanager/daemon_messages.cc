#include "jobmanager/daemon_messages.h"

namespace copse::jm::daemon_msg {

protocol::JmToDaemon Cancel(JobId job, std::optional<VertexId> vertex, uint32_t version) {
  protocol::JmToDaemon m;
  auto* cancel = m.mutable_cancel();
  cancel->set_job(job.value());
  if (vertex) cancel->set_vertex(vertex->value());
  cancel->set_version(version);
  return m;
}

protocol::JmToDaemon Gc(JobId job) {
  protocol::JmToDaemon m;
  m.mutable_gc()->set_job(job.value());
  return m;
}

protocol::JmToDaemon Mirror(const protocol::OutputKey& key, const std::string& data_host, uint16_t data_port) {
  protocol::JmToDaemon m;
  *m.mutable_mirror()->mutable_key() = key;
  m.mutable_mirror()->mutable_from()->set_host(data_host);
  m.mutable_mirror()->mutable_from()->set_port(data_port);
  return m;
}

protocol::JmToDaemon PeerLost(const std::string& data_host, uint16_t data_port) {
  protocol::JmToDaemon m;
  m.mutable_peer_lost()->set_host(data_host);
  m.mutable_peer_lost()->set_port(data_port);
  return m;
}

protocol::JmToDaemon NcclId(const std::string& group, const std::string& id) {
  protocol::JmToDaemon m;
  m.mutable_nccl_id()->set_group(group);
  m.mutable_nccl_id()->set_id(id);
  return m;
}

protocol::JmToDaemon Kill() {
  protocol::JmToDaemon m;
  m.mutable_kill();
  return m;
}

protocol::JmToDaemon Cut(int64_t ms) {
  protocol::JmToDaemon m;
  m.mutable_cut()->set_ms(ms);
  return m;
}

protocol::JmToDaemon Damage(protocol::DamageOutputs::Damage damage) {
  protocol::JmToDaemon m;
  m.mutable_damage()->set_damage(damage);
  return m;
}

protocol::ChannelKind ToProtocol(ChannelKind kind) {
  switch (kind) {
    case ChannelKind::kFile: return protocol::CHANNEL_FILE;
    case ChannelKind::kMemory:
    case ChannelKind::kMirrored: return protocol::CHANNEL_MEMORY;  // the copy is made after it completed
    case ChannelKind::kDurable: return protocol::CHANNEL_DURABLE;
    case ChannelKind::kStream: return protocol::CHANNEL_STREAM;
    case ChannelKind::kShm: return protocol::CHANNEL_SHM;
    case ChannelKind::kNccl: return protocol::CHANNEL_NCCL;
    case ChannelKind::kOrder: break;
  }
  return protocol::CHANNEL_KIND_UNSPECIFIED;
}

}  // namespace copse::jm::daemon_msg
