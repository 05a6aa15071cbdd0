#pragma once
// The protocol's shared types as the channels spell them (channels/protocol_keys.h), by their
// names in the daemon's namespace.
#include "channels/protocol_keys.h"

namespace copse::vertex {

using chan::FromProtocol;
using chan::ToProtocol;

}  // namespace copse::vertex
