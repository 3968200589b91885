// The gate every intercepted CUDA call passes. Closed during a checkpoint:
// new calls wait (they do not fail) and close() returns once no call is
// inside. enter()/leave() are on every CUDA call's path: when the gate is
// open, an atomic increment and decrement of the calling thread's own stripe
// of the count (thread_stripe.h) and a load of the flag every thread only
// reads.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>

#include "phos/hooks/call_cycles.h"
#include "phos/hooks/thread_stripe.h"

namespace phos::hooks {

class Gate {
 public:
  void enter();
  void leave();

  // Closes the gate and waits until no call is inside. On timeout the gate is
  // opened again and false returned.
  bool close(std::chrono::milliseconds timeout);
  void open();
  bool is_open() const { return state_.load(std::memory_order_acquire) != kClosed; }
  // Dead memory (step_boundary.h): from now until the gate closes (or
  // unwatch()), calls of threads other than the caller are counted: the
  // free blocks the caller is about to hand in describe the memory at the
  // closing only if no other thread could have taken and written one
  // meanwhile. Costs the calls nothing while not watching (the one load of
  // the state they make anyway).
  void watch();
  void unwatch();
  // Calls of other threads since watch(): valid once close() returned.
  uint64_t watched_calls() const { return watched_calls_.load(std::memory_order_acquire); }
  // Calls inside now, summed over the stripes.
  int64_t inside() const;

 private:
  struct alignas(64) Stripe {
    std::atomic<int64_t> inside{0};
  };
  void wake();
  enum : uint32_t { kOpen = 0, kClosed = 1, kWatched = 2 };  // kWatched: open, other threads' calls counted
  alignas(64) std::atomic<uint32_t> state_{kOpen};
  // Off state_'s line: while watching, every other thread's call adds here.
  alignas(64) std::atomic<uint64_t> watched_calls_{0};
  std::atomic<int32_t> watcher_{0};  // the thread whose calls are not counted
  Stripe stripes_[kThreadStripes];
  std::mutex mu_;
  std::condition_variable emptied_;  // close() waits here for the last call to leave
  std::condition_variable opened_;   // calls wait here while the gate is closed
};

// RAII pass through a gate. A hook's pass names the hook's kind: while the
// call counter is on (call_cycles.h) the call is counted, the gate's own
// cost included.
class GatePass {
 public:
  explicit GatePass(Gate& g) : g_(g) { g_.enter(); }
  GatePass(Gate& g, CallKind kind) : scope_(kind), g_(g) { g_.enter(); }
  ~GatePass() { g_.leave(); }
  GatePass(const GatePass&) = delete;
  GatePass& operator=(const GatePass&) = delete;

 private:
  CallScope scope_;  // first in, last out
  Gate& g_;
};

}  // namespace phos::hooks
