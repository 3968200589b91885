// Giving a process back what a dump took from its GPU side, in reverse
// order: the driver's state (restore and unlock, or just unlock), its very
// device memory mapped again at the same addresses (zero copy), the gate
// opened. Used by the plugin when a dump ends with the process alive
// (--leave-running, or a failed dump) and by phos-keeper when criu died
// mid-dump.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <vector>

#include "phos/images/unique_fd.h"
#include "phos/plugin/agent_client.h"
#include "phos/support/result.h"

namespace phos::plugin {

// What a dump has taken from a process: bits, as in keeper.proto's State.
enum Taken : uint32_t {
  kGateClosed = 1,
  kMappingsReleased = 2,
  kDriverLocked = 4,
  kDriverCheckpointed = 8,
};

// Gives back every step in `taken`; tries them all and returns the first
// error. fds[i] holds the memory of allocs[i] (used with kMappingsReleased).
// A driver restore that fails falls back to an unlock: the record may claim
// a step that never happened (the keeper learns of each step just before it
// is taken), or the restore may have been made already, its unlock failing.
// `before_resume`, where given, runs once the memory is mapped again and
// before the gate opens (a copy window opens there): false leaves the gate
// closed for the caller to open; an error opens it all the same (the
// process must run) and is returned.
// Where a give-back's time went (CLOCK_MONOTONIC ns): the driver's restore
// and unlock; the agent reached and the memory mapped again; the rest
// (before_resume, the gate).
struct GiveBackTimes {
  uint64_t driver_ns = 0, remap_ns = 0, resume_ns = 0;
};
Result<void> give_back_gpu_state(pid_t pid, uint32_t taken, const std::vector<agent::Allocation>& allocs,
                                 const std::vector<UniqueFd>& fds, int agent_timeout_ms,
                                 const std::function<Result<bool>(AgentClient&)>& before_resume = {},
                                 GiveBackTimes* times = nullptr);

}  // namespace phos::plugin
