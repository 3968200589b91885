#include "phos/hooks/gate.h"

namespace phos::hooks {

namespace detail {
thread_local uint32_t t_stripe_plus_one __attribute__((tls_model("initial-exec"))) = 0;

uint32_t assign_thread_stripe() {
  static std::atomic<uint32_t> next{0};
  uint32_t s = next.fetch_add(1, std::memory_order_relaxed) % kThreadStripes;
  t_stripe_plus_one = s + 1;
  return s;
}
}  // namespace detail

// enter() announces itself (its stripe++) before it looks at closed_, and
// close() sets closed_ before it looks at the stripes; with sequentially
// consistent operations one of the two always sees the other. Only the sum
// over the stripes means anything (a call may leave on another thread than
// it entered on, taking a stripe below zero), so while the gate is closed
// every leave wakes close() to look again.
void Gate::enter() {
  Stripe& stripe = stripes_[thread_stripe()];
  for (;;) {
    stripe.inside.fetch_add(1, std::memory_order_seq_cst);
    if (!closed_.load(std::memory_order_seq_cst)) return;
    stripe.inside.fetch_sub(1, std::memory_order_seq_cst);
    wake();
    std::unique_lock<std::mutex> lock(mu_);
    opened_.wait(lock, [&] { return !closed_.load(std::memory_order_seq_cst); });
  }
}

void Gate::leave() {
  stripes_[thread_stripe()].inside.fetch_sub(1, std::memory_order_seq_cst);
  if (closed_.load(std::memory_order_seq_cst)) wake();
}

int64_t Gate::inside() const {
  int64_t n = 0;
  for (const Stripe& s : stripes_) n += s.inside.load(std::memory_order_seq_cst);
  return n;
}

void Gate::wake() {
  { std::lock_guard<std::mutex> lock(mu_); }
  emptied_.notify_all();
}

bool Gate::close(std::chrono::milliseconds timeout) {
  closed_.store(true, std::memory_order_seq_cst);
  std::unique_lock<std::mutex> lock(mu_);
  if (emptied_.wait_for(lock, timeout, [&] { return inside() == 0; })) return true;
  closed_.store(false, std::memory_order_seq_cst);
  lock.unlock();
  opened_.notify_all();
  return false;
}

void Gate::open() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    closed_.store(false, std::memory_order_seq_cst);
  }
  opened_.notify_all();
}

}  // namespace phos::hooks
