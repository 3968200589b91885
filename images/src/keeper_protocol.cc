#include "phos/images/keeper_protocol.h"

#include <algorithm>
#include <string>

#include "agent_pb.h"
#include "keeper.pb-c.h"
#include "phos/images/agent_wire.h"

namespace phos::keeper {
namespace {

using pb::c_text;
using pb::text;

// The Message with `body` as `kind` of its oneof, packed.
template <class Body>
std::vector<std::byte> message(Phos__Keeper__Message__KindCase kind, Body* Phos__Keeper__Message::*field, Body& body) {
  Phos__Keeper__Message envelope = PHOS__KEEPER__MESSAGE__INIT;
  return pb::pack_oneof(envelope, kind, field, body);
}

std::vector<std::byte> encode(const Hold& h) {
  Phos__Keeper__Hold hold = PHOS__KEEPER__HOLD__INIT;
  hold.pid = h.pid;
  auto allocations = pb::allocations_to_pb(h.allocations);
  allocations.set(hold.n_allocations, hold.allocations);
  return message(PHOS__KEEPER__MESSAGE__KIND_HOLD, &Phos__Keeper__Message::hold, hold);
}

std::vector<std::byte> encode(const State& s) {
  Phos__Keeper__State state = PHOS__KEEPER__STATE__INIT;
  state.pid = s.pid;
  state.taken = s.taken;
  return message(PHOS__KEEPER__MESSAGE__KIND_STATE, &Phos__Keeper__Message::state, state);
}

std::vector<std::byte> encode(const Done&) {
  Phos__Keeper__Done done = PHOS__KEEPER__DONE__INIT;
  return message(PHOS__KEEPER__MESSAGE__KIND_DONE, &Phos__Keeper__Message::done, done);
}

std::vector<std::byte> encode(const Restoring& r) {
  Phos__Keeper__Restoring restoring = PHOS__KEEPER__RESTORING__INIT;
  restoring.pid = r.pid;
  restoring.has_restored = r.restored;  // only where true
  restoring.restored = r.restored;
  return message(PHOS__KEEPER__MESSAGE__KIND_RESTORING, &Phos__Keeper__Message::restoring, restoring);
}

std::vector<std::byte> encode(const RestoreStarted& r) {
  Phos__Keeper__RestoreStarted started = PHOS__KEEPER__RESTORE_STARTED__INIT;
  started.criu_pid = r.criu_pid;
  return message(PHOS__KEEPER__MESSAGE__KIND_RESTORE_STARTED, &Phos__Keeper__Message::restore_started, started);
}

std::vector<std::byte> encode(const Keep& k) {
  Phos__Keeper__Keep keep = PHOS__KEEPER__KEEP__INIT;
  keep.pid = k.pid;
  keep.migration = c_text(k.migration);
  keep.vpid = k.vpid;
  keep.keep_s = k.keep_s;
  auto allocations = pb::allocations_to_pb(k.allocations);
  allocations.set(keep.n_allocations, keep.allocations);
  return message(PHOS__KEEPER__MESSAGE__KIND_KEEP, &Phos__Keeper__Message::keep, keep);
}

std::vector<std::byte> encode(const KeepCommitted& k) {
  Phos__Keeper__KeepCommitted committed = PHOS__KEEPER__KEEP_COMMITTED__INIT;
  committed.pid = k.pid;
  return message(PHOS__KEEPER__MESSAGE__KIND_KEEP_COMMITTED, &Phos__Keeper__Message::keep_committed, committed);
}

std::vector<std::byte> encode(const TakeKept& t) {
  Phos__Keeper__TakeKept take = PHOS__KEEPER__TAKE_KEPT__INIT;
  take.migration = c_text(t.migration);
  take.vpid = t.vpid;
  return message(PHOS__KEEPER__MESSAGE__KIND_TAKE_KEPT, &Phos__Keeper__Message::take_kept, take);
}

std::vector<std::byte> encode(const Kept& k) {
  Phos__Keeper__Kept kept = PHOS__KEEPER__KEPT__INIT;
  auto allocations = pb::allocations_to_pb(k.allocations);
  allocations.set(kept.n_allocations, kept.allocations);
  kept.last = k.last;
  kept.error = pb::c_text_or_null(k.error);
  return message(PHOS__KEEPER__MESSAGE__KIND_KEPT, &Phos__Keeper__Message::kept, kept);
}

std::vector<std::byte> encode(const Taken& t) {
  Phos__Keeper__Taken taken = PHOS__KEEPER__TAKEN__INIT;
  taken.vpid = t.vpid;
  taken.restored = t.restored;
  taken.has_spoilt = t.spoilt;  // only where true
  taken.spoilt = t.spoilt;
  return message(PHOS__KEEPER__MESSAGE__KIND_TAKEN, &Phos__Keeper__Message::taken, taken);
}

Result<Message> decode(const Phos__Keeper__Message& m) {
  switch (m.kind_case) {
    case PHOS__KEEPER__MESSAGE__KIND_HOLD:
      return Message(
          Hold{.pid = m.hold->pid, .allocations = pb::allocations_from_pb(m.hold->allocations, m.hold->n_allocations)});
    case PHOS__KEEPER__MESSAGE__KIND_STATE:
      return Message(State{.pid = m.state->pid, .taken = m.state->taken});
    case PHOS__KEEPER__MESSAGE__KIND_DONE:
      return Message(Done{});
    case PHOS__KEEPER__MESSAGE__KIND_RESTORING:
      return Message(Restoring{.pid = m.restoring->pid, .restored = m.restoring->restored != 0});
    case PHOS__KEEPER__MESSAGE__KIND_RESTORE_STARTED:
      return Message(RestoreStarted{.criu_pid = m.restore_started->criu_pid});
    case PHOS__KEEPER__MESSAGE__KIND_KEEP: {
      const auto& k = *m.keep;
      return Message(Keep{.pid = k.pid,
                          .migration = text(k.migration),
                          .allocations = pb::allocations_from_pb(k.allocations, k.n_allocations),
                          .vpid = k.vpid,
                          .keep_s = k.keep_s});
    }
    case PHOS__KEEPER__MESSAGE__KIND_KEEP_COMMITTED:
      return Message(KeepCommitted{.pid = m.keep_committed->pid});
    case PHOS__KEEPER__MESSAGE__KIND_TAKE_KEPT:
      return Message(TakeKept{.migration = text(m.take_kept->migration), .vpid = m.take_kept->vpid});
    case PHOS__KEEPER__MESSAGE__KIND_KEPT: {
      const auto& k = *m.kept;
      return Message(Kept{.allocations = pb::allocations_from_pb(k.allocations, k.n_allocations),
                          .last = k.last != 0,
                          .error = text(k.error)});
    }
    case PHOS__KEEPER__MESSAGE__KIND_TAKEN: {
      const auto& t = *m.taken;
      return Message(Taken{.vpid = t.vpid, .restored = t.restored != 0, .spoilt = t.spoilt != 0});
    }
    default:
      break;
  }
  return pb::no_kind_error("keeper message", m.base);
}

}  // namespace

std::string kept_socket_name(std::string_view migration) { return "phos-kept." + std::string(migration); }

std::vector<std::byte> encode_message(const Message& message) {
  return std::visit([](const auto& m) { return encode(m); }, message);
}

Result<Message> decode_message(std::span<const std::byte> payload) {
  return pb::unpack_and_decode<Phos__Keeper__Message>(phos__keeper__message__descriptor, payload, "keeper message",
                                                      [](const Phos__Keeper__Message& m) { return decode(m); });
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
