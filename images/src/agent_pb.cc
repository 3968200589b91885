#include "agent_pb.h"

#include <cstring>
#include <string>

namespace phos::pb {

void to_pb(const agent::Allocation& a, Phos__Agent__Allocation& m) {
  phos__agent__allocation__init(&m);
  m.id = a.id;
  m.device = a.device;
  m.address = a.address;
  m.size = a.size;
  m.flags = a.flags;
}

agent::Allocation from_pb(const Phos__Agent__Allocation& m) {
  return agent::Allocation{.id = m.id, .device = m.device, .address = m.address, .size = m.size, .flags = m.flags};
}

Repeated<Phos__Agent__Allocation> allocations_to_pb(const std::vector<agent::Allocation>& allocations) {
  return Repeated<Phos__Agent__Allocation>(phos__agent__allocation__init, allocations,
                                           [](const agent::Allocation& a, Phos__Agent__Allocation& m) { to_pb(a, m); });
}

std::vector<agent::Allocation> allocations_from_pb(Phos__Agent__Allocation* const* items, size_t n) {
  return decode_each(items, n, [](const Phos__Agent__Allocation& m) { return from_pb(m); });
}

void to_pb(const GpuDevice& d, Phos__Agent__Device& m) {
  phos__agent__device__init(&m);
  m.ordinal = d.ordinal;
  m.uuid = {d.uuid.size(), const_cast<uint8_t*>(d.uuid.data())};
}

Result<GpuDevice> from_pb(const Phos__Agent__Device& m) {
  GpuDevice out{.ordinal = m.ordinal};
  if (m.uuid.len != out.uuid.size())
    return make_error("device " + std::to_string(m.ordinal) + " has a UUID of " + std::to_string(m.uuid.len) +
                          " bytes, not " + std::to_string(out.uuid.size()),
                      EPROTO);
  std::memcpy(out.uuid.data(), m.uuid.data, out.uuid.size());
  return out;
}

}  // namespace phos::pb
