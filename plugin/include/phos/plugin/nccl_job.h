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
#include <map>
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
// found. `statuses`, where given, gets each rank's status (rank order).
Result<std::vector<pid_t>> find_nccl_job(const std::vector<pid_t>& candidates, uint64_t job_id, int nranks,
                                         int agent_timeout_ms, std::vector<agent::StatusReply>* statuses = nullptr);

// The NCCL jobs whose ranks are among `candidates` (processes with or
// without agents): per communicator spanning processes, its rank count and
// the ranks found (rank -> pid, and the calls each has issued). An error
// where an agent fails to answer, or two processes claim one rank.
struct NcclJobRanks {
  uint64_t job_id = 0;
  int nranks = 0;
  std::map<int, pid_t> ranks;
  std::map<int, uint64_t> calls;
};
Result<std::vector<NcclJobRanks>> nccl_jobs_among(const std::vector<pid_t>& candidates, int agent_timeout_ms);

// A hold's steps, for one host's ranks (`pids`) of a job whose ranks may be
// on other hosts too (phosctl job, job_step.h); hold_nccl_job below runs
// them for the ranks of one host.
// Rounds of arming tried, the margin past the furthest rank growing 4x.
inline constexpr int kHoldRounds = 8;
inline uint64_t hold_margin(int round) { return uint64_t(2) << (2 * round); }
// The most calls any of the ranks has issued on the job's communicator.
Result<uint64_t> furthest_call(const std::vector<pid_t>& pids, uint64_t job_id, int agent_timeout_ms);
// Every rank's stop armed at `at` (or lifted, without): true where each
// was (false: a rank is past it). With `lease_ms`, each agent lifts its
// stop itself unless it is armed again within that long (stop_renewer.h).
Result<bool> arm_stops(const std::vector<pid_t>& pids, uint64_t job_id, std::optional<uint64_t> at,
                       int agent_timeout_ms, std::optional<uint32_t> lease_ms = std::nullopt);
// Waits (at most `wait`) until every rank is held at one call at or past
// `at`; that call.
Result<uint64_t> wait_held(const std::vector<pid_t>& pids, uint64_t job_id, uint64_t at, int agent_timeout_ms,
                           std::chrono::milliseconds wait);
// Every rank's release made pending; refused where a rank's status names
// anything phos cannot checkpoint.
Result<void> pend_releases(const std::vector<pid_t>& pids, uint64_t job_id, int agent_timeout_ms);

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
