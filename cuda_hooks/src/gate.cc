#include "phos/hooks/gate.h"

namespace phos::hooks {

// enter() announces itself (inside_++) before it looks at closed_, and close()
// sets closed_ before it looks at inside_; with sequentially consistent
// operations one of the two always sees the other.
void Gate::enter() {
  for (;;) {
    inside_.fetch_add(1, std::memory_order_seq_cst);
    if (!closed_.load(std::memory_order_seq_cst)) return;
    if (inside_.fetch_sub(1, std::memory_order_seq_cst) == 1) wake();
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return !closed_.load(std::memory_order_seq_cst); });
  }
}

void Gate::leave() {
  if (inside_.fetch_sub(1, std::memory_order_seq_cst) == 1 && closed_.load(std::memory_order_seq_cst)) wake();
}

void Gate::wake() {
  { std::lock_guard<std::mutex> lock(mu_); }
  cv_.notify_all();
}

bool Gate::close(std::chrono::milliseconds timeout) {
  closed_.store(true, std::memory_order_seq_cst);
  std::unique_lock<std::mutex> lock(mu_);
  if (cv_.wait_for(lock, timeout, [&] { return inside_.load(std::memory_order_seq_cst) == 0; })) return true;
  closed_.store(false, std::memory_order_seq_cst);
  lock.unlock();
  cv_.notify_all();
  return false;
}

void Gate::open() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    closed_.store(false, std::memory_order_seq_cst);
  }
  cv_.notify_all();
}

}  // namespace phos::hooks
