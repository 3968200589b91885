#include "agent_pb.h"

#include <cstring>
#include <string>

namespace phos::pb {

void to_pb(const agent::Allocation& a, Phos__Gpu__Allocation& m) {
  phos__gpu__allocation__init(&m);
  m.id = a.id;
  m.device = a.device;
  m.address = a.address;
  m.size = a.size;
  m.flags = a.flags;
  if (a.ipc) {
    pb::set_present(m.has_ipc_owner_pid, m.ipc_owner_pid, a.ipc->owner_pid);
    pb::set_present(m.has_ipc_owner_allocation, m.ipc_owner_allocation, a.ipc->owner_allocation);
    m.ipc_owner_agent = c_text(a.ipc->owner_agent);
  }
}

agent::Allocation from_pb(const Phos__Gpu__Allocation& m) {
  agent::Allocation a{.id = m.id, .device = m.device, .address = m.address, .size = m.size, .flags = m.flags};
  if (m.has_ipc_owner_pid)
    a.ipc = agent::IpcSource{.owner_pid = m.ipc_owner_pid,
                             .owner_allocation = m.ipc_owner_allocation,
                             .owner_agent = text(m.ipc_owner_agent)};
  return a;
}

Repeated<Phos__Gpu__Allocation> allocations_to_pb(const std::vector<agent::Allocation>& allocations) {
  return Repeated<Phos__Gpu__Allocation>(phos__gpu__allocation__init, allocations,
                                         [](const agent::Allocation& a, Phos__Gpu__Allocation& m) { to_pb(a, m); });
}

std::vector<agent::Allocation> allocations_from_pb(Phos__Gpu__Allocation* const* items, size_t n) {
  return decode_each(items, n, [](const Phos__Gpu__Allocation& m) { return from_pb(m); });
}

void to_pb(const GpuDevice& d, Phos__Gpu__Device& m) {
  phos__gpu__device__init(&m);
  m.ordinal = d.ordinal;
  m.uuid = {d.uuid.size(), const_cast<uint8_t*>(d.uuid.data())};
  // Always, as manifest.proto's Device (which required the first two) had
  // them: an image stays what a phos of before reads.
  m.name = c_text(d.name);
  set_present(m.has_total_memory, m.total_memory, d.total_memory);
  set_present(m.has_compute_major, m.compute_major, d.compute_major);
  set_present(m.has_compute_minor, m.compute_minor, d.compute_minor);
}

Result<GpuDevice> from_pb(const Phos__Gpu__Device& m) {
  GpuDevice out{.ordinal = m.ordinal,
                .uuid = {},
                .name = text(m.name),
                .total_memory = value_or_zero(m.has_total_memory, m.total_memory),
                .compute_major = value_or_zero(m.has_compute_major, m.compute_major),
                .compute_minor = value_or_zero(m.has_compute_minor, m.compute_minor)};
  if (m.uuid.len != out.uuid.size())
    return make_error("device " + std::to_string(m.ordinal) + " has a UUID of " + std::to_string(m.uuid.len) +
                          " bytes, not " + std::to_string(out.uuid.size()),
                      EPROTO);
  std::memcpy(out.uuid.data(), m.uuid.data, out.uuid.size());
  return out;
}

}  // namespace phos::pb
