// What a thread of a process criu holds stopped is waiting for, read from
// /proc (and its stack, through /proc/PID/mem): for the agent's thread,
// which alone runs while the plugin talks to it. Waiting in a futex there
// means waiting for a lock (or a condition) that a stopped thread holds: it
// would wait as long as the process is stopped.
#pragma once

#include <sys/types.h>

#include <optional>
#include <string>

namespace phos::plugin {

// Where thread `tid` of `pid` waits in a futex (the system call's
// arguments, the code addresses on its stack as LIBRARY+0xOFFSET), or
// nothing where it does not.
std::optional<std::string> futex_wait_of(pid_t pid, pid_t tid);

// Where the other threads of `pid` than `tid` were stopped: one
// "TID (NAME): LIBRARY+0xOFFSET[, system call N]" each, the first `most`.
std::string other_threads_at(pid_t pid, pid_t tid, size_t most = 8);

// Watches thread `tid` of `pid` while a reply is waited for: check() says
// why the wait is hopeless, once the thread has waited in a futex for
// `limit_ms` without a break, every other thread of the process stopped
// by the tracer all along.
class StuckWatch {
 public:
  StuckWatch(pid_t pid, pid_t tid, int limit_ms) : pid_(pid), tid_(tid), limit_ms_(limit_ms) {}
  // Called every `step_ms` of the wait.
  std::optional<std::string> check(int step_ms);

 private:
  pid_t pid_;
  pid_t tid_;
  int limit_ms_;
  int waited_ms_ = 0;
};

}  // namespace phos::plugin
