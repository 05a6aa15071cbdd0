#pragma once
// The job manager's messages to daemons (protocol/daemon.proto's JmToDaemon), built in one
// place. The scheduler builds the large ones (Run's tasks) itself, from its state.
#include <cstdint>
#include <optional>
#include <string>

#include "common/ids.h"
#include "jobmanager/job_spec.h"
#include "protocol/daemon.pb.h"

namespace copse::jm::daemon_msg {

/// Stop the attempts of `vertex` (any version), or of the whole job without one.
protocol::JmToDaemon Cancel(JobId job, std::optional<VertexId> vertex = std::nullopt, uint32_t version = 0);
/// The job is over: drop its outputs except those `keep` names (filled by the caller).
protocol::JmToDaemon Gc(JobId job);
protocol::JmToDaemon PeerLost(const std::string& data_host, uint16_t data_port);
protocol::JmToDaemon NcclId(const std::string& group, const std::string& id);
protocol::JmToDaemon Kill();
protocol::JmToDaemon Cut(int64_t ms);
/// Copy output `key` from the data server at host:port into the daemon's memory (a mirror).
protocol::JmToDaemon Mirror(const protocol::OutputKey& key, const std::string& data_host, uint16_t data_port);
/// Injected damage to outputs (keys filled by the caller).
protocol::JmToDaemon Damage(protocol::DamageOutputs::Damage damage);

/// A channel kind as the protocol names it (kOrder carries no data: unspecified).
protocol::ChannelKind ToProtocol(ChannelKind kind);

}  // namespace copse::jm::daemon_msg
