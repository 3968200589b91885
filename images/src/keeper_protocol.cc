#include "phos/images/keeper_protocol.h"

#include <string>

#include "agent_pb.h"
#include "keeper.pb-c.h"
#include "phos/images/agent_wire.h"

namespace phos::keeper {
namespace {

std::vector<std::byte> pack(const Phos__Keeper__Message& m) {
  std::vector<std::byte> out(protobuf_c_message_get_packed_size(&m.base));
  protobuf_c_message_pack(&m.base, reinterpret_cast<uint8_t*>(out.data()));
  return out;
}

std::vector<std::byte> encode(const Hold& h) {
  std::vector<Phos__Agent__Allocation> allocs(h.allocations.size());
  std::vector<Phos__Agent__Allocation*> ptrs;
  for (size_t i = 0; i < allocs.size(); i++) {
    agent::pb::to_pb(h.allocations[i], allocs[i]);
    ptrs.push_back(&allocs[i]);
  }
  Phos__Keeper__Hold hold = PHOS__KEEPER__HOLD__INIT;
  hold.pid = h.pid;
  hold.n_allocations = ptrs.size();
  hold.allocations = ptrs.data();
  Phos__Keeper__Message m = PHOS__KEEPER__MESSAGE__INIT;
  m.kind_case = PHOS__KEEPER__MESSAGE__KIND_HOLD;
  m.hold = &hold;
  return pack(m);
}

std::vector<std::byte> encode(const State& s) {
  Phos__Keeper__State state = PHOS__KEEPER__STATE__INIT;
  state.pid = s.pid;
  state.taken = s.taken;
  Phos__Keeper__Message m = PHOS__KEEPER__MESSAGE__INIT;
  m.kind_case = PHOS__KEEPER__MESSAGE__KIND_STATE;
  m.state = &state;
  return pack(m);
}

std::vector<std::byte> encode(const Done&) {
  Phos__Keeper__Done done = PHOS__KEEPER__DONE__INIT;
  Phos__Keeper__Message m = PHOS__KEEPER__MESSAGE__INIT;
  m.kind_case = PHOS__KEEPER__MESSAGE__KIND_DONE;
  m.done = &done;
  return pack(m);
}

std::vector<std::byte> encode(const Restoring& r) {
  Phos__Keeper__Restoring restoring = PHOS__KEEPER__RESTORING__INIT;
  restoring.pid = r.pid;
  restoring.has_restored = r.restored;
  restoring.restored = r.restored;
  Phos__Keeper__Message m = PHOS__KEEPER__MESSAGE__INIT;
  m.kind_case = PHOS__KEEPER__MESSAGE__KIND_RESTORING;
  m.restoring = &restoring;
  return pack(m);
}

std::vector<std::byte> encode(const RestoreStarted& r) {
  Phos__Keeper__RestoreStarted started = PHOS__KEEPER__RESTORE_STARTED__INIT;
  started.criu_pid = r.criu_pid;
  Phos__Keeper__Message m = PHOS__KEEPER__MESSAGE__INIT;
  m.kind_case = PHOS__KEEPER__MESSAGE__KIND_RESTORE_STARTED;
  m.restore_started = &started;
  return pack(m);
}

Result<Message> decode(const Phos__Keeper__Message& m) {
  switch (m.kind_case) {
    case PHOS__KEEPER__MESSAGE__KIND_HOLD: {
      Hold out{m.hold->pid, {}};
      for (size_t i = 0; i < m.hold->n_allocations; i++)
        out.allocations.push_back(agent::pb::from_pb(*m.hold->allocations[i]));
      return Message(std::move(out));
    }
    case PHOS__KEEPER__MESSAGE__KIND_STATE:
      return Message(State{m.state->pid, m.state->taken});
    case PHOS__KEEPER__MESSAGE__KIND_DONE:
      return Message(Done{});
    case PHOS__KEEPER__MESSAGE__KIND_RESTORING:
      return Message(Restoring{m.restoring->pid, bool(m.restoring->restored)});
    case PHOS__KEEPER__MESSAGE__KIND_RESTORE_STARTED:
      return Message(RestoreStarted{m.restore_started->criu_pid});
    default:
      break;
  }
  return make_error("malformed keeper message: " + agent::pb::no_kind(m.base), EPROTO);
}

}  // namespace

std::vector<std::byte> encode_message(const Message& message) {
  return std::visit([](const auto& m) { return encode(m); }, message);
}

Result<Message> decode_message(std::span<const std::byte> payload) {
  auto* m = phos__keeper__message__unpack(nullptr, payload.size(), reinterpret_cast<const uint8_t*>(payload.data()));
  if (!m) return make_error("malformed keeper message: payload does not parse", EPROTO);
  auto out = decode(*m);
  phos__keeper__message__free_unpacked(m, nullptr);
  return out;
}

Result<void> send_message(int sock, const Message& message, std::span<const int> fds) {
  return wire::send_frame(sock, encode_message(message), fds);
}

Result<ReceivedMessage> recv_message(int sock, int timeout_ms) {
  auto frame = wire::recv_frame(sock, timeout_ms);
  if (!frame) return frame.error();
  auto message = decode_message(frame->payload);
  if (!message) return message.error();
  return ReceivedMessage{std::move(*message), std::move(frame->fds)};
}

}  // namespace phos::keeper
