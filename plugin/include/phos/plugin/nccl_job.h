// A multi-process NCCL job held at one collective boundary, for a
// checkpoint of all its ranks (issue 17). Every rank issues a
// communicator's calls in the same order, so a stop armed at the same call
// number K on each holds them all where none has issued K and each has
// issued all before it: no collective is half-issued, and the GPU work
// queued before K can end. Then every rank's release is made pending before
// any rank's communicators go (a peer's going is then no error to the
// program), and each rank's quiesce releases its own.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "phos/images/agent_messages.h"
#include "phos/support/result.h"

namespace phos::plugin {

struct NcclJobHeld {
  uint64_t job_id = 0;
  uint64_t at_call = 0;    // every rank waits before issuing it
  std::vector<pid_t> pids;  // one per rank
};

// The first communicator of `s` with ranks in other processes; null if none.
const agent::NcclCommunicatorStatus* spanning_communicator(const agent::StatusReply& s);
// `s`'s communicator of `job_id`; null if none.
const agent::NcclCommunicatorStatus* job_communicator(const agent::StatusReply& s, uint64_t job_id);

// Among `candidates` (processes with or without agents), the one rank each
// of job `job_id` has (`nranks` of them), or an error naming the ranks not
// found.
Result<std::vector<pid_t>> find_nccl_job(const std::vector<pid_t>& candidates, uint64_t job_id, int nranks,
                                         int agent_timeout_ms);

// Holds the ranks `pids` of `job_id` at one call number (a little past the
// furthest rank, tried further on where a rank got there first), waiting
// at most `wait` for each to reach it; with `pend_release`, then makes their
// release pending and refuses where a rank's status names anything phos
// cannot checkpoint. On an error every stop is lifted again. `pids` in
// rank order.
Result<NcclJobHeld> hold_nccl_job(const std::vector<pid_t>& pids, uint64_t job_id, int agent_timeout_ms,
                                  std::chrono::milliseconds wait, bool pend_release);

// Lets every rank go on: stops lifted, a pending release that released
// nothing lifted. Best effort (a rank gone is skipped); says what failed.
std::vector<std::string> let_nccl_job_go(const NcclJobHeld& held, int agent_timeout_ms);

}  // namespace phos::plugin
