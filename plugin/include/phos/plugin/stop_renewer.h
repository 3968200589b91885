// Renewing the leases of a host's NCCL stops (agent.proto
// NcclStopRequest.lease_ms) while their holder, a `phosctl job` step,
// lives: each stop armed again at its call every quarter of the lease from
// a thread of its own. The agents lift the stops themselves when the
// renewals end without a lift (the step killed before `go`). The renewals
// end before criu runs: criu freezes the ranks after pausing them, and an
// agent of a frozen process must never be called (a connection left in its
// socket's queue fails criu's dump); the quiesce of criu's pause takes each
// stop over instead, within the lease that the last renewal started. That
// last lease is the job's timeout, not job_lease_ms: criu pauses the ranks
// one after another, and a large job's pauses can outlast one lease.
// Renewing each rank until its pause arrives was not taken: a renewal
// queued behind criu's session with the last rank could be left in the
// socket of an agent criu has just frozen (the dump then fails), and only
// criu knows when it freezes. A holder killed after the last renewal
// leaves a rank criu never paused held until the job's timeout (the bound
// every other wait of the dump has); one that lives lifts it itself.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "phos/support/result.h"

namespace phos::plugin {

class StopRenewer {
 public:
  using Say = std::function<void(const std::string&)>;
  // Renews nothing until renew_at; `say` tells what failed.
  StopRenewer(std::vector<pid_t> pids, uint64_t job_id, std::chrono::milliseconds lease, int agent_timeout_ms, Say say);
  ~StopRenewer();
  StopRenewer(const StopRenewer&) = delete;
  StopRenewer& operator=(const StopRenewer&) = delete;

  // The stops are armed at `at` with the lease: renewed there from now on.
  // None: they are lifted, nothing to renew. Waits for a renewal under way,
  // so that none arms a stop again after the caller lifts it.
  void renew_at(std::optional<uint64_t> at);
  // No more renewals: the thread ended (a renewal under way finished).
  void stop();
  // stop(), then one last renewal on the caller's thread with `last_lease`
  // (at least the lease), so that what follows (criu's pause of every rank)
  // has all of it; an error where a rank's agent did not answer.
  Result<void> finish(std::chrono::milliseconds last_lease);
  std::chrono::milliseconds lease() const { return lease_; }
  uint32_t lease_ms() const { return uint32_t(lease_.count()); }
  // How often the thread renews: a quarter of the lease, at least 10 ms.
  static std::chrono::milliseconds interval(std::chrono::milliseconds lease);
  uint64_t renewals() const;

 private:
  void run();
  Result<void> renew(uint64_t at, uint32_t lease_ms);

  const std::vector<pid_t> pids_;
  const uint64_t job_id_;
  const std::chrono::milliseconds lease_;
  const int agent_timeout_ms_;
  const Say say_;
  mutable std::mutex mu_;  // held across a renewal
  std::condition_variable cv_;
  bool stopping_ = false;
  std::optional<uint64_t> at_;
  uint64_t renewals_ = 0;
  std::string last_failure_;
  std::thread thread_;
};

}  // namespace phos::plugin
