// What the agent asks of the NCCL hooks around a checkpoint (issue 17): the
// program's communicators destroyed before it and made again after it,
// behind the handles the program holds (nccl_communicators.h).
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>

#include "phos/hooks/agent_backend.h"  // NcclReleased
#include "phos/support/result.h"

namespace phos::hooks {

// Before the gate closes: new NCCL calls wait from now on; once none is
// running, the GPU work already queued is waited for and every
// communicator is destroyed (newest first). Refused, with nothing
// released, where one cannot be made again (nccl_why_not_recreatable) or
// NCCL calls still run after `timeout`.
Result<NcclReleased> nccl_release(std::chrono::milliseconds timeout);

// After the gate opens again (a restore, or the end of a dump that left the
// program running): every released communicator is made again from its
// recipe, oldest first, behind its old handle; the waiting NCCL calls then
// go on. Returns how many were made. An error names the first that could
// not be: calls on it fail from then on (ncclSystemError).
//
// Communicators with ranks in other processes are made again in the
// background (each rank waits for the others): from a new unique id that
// their rank 0 draws and leaves, named by `nonce` (the resuming criu run's,
// the same for every rank), in a directory of the user's on /dev/shm for
// the other ranks; the job-wide stop is lifted once they are made. Without
// a nonce they are not made again (an error says so).
Result<uint32_t> nccl_rebuild(std::optional<uint64_t> nonce);

// A job-wide quiesce's second step: every rank's release made pending
// before any rank's communicators go (true once no NCCL call runs), or no
// longer pending (where nothing was released).
Result<bool> nccl_pend_release(bool pend);

}  // namespace phos::hooks
