// The CUDA driver's checkpoint API on a target process. When criu holds the
// process stopped under ptrace, the driver's restore thread inside it must run
// for the driver to act: these calls let that thread alone run meanwhile (as
// CRIU's cuda plugin does).
#pragma once

#include <sys/types.h>

#include <cuda.h>

#include <vector>

#include "phos/support/result.h"

namespace phos::plugin {

// The driver's state of `pid`; an error where the process holds no CUDA state.
// Only for a running process: the driver asks the process's restore thread,
// so the query hangs while criu holds that thread stopped.
Result<CUprocessState> driver_state(pid_t pid);
// Whether `pid` has the driver's restore thread, i.e. CUDA state to restore;
// safe on a stopped process.
bool has_driver_state(pid_t pid);
Result<void> driver_lock(pid_t pid, unsigned timeout_ms);
Result<void> driver_checkpoint(pid_t pid);
// Restore and unlock in one window of the driver's restore thread, as
// CRIU's cuda plugin does (stopping the thread in between can hang).
// `gpu_pairs` (old UUID -> new UUID, every checkpointed GPU) restores the
// process onto other GPUs; empty: the same ones.
Result<void> driver_restore_and_unlock(pid_t pid, const std::vector<CUcheckpointGpuPair>& gpu_pairs = {});
Result<void> driver_unlock(pid_t pid);

// The same for several processes (a job's ranks): with `parallel`, each on a
// thread of its own, so they take as long as the slowest rather than their
// sum (~0.3-0.6 s each on an H200 host). Called from the thread that traces
// the processes (criu's). One result per process, in the order given.
// `checkpointed` (where given): whether the driver did checkpoint each
// process, even where the result is an error (its restore thread could not
// be stopped again): such a process needs a driver restore to run again.
std::vector<Result<void>> driver_checkpoint_all(const std::vector<pid_t>& pids, bool parallel,
                                                std::vector<bool>* checkpointed = nullptr);
struct DriverRestore {
  pid_t pid;
  std::vector<CUcheckpointGpuPair> gpu_pairs;  // as driver_restore_and_unlock's
};
std::vector<Result<void>> driver_restore_and_unlock_all(const std::vector<DriverRestore>& restores, bool parallel);

}  // namespace phos::plugin
