// The lease on a job-wide NCCL stop (agent.proto NcclStopRequest.lease_ms):
// a stop armed with a lease is lifted by the agent itself unless its holder
// (a `phosctl job` step) renews it in time, so that a holder killed after
// its ranks are held, before its checkpoint runs, leaves no rank held for
// good. A quiesce that closes the gate takes the stop over: the checkpoint
// holds it from then on (the process may stay frozen past the lease), and
// it no longer runs out. Only the agent's thread uses one; time is given,
// not read, so that the rules are tested without waiting.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>

namespace phos::hooks {

class StopLease {
 public:
  using Clock = std::chrono::steady_clock;

  // A stop of `job_id` armed (or armed again: renewed) with a lease of
  // `lease` from `now`.
  void grant(uint64_t job_id, std::chrono::milliseconds lease, Clock::time_point now);
  // A stop of `job_id` armed without a lease, or lifted by its holder: no
  // lease runs for it.
  void clear(uint64_t job_id);
  // A quiesce closed the gate: the running lease (if any) is over, the
  // stop held by the checkpoint; its job, where one ran.
  std::optional<uint64_t> take_over();
  // The job whose lease ran out by `now` (the lease then ends; the caller
  // lifts its stop); none otherwise.
  std::optional<uint64_t> expired(Clock::time_point now);
  // How long until the running lease runs out (0 once it has); none where
  // no lease runs.
  std::optional<std::chrono::milliseconds> left(Clock::time_point now) const;
  // The running lease's length (0 where none runs).
  std::chrono::milliseconds length() const { return running_ ? length_ : std::chrono::milliseconds(0); }

 private:
  bool running_ = false;
  uint64_t job_id_ = 0;
  std::chrono::milliseconds length_{0};
  Clock::time_point deadline_{};
};

}  // namespace phos::hooks
