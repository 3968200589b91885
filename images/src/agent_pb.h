// What the codecs of the agent and keeper protocols share (inside images/src
// only): the Allocation message both carry, and what to say of a message
// whose oneof holds nothing this build knows.
#pragma once

#include <string>

#include "agent.pb-c.h"
#include "phos/images/agent_messages.h"

namespace phos::agent::pb {

// `m` initialized, then filled from `a`; it points into nothing.
void to_pb(const Allocation& a, Phos__Agent__Allocation& m);
Allocation from_pb(const Phos__Agent__Allocation& m);

// "no kind", or "unknown kind (field N)" where the peer sent a kind this
// build does not know (protobuf-c keeps it as an unknown field).
std::string no_kind(const ProtobufCMessage& m);

}  // namespace phos::agent::pb
