#include "phos/hooks/stop_lease.h"

namespace phos::hooks {

// One job at a time, as one stop holds one job: a grant for another job
// replaces the lease (its stop's holder renews that one now).
void StopLease::grant(uint64_t job_id, std::chrono::milliseconds lease, Clock::time_point now) {
  running_ = true;
  job_id_ = job_id;
  length_ = lease;
  deadline_ = now + lease;
}

void StopLease::clear(uint64_t job_id) {
  if (running_ && job_id_ == job_id) running_ = false;
}

std::optional<uint64_t> StopLease::take_over() {
  if (!running_) return std::nullopt;
  running_ = false;
  return job_id_;
}

std::optional<uint64_t> StopLease::expired(Clock::time_point now) {
  if (!running_ || now < deadline_) return std::nullopt;
  running_ = false;
  return job_id_;
}

std::optional<std::chrono::milliseconds> StopLease::left(Clock::time_point now) const {
  if (!running_) return std::nullopt;
  if (now >= deadline_) return std::chrono::milliseconds(0);
  // Rounded up: a poll that wakes a little early finds it not yet run out
  // and sleeps again for the rest.
  return std::chrono::ceil<std::chrono::milliseconds>(deadline_ - now);
}

}  // namespace phos::hooks
