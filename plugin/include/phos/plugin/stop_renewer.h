// Renewing the leases of a host's NCCL stops (agent.proto
// NcclStopRequest.lease_ms) while their holder, a `phosctl job` step,
// lives: each stop armed again at its call every quarter of the lease from
// a thread of its own. The agents lift the stops themselves when the
// renewals end without a lift (the step killed before `go`). The renewals
// end before criu runs: criu freezes the ranks after pausing them, and an
// agent of a frozen process must never be called (a connection left in its
// socket's queue fails criu's dump); the quiesce of criu's pause takes each
// stop over instead, within the lease that the last renewal started.
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
  // stop(), then one last renewal on the caller's thread, so that what
  // follows (criu's pause of every rank) has a whole lease; an error where
  // a rank's agent did not answer.
  Result<void> finish();
  std::chrono::milliseconds lease() const { return lease_; }
  uint32_t lease_ms() const { return uint32_t(lease_.count()); }
  // How often the thread renews: a quarter of the lease, at least 10 ms.
  static std::chrono::milliseconds interval(std::chrono::milliseconds lease);
  uint64_t renewals() const;

 private:
  void run();
  Result<void> renew(uint64_t at);

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
