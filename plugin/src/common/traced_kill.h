// Ending a restored process that criu still holds under ptrace (its GPU
// state could not be restored at RESUME_DEVICES_LATE) without hanging
// criu's own cleanup.
#pragma once

#include <sys/types.h>

namespace phos::plugin {

// SIGKILLs `pid`, then reaps the zombies of its threads other than the
// leader, which this thread (criu's, their tracer) must reap: until they are
// gone the leader cannot be reaped, and criu, failing the restore, waits for
// a pid namespace's init with waitpid(), which would never return. The
// leader is left to criu. Call it from the thread that traces the process.
void kill_traced(pid_t pid);

}  // namespace phos::plugin
