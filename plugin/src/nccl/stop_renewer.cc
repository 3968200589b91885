#include "phos/plugin/stop_renewer.h"

#include <algorithm>
#include <cstdint>

#include "phos/plugin/nccl_job.h"

namespace phos::plugin {

StopRenewer::StopRenewer(std::vector<pid_t> pids, uint64_t job_id, std::chrono::milliseconds lease,
                         int agent_timeout_ms, Say say)
    : pids_(std::move(pids)), job_id_(job_id), lease_(lease), agent_timeout_ms_(agent_timeout_ms),
      say_(std::move(say)) {
  thread_ = std::thread([this] { run(); });
}

StopRenewer::~StopRenewer() { stop(); }

std::chrono::milliseconds StopRenewer::interval(std::chrono::milliseconds lease) {
  return std::max(std::chrono::milliseconds(10), lease / 4);
}

void StopRenewer::renew_at(std::optional<uint64_t> at) {
  std::lock_guard<std::mutex> lock(mu_);
  at_ = at;
}

void StopRenewer::stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

Result<void> StopRenewer::finish(std::chrono::milliseconds last_lease) {
  stop();
  std::lock_guard<std::mutex> lock(mu_);
  if (!at_) return {};
  // lease_ms is 32 bits of milliseconds: 49 days.
  const auto ms = std::clamp<int64_t>(std::max(last_lease, lease_).count(), 1, UINT32_MAX);
  return renew(*at_, uint32_t(ms));
}

uint64_t StopRenewer::renewals() const {
  std::lock_guard<std::mutex> lock(mu_);
  return renewals_;
}

// Armed again at the same call: an agent that knows no lease keeps the
// stop as it was (a rank held there has issued exactly that many calls).
// A reply of "past" is no failure: a rank held inside a group stops a few
// calls further on, with its stop in place.
// Rank by rank: one agent that does not answer must not let every later
// rank's lease lapse with it.
Result<void> StopRenewer::renew(uint64_t at, uint32_t lease_ms) {
  std::string failed;
  int code = 0;
  for (pid_t p : pids_)
    if (auto r = arm_stops({p}, job_id_, at, agent_timeout_ms_, lease_ms); !r) {
      failed += (failed.empty() ? "" : "; ") + r.error().message;
      code = r.error().code;
    }
  if (!failed.empty()) return make_error("renewing the stops' lease: " + failed, code);
  renewals_++;
  return {};
}

void StopRenewer::run() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    if (cv_.wait_for(lock, interval(lease_), [&] { return stopping_; })) return;
    if (!at_) continue;
    // Said once per cause: a rank gone fails every renewal alike.
    auto r = renew(*at_, lease_ms());
    std::string failure = r ? std::string() : r.error().message;
    if (!failure.empty() && failure != last_failure_) say_(failure);
    last_failure_ = failure;
  }
}

}  // namespace phos::plugin
