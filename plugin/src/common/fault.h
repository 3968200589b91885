// Fault injection for tests, in the manner of CRIU's own (CRIU_FAULT):
// PHOS_FAULT names one point where the plugin misbehaves on purpose.
//   stall-after-checkpoint  CHECKPOINT_DEVICES holds for 60 s (a test kills
//                           criu mid-dump at a known point)
//   fail-checkpoint-devices CHECKPOINT_DEVICES fails once the process's GPU
//                           state is taken (one host of a job fails its dump)
//   slow-checkpoint-devices CHECKPOINT_DEVICES holds for 4 s once the
//                           process's GPU state is taken (a job's dump that
//                           outlasts its stops' lease)
//   slow-pause-devices      PAUSE_DEVICES of a process with an agent
//                           holds for 3 s before its quiesce (criu's pauses
//                           of a large job's ranks outlasting a lease)
//   stall-step-before-ready a `phosctl job` dump step, its ranks held and
//                           their release pending, holds for 60 s before it
//                           says so (a test kills it there, before `go`)
//   fail-write-behind       a write-behind image fails after the process ran
//   stall-in-fill           a restore's fill of device memory holds for 60 s
//                           once its memory is allocated (a test kills criu
//                           mid-restore)
//   slow-memory-create      a restore's creation of device memory holds
//                           for 1.5 s first (criu restores the CPU side
//                           before the memory exists)
//   fail-memory-create      a restore's last allocation cannot be created
//                           (CUDA_ERROR_OUT_OF_MEMORY, as on a full GPU)
//   slow-fill               an on-demand restore fills one chunk per 20 ms
//                           per worker, except those a call waits for (a
//                           test's calls meet memory not yet in)
//   fail-migration-copy     a migration's copy to its target GPU fails at
//                           its second chunk, as a target GPU that fails
//                           mid-copy would (the source must run on)
//   stale-ahead             PAUSE_DEVICES's listing ahead of the gate
//                           drops the process's last allocation, as if it
//                           allocated one after (the gate's listing differs)
//   slow-copy               the copies made while the process runs
//                           (copy-on-write, recopy's first pass) take one
//                           chunk per 20 ms per worker, except those a call
//                           waits for (a test's writes land mid-copy)
// With PHOS_FAULT_FILE=PATH as well, the fault acts only while PATH exists
// (a test stalls one dump of a series, phosctl supervise's, not each).
// (libphos.so reads PHOS_FAULT too: gpu-error, cuda_hooks/src/fault/.)
#pragma once

#include <unistd.h>

#include <cstdlib>
#include <cstring>

namespace phos::plugin {

inline bool fault(const char* name) {
  const char* v = std::getenv("PHOS_FAULT");
  if (!v || std::strcmp(v, name) != 0) return false;
  const char* gate = std::getenv("PHOS_FAULT_FILE");
  return !gate || !*gate || ::access(gate, F_OK) == 0;
}

}  // namespace phos::plugin
