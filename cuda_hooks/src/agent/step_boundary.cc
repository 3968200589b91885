#include "phos/hooks/step_boundary.h"

namespace phos::hooks {

void StepBoundary::step(Gate& gate, std::vector<dead::Range> dead) {
  steps_.fetch_add(1, std::memory_order_relaxed);
  {
    std::unique_lock<std::mutex> lock(mu_);
    if (pending_) {
      // Taken before pending() started the watch, they may be stale already.
      if (watched_) dead_ = dead::normalized(std::move(dead));
      arrived_ = true;
      cv_.notify_all();
      cv_.wait(lock, [this] { return !arrived_; });  // until release()
      dead_.clear();  // the program goes on: its free blocks may be used again
    } else if (watched_) {
      gate.unwatch();  // the checkpoint that was pending gave up
    }
    watched_ = false;
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

bool StepBoundary::pending(Gate& gate) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!pending_) return false;
  gate.watch();
  watched_ = true;
  return true;
}

std::vector<dead::Range> StepBoundary::dead_at_arrival() const {
  std::lock_guard<std::mutex> lock(mu_);
  return arrived_ ? dead_ : std::vector<dead::Range>{};
}

void StepBoundary::release() {
  std::lock_guard<std::mutex> lock(mu_);
  arrived_ = false;
  cv_.notify_all();
}

}  // namespace phos::hooks
