// The gate every intercepted CUDA call passes. Closed during a checkpoint:
// new calls wait (they do not fail) and close() returns once no call is
// inside. enter()/leave() are on every CUDA call's path: two atomic
// operations when the gate is open.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>

namespace phos::hooks {

class Gate {
 public:
  void enter();
  void leave();

  // Closes the gate and waits until no call is inside. On timeout the gate is
  // opened again and false returned.
  bool close(std::chrono::milliseconds timeout);
  void open();
  bool is_open() const { return !closed_.load(std::memory_order_acquire); }
  int64_t inside() const { return inside_.load(std::memory_order_acquire); }

 private:
  void wake();
  std::atomic<bool> closed_{false};
  std::atomic<int64_t> inside_{0};
  std::mutex mu_;
  std::condition_variable cv_;
};

// RAII pass through a gate.
class GatePass {
 public:
  explicit GatePass(Gate& g) : g_(g) { g_.enter(); }
  ~GatePass() { g_.leave(); }
  GatePass(const GatePass&) = delete;
  GatePass& operator=(const GatePass&) = delete;

 private:
  Gate& g_;
};

}  // namespace phos::hooks
