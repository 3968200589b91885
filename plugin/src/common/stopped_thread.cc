#include "common/stopped_thread.h"

#include <sys/ptrace.h>
#include <sys/wait.h>
#include <unistd.h>

#include <string>

#include "phos/plugin/log.h"

namespace phos::plugin {

Result<StoppedThreadRun> StoppedThreadRun::start(pid_t tid) {
  std::string who = "thread " + std::to_string(tid);
  uint64_t mask = 0;
  if (::ptrace(PTRACE_GETSIGMASK, tid, sizeof(mask), &mask) != 0) return errno_error("get signal mask of " + who);
  uint64_t block = ~uint64_t(0);
  if (::ptrace(PTRACE_SETSIGMASK, tid, sizeof(block), &block) != 0) return errno_error("block signals of " + who);
  if (::ptrace(PTRACE_SETOPTIONS, tid, nullptr, 0) != 0) {
    Error e = errno_error("clear ptrace options of " + who);
    ::ptrace(PTRACE_SETSIGMASK, tid, sizeof(mask), &mask);
    return e;
  }
  if (::ptrace(PTRACE_CONT, tid, nullptr, 0) != 0) {
    Error e = errno_error("continue " + who);
    ::ptrace(PTRACE_SETOPTIONS, tid, nullptr, PTRACE_O_SUSPEND_SECCOMP | PTRACE_O_TRACESYSGOOD);
    ::ptrace(PTRACE_SETSIGMASK, tid, sizeof(mask), &mask);
    return e;
  }
  return StoppedThreadRun(tid, mask);
}

Result<void> StoppedThreadRun::stop() {
  if (!running_) return {};
  running_ = false;
  std::string who = "thread " + std::to_string(tid_);
  if (::ptrace(PTRACE_INTERRUPT, tid_, nullptr, 0) != 0) return errno_error("interrupt " + who);
  // A thread stuck in the kernel would make a plain wait hang criu: give up
  // after 30 s with an error instead.
  int status = 0;
  pid_t r = 0;
  for (int waited_ms = 0; waited_ms < 30000; waited_ms++) {
    r = ::waitpid(tid_, &status, __WALL | WNOHANG);
    if (r != 0 && !(r < 0 && errno == EINTR)) break;
    ::usleep(1000);
  }
  if (r == 0) return make_error(who + " did not stop within 30 s of PTRACE_INTERRUPT", ETIMEDOUT);
  if (r != tid_) return errno_error("wait for " + who);
  if (!WIFSTOPPED(status)) return make_error(who + " did not stop (status " + std::to_string(status) + ")", ESRCH);
  if (::ptrace(PTRACE_SETOPTIONS, tid_, nullptr, PTRACE_O_SUSPEND_SECCOMP | PTRACE_O_TRACESYSGOOD) != 0)
    return errno_error("restore ptrace options of " + who);
  if (::ptrace(PTRACE_SETSIGMASK, tid_, sizeof(mask_), &mask_) != 0)
    return errno_error("restore signal mask of " + who);
  return {};
}

StoppedThreadRun::~StoppedThreadRun() {
  if (auto r = stop(); !r) PHOS_ERR("%s", r.error().message.c_str());
}

}  // namespace phos::plugin
