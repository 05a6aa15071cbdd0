#pragma once
// Channel ends and a host-side all-reduce over an NcclGroup, for `nccl` channels between the
// GPU vertices of a gang. A message travels as an 8-byte length header, then its bytes padded
// to whole floats, staged through a device buffer on the vertex's GPU; end-of-stream is a
// header of all ones. One reader or writer per (group, peer) direction; not thread-safe.
#include <memory>

#include "channels/channel.h"
#include "channels/nccl/nccl_group.h"

namespace copse::chan::nccl {

std::unique_ptr<ChannelWriter> MakeNcclWriter(NcclGroup& group, int peer_rank, int cuda_device);
std::unique_ptr<ChannelReader> MakeNcclReader(NcclGroup& group, int peer_rank, int cuda_device);

/// In-place sum of `count` host floats over every rank of the group (staged on the device).
Status AllReduceHost(NcclGroup& group, float* data, size_t count, int cuda_device);

}  // namespace copse::chan::nccl
