#include "common/traced_kill.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <vector>

#include "phos/plugin/log.h"
#include "phos/plugin/proc.h"
#include "phos/support/clock.h"

namespace phos::plugin {

namespace {

// The threads of `pid` this thread traces, but its leader.
std::vector<pid_t> traced_threads(pid_t pid) {
  std::vector<pid_t> out;
  for (pid_t tid : thread_ids(pid)) {
    auto tracer = tracer_of(pid, tid);
    if (tid != pid && tracer && *tracer == ::getpid()) out.push_back(tid);
  }
  return out;
}

}  // namespace

void kill_traced(pid_t pid) {
  const std::vector<pid_t> threads = traced_threads(pid);  // before they go
  if (::kill(pid, SIGKILL) != 0) {
    PHOS_WARN("process %d: SIGKILL: %s", pid, std::strerror(errno));
    return;
  }
  // A killed thread is a zombie within moments; 2 s at most, so that this
  // never holds criu itself.
  const uint64_t deadline = monotonic_ns() + 2'000'000'000ull;
  for (pid_t tid : threads) {
    for (;;) {
      int status = 0;
      const pid_t r = ::waitpid(tid, &status, __WALL | WNOHANG);
      if (r == tid) break;
      // ECHILD: not ours to reap after all.
      if (r < 0 && errno == ECHILD) break;
      if (r < 0 && errno != EINTR) {
        PHOS_WARN("process %d: reap its thread %d: %s", pid, tid, std::strerror(errno));
        break;
      }
      if (monotonic_ns() > deadline) {
        PHOS_WARN("process %d: its thread %d did not end within 2 s of SIGKILL", pid, tid);
        return;
      }
      ::usleep(1000);
    }
  }
}

}  // namespace phos::plugin
