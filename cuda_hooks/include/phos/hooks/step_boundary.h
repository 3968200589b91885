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
#include <vector>

#include "phos/hooks/gate.h"
#include "phos/images/dead_ranges.h"

namespace phos::hooks {

class StepBoundary {
 public:
  // The program: it is at a boundary. Counted; where a checkpoint waits for
  // one, it is told, and the program waits until the checkpoint closed the
  // gate and then until the gate opens again.
  //
  // `dead`: the program's allocator's free blocks at this boundary
  // (phos_step_dead, the SDK's phos.step()). They are valid while the
  // program waits in this call and no longer: a checkpoint whose gate
  // closes here gets them (dead_at_arrival), any other gets none. A free
  // block may be handed out again by the allocator without any call phos
  // sees, so a list from an earlier step says nothing of the memory now.
  void step(Gate& gate, std::vector<dead::Range> dead = {});
  // Whether a checkpoint waits for the next boundary now: the program takes
  // its allocator's free blocks only then (they cost it a snapshot). A
  // checkpoint asked for just after this says false closes at the step all
  // the same, without dead ranges: the image then holds everything.
  // True starts the gate's watch (Gate::watch) for the calling thread: the
  // free blocks it takes after this and hands to its next step() count only
  // if no other thread made a CUDA call until the gate closed. Free blocks
  // handed without this are dropped.
  bool pending(Gate& gate);
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
  // The agent, between wait_next() == true and release(): the free blocks
  // the program handed in the step call it waits in now; none where it is
  // idle instead, or handed none.
  std::vector<dead::Range> dead_at_arrival() const;

 private:
  std::atomic<uint64_t> steps_{0};
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool pending_ = false;  // a checkpoint waits for the next boundary
  bool arrived_ = false;  // the program reached it, and waits for release()
  bool idle_ = false;
  bool watched_ = false;  // pending() said yes: the gate counts other threads' calls
  std::vector<dead::Range> dead_;  // those of the step call that arrived; cleared when it goes on
};

}  // namespace phos::hooks
