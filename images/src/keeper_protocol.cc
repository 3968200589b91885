#include "phos/images/keeper_protocol.h"

#include <algorithm>
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

// The message of one kind: its oneof field `field` points to `body`.
template <typename Body>
std::vector<std::byte> pack(Phos__Keeper__Message__KindCase kind, Body* Phos__Keeper__Message::*field, Body& body) {
  Phos__Keeper__Message m = PHOS__KEEPER__MESSAGE__INIT;
  m.kind_case = kind;
  m.*field = &body;
  return pack(m);
}

// The allocation list of a message, as protobuf-c wants it; `allocs` owns
// the structs `ptrs` points to.
void to_pb_list(const std::vector<agent::Allocation>& in, std::vector<Phos__Agent__Allocation>& allocs,
                std::vector<Phos__Agent__Allocation*>& ptrs) {
  allocs.resize(in.size());
  for (size_t i = 0; i < allocs.size(); i++) {
    agent::pb::to_pb(in[i], allocs[i]);
    ptrs.push_back(&allocs[i]);
  }
}

std::vector<agent::Allocation> from_pb_list(Phos__Agent__Allocation* const* allocs, size_t n) {
  std::vector<agent::Allocation> out;
  for (size_t i = 0; i < n; i++) out.push_back(agent::pb::from_pb(*allocs[i]));
  return out;
}

std::vector<std::byte> encode(const Hold& h) {
  std::vector<Phos__Agent__Allocation> allocs;
  std::vector<Phos__Agent__Allocation*> ptrs;
  to_pb_list(h.allocations, allocs, ptrs);
  Phos__Keeper__Hold hold = PHOS__KEEPER__HOLD__INIT;
  hold.pid = h.pid;
  hold.n_allocations = ptrs.size();
  hold.allocations = ptrs.data();
  return pack(PHOS__KEEPER__MESSAGE__KIND_HOLD, &Phos__Keeper__Message::hold, hold);
}

std::vector<std::byte> encode(const State& s) {
  Phos__Keeper__State state = PHOS__KEEPER__STATE__INIT;
  state.pid = s.pid;
  state.taken = s.taken;
  return pack(PHOS__KEEPER__MESSAGE__KIND_STATE, &Phos__Keeper__Message::state, state);
}

std::vector<std::byte> encode(const Done&) {
  Phos__Keeper__Done done = PHOS__KEEPER__DONE__INIT;
  return pack(PHOS__KEEPER__MESSAGE__KIND_DONE, &Phos__Keeper__Message::done, done);
}

std::vector<std::byte> encode(const Restoring& r) {
  Phos__Keeper__Restoring restoring = PHOS__KEEPER__RESTORING__INIT;
  restoring.pid = r.pid;
  restoring.has_restored = r.restored;
  restoring.restored = r.restored;
  return pack(PHOS__KEEPER__MESSAGE__KIND_RESTORING, &Phos__Keeper__Message::restoring, restoring);
}

std::vector<std::byte> encode(const RestoreStarted& r) {
  Phos__Keeper__RestoreStarted started = PHOS__KEEPER__RESTORE_STARTED__INIT;
  started.criu_pid = r.criu_pid;
  return pack(PHOS__KEEPER__MESSAGE__KIND_RESTORE_STARTED, &Phos__Keeper__Message::restore_started, started);
}

std::vector<std::byte> encode(const Keep& k) {
  std::vector<Phos__Agent__Allocation> allocs;
  std::vector<Phos__Agent__Allocation*> ptrs;
  to_pb_list(k.allocations, allocs, ptrs);
  Phos__Keeper__Keep keep = PHOS__KEEPER__KEEP__INIT;
  keep.pid = k.pid;
  keep.migration = const_cast<char*>(k.migration.c_str());
  keep.vpid = k.vpid;
  keep.keep_s = k.keep_s;
  keep.n_allocations = ptrs.size();
  keep.allocations = ptrs.data();
  return pack(PHOS__KEEPER__MESSAGE__KIND_KEEP, &Phos__Keeper__Message::keep, keep);
}

std::vector<std::byte> encode(const KeepCommitted& k) {
  Phos__Keeper__KeepCommitted committed = PHOS__KEEPER__KEEP_COMMITTED__INIT;
  committed.pid = k.pid;
  return pack(PHOS__KEEPER__MESSAGE__KIND_KEEP_COMMITTED, &Phos__Keeper__Message::keep_committed, committed);
}

std::vector<std::byte> encode(const TakeKept& t) {
  Phos__Keeper__TakeKept take = PHOS__KEEPER__TAKE_KEPT__INIT;
  take.migration = const_cast<char*>(t.migration.c_str());
  take.vpid = t.vpid;
  return pack(PHOS__KEEPER__MESSAGE__KIND_TAKE_KEPT, &Phos__Keeper__Message::take_kept, take);
}

