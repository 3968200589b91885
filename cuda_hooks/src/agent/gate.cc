#include "phos/hooks/gate.h"

#include <unistd.h>

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

// enter() announces itself (its stripe++) before it looks at the state, and
// close() sets it closed before it looks at the stripes; with sequentially
// consistent operations one of the two always sees the other. Only the sum
// over the stripes means anything (a call may leave on another thread than
// it entered on, taking a stripe below zero), so while the gate is closed
// every leave wakes close() to look again.
void Gate::enter() {
  Stripe& stripe = stripes_[thread_stripe()];
  for (;;) {
    stripe.inside.fetch_add(1, std::memory_order_seq_cst);
    const uint32_t state = state_.load(std::memory_order_seq_cst);
    if (state == kOpen) return;
    if (state == kWatched) {
      if (::gettid() != watcher_.load(std::memory_order_relaxed)) watched_calls_.fetch_add(1, std::memory_order_acq_rel);
      return;
    }
    stripe.inside.fetch_sub(1, std::memory_order_seq_cst);
    wake();
    std::unique_lock<std::mutex> lock(mu_);
    opened_.wait(lock, [&] { return state_.load(std::memory_order_seq_cst) != kClosed; });
  }
}

void Gate::watch() {
  watcher_.store(::gettid(), std::memory_order_relaxed);
  watched_calls_.store(0, std::memory_order_release);
  uint32_t open = kOpen;
  state_.compare_exchange_strong(open, kWatched, std::memory_order_seq_cst);
}

void Gate::unwatch() {
  uint32_t watched = kWatched;
  state_.compare_exchange_strong(watched, kOpen, std::memory_order_seq_cst);
}

void Gate::leave() {
  stripes_[thread_stripe()].inside.fetch_sub(1, std::memory_order_seq_cst);
  if (state_.load(std::memory_order_seq_cst) == kClosed) wake();
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
  state_.store(kClosed, std::memory_order_seq_cst);
  std::unique_lock<std::mutex> lock(mu_);
  if (emptied_.wait_for(lock, timeout, [&] { return inside() == 0; })) return true;
  state_.store(kOpen, std::memory_order_seq_cst);
  lock.unlock();
  opened_.notify_all();
  return false;
}

void Gate::open() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    state_.store(kOpen, std::memory_order_seq_cst);
  }
  opened_.notify_all();
}

}  // namespace phos::hooks
