#include "agent_pb.h"

namespace phos::agent::pb {

void to_pb(const Allocation& a, Phos__Agent__Allocation& m) {
  phos__agent__allocation__init(&m);
  m.id = a.id;
  m.device = a.device;
  m.address = a.address;
  m.size = a.size;
  m.flags = a.flags;
}

Allocation from_pb(const Phos__Agent__Allocation& m) { return Allocation{m.id, m.device, m.address, m.size, m.flags}; }

std::string no_kind(const ProtobufCMessage& m) {
  if (m.n_unknown_fields == 0) return "no kind";
  return "unknown kind (field " + std::to_string(m.unknown_fields[0].tag) + ")";
}

}  // namespace phos::agent::pb
