// The messages that the agent protocol and the keeper link both carry, to
// and from their protobuf-c structs, written once (inside images/src only).
#pragma once

#include <vector>

#include "agent.pb-c.h"
#include "pb_codec.h"
#include "phos/images/agent_messages.h"

namespace phos::pb {

// `m` initialized, then filled from `a`; it points into nothing.
void to_pb(const agent::Allocation& a, Phos__Agent__Allocation& m);
agent::Allocation from_pb(const Phos__Agent__Allocation& m);
// A repeated Allocation field, both ways.
Repeated<Phos__Agent__Allocation> allocations_to_pb(const std::vector<agent::Allocation>& allocations);
std::vector<agent::Allocation> allocations_from_pb(Phos__Agent__Allocation* const* items, size_t n);

// `m` initialized, then filled from `d`; it points into `d`.
void to_pb(const GpuDevice& d, Phos__Agent__Device& m);
// EPROTO where its UUID is not 16 bytes, naming the device.
Result<GpuDevice> from_pb(const Phos__Agent__Device& m);

}  // namespace phos::pb
