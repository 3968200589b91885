// Lets one thread of a process that criu holds stopped under ptrace run for a
// while: the agent thread, so the plugin can talk to it while the rest of the
// application stays stopped (during a dump's final stage, and during restore
// before criu lets the restored tasks go). The same technique CRIU's cuda
// plugin uses for the driver's restore thread.
#pragma once

#include <signal.h>
#include <sys/types.h>

#include <optional>

#include "phos/support/result.h"

namespace phos::plugin {

class StoppedThreadRun {
 public:
  // Blocks all signals of `tid` (saving its mask), clears ptrace options and
  // lets it continue.
  static Result<StoppedThreadRun> start(pid_t tid);
  StoppedThreadRun(StoppedThreadRun&& o) noexcept : tid_(o.tid_), mask_(o.mask_), running_(o.running_) {
    o.running_ = false;
  }
  StoppedThreadRun& operator=(StoppedThreadRun&&) = delete;
  // Stops the thread again and restores its signal mask and ptrace options.
  Result<void> stop();
  ~StoppedThreadRun();

 private:
  StoppedThreadRun(pid_t tid, uint64_t mask) : tid_(tid), mask_(mask), running_(true) {}
  pid_t tid_;
  uint64_t mask_;
  bool running_;
};

}  // namespace phos::plugin
