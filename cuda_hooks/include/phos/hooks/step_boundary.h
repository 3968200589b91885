// Iteration boundaries the program marks (phos_step(), the Python SDK's
// phos.step()). A checkpoint asked for between two of them waits, at most a
// bound, for the next one, and closes the gate there: a checkpoint at the
// start of an iteration writes the fewest buffers (PhOS §8.4). The program,
// at that boundary, waits until the checkpoint has opened the gate again.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>

#include "phos/hooks/gate.h"

namespace phos::hooks {

class StepBoundary {
 public:
  // The program: it is at a boundary. Counted; where a checkpoint waits for
  // one, it is told, and the program waits until the checkpoint closed the
  // gate and then until the gate opens again.
  void step(Gate& gate);
  // The program: it stays at a boundary (idle: waiting in a checkpoint it
  // asked for itself, say) until it says otherwise; a checkpoint then does
  // not wait for its next step.
  void set_idle(bool idle);
  bool used() const { return steps_.load(std::memory_order_relaxed) > 0; }
  uint64_t steps() const { return steps_.load(std::memory_order_relaxed); }

  // The agent, before it closes the gate: waits until the program reaches
  // its next boundary, at most `timeout`; true when it did (or is idle at
  // one), false when the wait gave up.
  bool wait_next(std::chrono::milliseconds timeout);
  // The agent, once the gate is closed (or a checkpoint gave up): the
  // program's step goes on (to the gate).
  void release();

 private:
  std::atomic<uint64_t> steps_{0};
  std::mutex mu_;
  std::condition_variable cv_;
  bool pending_ = false;  // a checkpoint waits for the next boundary
  bool arrived_ = false;  // the program reached it, and waits for release()
  bool idle_ = false;
};

}  // namespace phos::hooks