std::vector<std::byte> encode(const Kept& k) {
  std::vector<Phos__Agent__Allocation> allocs;
  std::vector<Phos__Agent__Allocation*> ptrs;
  to_pb_list(k.allocations, allocs, ptrs);
  Phos__Keeper__Kept kept = PHOS__KEEPER__KEPT__INIT;
  kept.n_allocations = ptrs.size();
  kept.allocations = ptrs.data();
  kept.last = k.last;
  if (!k.error.empty()) kept.error = const_cast<char*>(k.error.c_str());
  return pack(PHOS__KEEPER__MESSAGE__KIND_KEPT, &Phos__Keeper__Message::kept, kept);
}

std::vector<std::byte> encode(const Taken& t) {
  Phos__Keeper__Taken taken = PHOS__KEEPER__TAKEN__INIT;
  taken.vpid = t.vpid;
  taken.restored = t.restored;
  taken.has_spoilt = t.spoilt;
  taken.spoilt = t.spoilt;
  return pack(PHOS__KEEPER__MESSAGE__KIND_TAKEN, &Phos__Keeper__Message::taken, taken);
}

Result<Message> decode(const Phos__Keeper__Message& m) {
  switch (m.kind_case) {
    case PHOS__KEEPER__MESSAGE__KIND_HOLD: {
      return Message(Hold{m.hold->pid, from_pb_list(m.hold->allocations, m.hold->n_allocations)});
    }
    case PHOS__KEEPER__MESSAGE__KIND_STATE:
      return Message(State{m.state->pid, m.state->taken});
    case PHOS__KEEPER__MESSAGE__KIND_DONE:
      return Message(Done{});
    case PHOS__KEEPER__MESSAGE__KIND_RESTORING:
      return Message(Restoring{m.restoring->pid, bool(m.restoring->restored)});
    case PHOS__KEEPER__MESSAGE__KIND_RESTORE_STARTED:
      return Message(RestoreStarted{m.restore_started->criu_pid});
    case PHOS__KEEPER__MESSAGE__KIND_KEEP:
      return Message(Keep{m.keep->pid, m.keep->migration ? m.keep->migration : "",
                          from_pb_list(m.keep->allocations, m.keep->n_allocations), m.keep->vpid, m.keep->keep_s});
    case PHOS__KEEPER__MESSAGE__KIND_KEEP_COMMITTED:
      return Message(KeepCommitted{m.keep_committed->pid});
    case PHOS__KEEPER__MESSAGE__KIND_TAKE_KEPT:
      return Message(TakeKept{m.take_kept->migration ? m.take_kept->migration : "", m.take_kept->vpid});
    case PHOS__KEEPER__MESSAGE__KIND_KEPT:
      return Message(Kept{from_pb_list(m.kept->allocations, m.kept->n_allocations), bool(m.kept->last),
                          m.kept->error ? m.kept->error : ""});
    case PHOS__KEEPER__MESSAGE__KIND_TAKEN:
      return Message(Taken{m.taken->vpid, bool(m.taken->restored), bool(m.taken->spoilt)});
    default:
      break;
  }
  return make_error("malformed keeper message: " + agent::pb::no_kind(m.base), EPROTO);
}

}  // namespace

std::string kept_socket_name(std::string_view migration) { return "phos-kept." + std::string(migration); }

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

Result<void> send_allocations(int sock, const std::vector<agent::Allocation>& allocations,
                              const std::vector<UniqueFd>& fds,
                              const std::function<Message(std::vector<agent::Allocation> slice, bool last)>& make) {
  if (allocations.size() != fds.size()) return make_error("keeper: one fd per allocation expected", EINVAL);
  size_t at = 0;
  do {
    const size_t end = std::min(allocations.size(), at + wire::kMaxFdsPerFrame);
    std::vector<int> raw;
    for (size_t i = at; i < end; i++) raw.push_back(fds[i].get());
    std::vector<agent::Allocation> slice(allocations.begin() + long(at), allocations.begin() + long(end));
    PHOS_TRY(send_message(sock, make(std::move(slice), end == allocations.size()), raw));
    at = end;
  } while (at < allocations.size());
  return {};
}

Result<ReceivedMessage> recv_message(int sock, int timeout_ms) {
  auto frame = wire::recv_frame(sock, timeout_ms);
  if (!frame) return frame.error();
  auto message = decode_message(frame->payload);
  if (!message) return message.error();
  return ReceivedMessage{std::move(*message), std::move(frame->fds)};
}

}  // namespace phos::keeper
