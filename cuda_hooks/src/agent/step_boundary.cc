#include "phos/hooks/step_boundary.h"

namespace phos::hooks {

void StepBoundary::step(Gate& gate) {
  steps_.fetch_add(1, std::memory_order_relaxed);
  {
    std::unique_lock<std::mutex> lock(mu_);
    if (pending_) {
      arrived_ = true;
      cv_.notify_all();
      cv_.wait(lock, [this] { return !arrived_; });  // until release()
    }
  }
  // Closed by the checkpoint now: the next iteration starts once it is over.
  GatePass pass(gate);
}

void StepBoundary::set_idle(bool idle) {
  std::lock_guard<std::mutex> lock(mu_);
  idle_ = idle;
  cv_.notify_all();
}

bool StepBoundary::wait_next(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  if (idle_) return true;
  pending_ = true;
  bool reached = cv_.wait_for(lock, timeout, [this] { return arrived_ || idle_; });
  pending_ = false;
  return reached;
}

void StepBoundary::release() {
  std::lock_guard<std::mutex> lock(mu_);
  arrived_ = false;
  cv_.notify_all();
}

}  // namespace phos::hooks
