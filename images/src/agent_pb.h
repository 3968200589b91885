// gpu.proto's messages, which the agent protocol, the keeper link and the
// manifest all carry, to and from their protobuf-c structs: one codec of a
// GPU and of an allocation for the three (inside images/src only).
#pragma once

#include <vector>

#include "gpu.pb-c.h"
#include "pb_codec.h"
#include "phos/images/agent_messages.h"
#include "phos/images/gpu_device.h"

namespace phos::pb {

// `m` initialized, then filled from `a` (no chunks: an image adds its own);
// it points into nothing.
void to_pb(const agent::Allocation& a, Phos__Gpu__Allocation& m);
// Its chunks, if any, are not read (the agent and the keeper send none).
agent::Allocation from_pb(const Phos__Gpu__Allocation& m);
// A repeated Allocation field of the agent or the keeper, both ways.
Repeated<Phos__Gpu__Allocation> allocations_to_pb(const std::vector<agent::Allocation>& allocations);
std::vector<agent::Allocation> allocations_from_pb(Phos__Gpu__Allocation* const* items, size_t n);

// `m` initialized, then filled from `d`, every field (an image's device has
// them all; the agent's name is empty, its sizes 0); it points into `d`.
void to_pb(const GpuDevice& d, Phos__Gpu__Device& m);
// EPROTO where its UUID is not 16 bytes, naming the device. Absent fields
// read as empty, or 0.
Result<GpuDevice> from_pb(const Phos__Gpu__Device& m);

}  // namespace phos::pb
