// The link between the CRIU plugin and phos-keeper, its helper outside criu
// during a dump or a restore (images/proto/keeper.proto), as C++ values, with their codec
// and transport over the frames of agent_wire.h; protobuf-c stays inside
// images/src.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "phos/images/agent_messages.h"
#include "phos/images/unique_fd.h"
#include "phos/support/result.h"

namespace phos::keeper {

// A process's allocations; their fds come with the message, one per
// allocation, in order. Several Holds for one process add to its list.
struct Hold {
  int32_t pid = 0;  // in criu's pid namespace
  std::vector<agent::Allocation> allocations;
  bool operator==(const Hold&) const = default;
};

// What the dump has taken from a process so far: bits (phos/plugin/give_back.h).
struct State {
  int32_t pid = 0;
  uint32_t taken = 0;
  bool operator==(const State&) const = default;
};

// The dump (or restore) is over and every process has what it should.
struct Done {
  bool operator==(const Done&) const = default;
};

// A restore is about to give the process its GPU state; if criu dies before
// Done, the keeper ends the half-restored process.
struct Restoring {
  int32_t pid = 0;  // in criu's pid namespace
  bool restored = false;  // it has its GPU state now: leave it be
  bool operator==(const Restoring&) const = default;
};

// A restore begins: the processes criu forks from now on are its.
struct RestoreStarted {
  int32_t criu_pid = 0;
  bool operator==(const RestoreStarted&) const = default;
};

// A migration: the memory that holds the process's GPU data after the
// dump's copy, fds alongside, one per allocation; several add up.
struct Keep {
  int32_t pid = 0;  // in criu's pid namespace
  std::string migration;
  std::vector<agent::Allocation> allocations;
  int32_t vpid = 0;     // the image's pid: what a restore asks for
  uint32_t keep_s = 0;  // how long to keep it
  bool operator==(const Keep&) const = default;
};

// The dump succeeded: the kept memory outlives criu until a restore takes it.
struct KeepCommitted {
  int32_t pid = 0;
  bool operator==(const KeepCommitted&) const = default;
};

// A restore asks for a migration's memory.
struct TakeKept {
  std::string migration;
  int32_t vpid = 0;
  bool operator==(const TakeKept&) const = default;
};

// The keeper's answer, in frames of up to 253 fds; `last` on the final one,
// `error` where it has nothing to give.
struct Kept {
  std::vector<agent::Allocation> allocations;
  bool last = false;
  std::string error;
  bool operator==(const Kept&) const = default;
};

// The restore's word: restored (the keeper lets go), or not (kept), or
// spoilt (the process may have run on it: let go, the image refused).
struct Taken {
  int32_t vpid = 0;
  bool restored = false;
  bool spoilt = false;  // not restored, and no longer the checkpoint: let it go
  bool operator==(const Taken&) const = default;
};

using Message = std::variant<Hold, State, Done, Restoring, RestoreStarted, Keep, KeepCommitted, TakeKept, Kept, Taken>;

// The abstract socket name ("\0" not included) of a migration's kept memory.
std::string kept_socket_name(std::string_view migration);

std::vector<std::byte> encode_message(const Message& message);
// EPROTO with what is wrong where the payload does not parse or holds no kind.
Result<Message> decode_message(std::span<const std::byte> payload);

struct ReceivedMessage {
  Message message;
  std::vector<UniqueFd> fds;
};

Result<void> send_message(int sock, const Message& message, std::span<const int> fds = {});
// Sends `allocations` with their fds (one each, in order), a frame's worth
// at a time, as the messages `make(slice, last)` builds; one message for
// none. (Hold, Keep, Kept.)
Result<void> send_allocations(int sock, const std::vector<agent::Allocation>& allocations,
                              const std::vector<UniqueFd>& fds,
                              const std::function<Message(std::vector<agent::Allocation> slice, bool last)>& make);
// Errors are the framing's (agent_wire.h), and EPROTO for a payload that
// does not decode.
Result<ReceivedMessage> recv_message(int sock, int timeout_ms);

}  // namespace phos::keeper
