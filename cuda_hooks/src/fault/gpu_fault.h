// An injected GPU error, for the tests of a supervisor that restarts a job
// (phosctl supervise): with PHOS_FAULT=gpu-error, once the file named by
// PHOS_FAULT_FILE exists, the next kernel launch or copy fails with
// CUDA_ERROR_ILLEGAL_ADDRESS, and every one after it, as after a real
// device fault (the context is lost; the program cannot recover). The file
// is removed when it fires: one shot, so a process restored from an image
// taken before it does not fail again (its environment still names the
// fault). Off, each hooked launch and copy pays one relaxed load; armed, the
// file is looked for every 10 ms at most.
#pragma once

#include <atomic>

namespace phos::hooks::gpu_fault {

enum State : int { kOff = 0, kArmed = 1, kFired = 2 };
extern std::atomic<int> g_state;

// Armed from the environment (the preload's start).
void arm_from_environment();
// Whether the trigger file has appeared (it is then removed, said on stderr).
bool trigger_now();

// Whether it has fired (the program's GPU work failed for good).
inline bool fired() { return g_state.load(std::memory_order_relaxed) == kFired; }

// Whether this call must fail as on a lost device.
inline bool fails() {
  int s = g_state.load(std::memory_order_relaxed);
  if (__builtin_expect(s == kOff, 1)) return false;
  return s == kFired || trigger_now();
}

}  // namespace phos::hooks::gpu_fault
