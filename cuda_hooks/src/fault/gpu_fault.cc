#include "fault/gpu_fault.h"
#include "phos/hooks/stderr_line.h"

#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>

namespace phos::hooks::gpu_fault {

std::atomic<int> g_state{kOff};

namespace {
// Set once, before the program's first CUDA call, by the preload's
// constructor, which may run before this file's dynamic initializers: plain
// arrays, constant-initialized (a std::string would be reset after it).
char g_trigger[4096];
std::mutex g_fire;  // constexpr constructor: constant-initialized too
}  // namespace

void arm_from_environment() {
  const char* fault = std::getenv("PHOS_FAULT");
  if (!fault || std::strcmp(fault, "gpu-error") != 0) return;
  const char* file = std::getenv("PHOS_FAULT_FILE");
  if (!file || !*file) {
    stderr_line("phos: PHOS_FAULT=gpu-error needs PHOS_FAULT_FILE (the file whose appearance fires it); "
                "no fault armed\n");
    return;
  }
  if (std::strlen(file) >= sizeof(g_trigger)) {
    stderr_line("phos: PHOS_FAULT_FILE is longer than %zu bytes; no fault armed\n", sizeof(g_trigger) - 1);
    return;
  }
  std::strcpy(g_trigger, file);
  g_state.store(kArmed, std::memory_order_relaxed);
}

bool trigger_now() {
  // A look for the file every 10 ms at most: armed, launches and copies
  // would otherwise take one lock and one access() each, serialized.
  static std::atomic<int64_t> next_look_ns{0};
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
  const int64_t now = int64_t(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
  if (now < next_look_ns.load(std::memory_order_relaxed)) return g_state.load(std::memory_order_relaxed) == kFired;
  next_look_ns.store(now + 10'000'000, std::memory_order_relaxed);
  std::lock_guard<std::mutex> lock(g_fire);
  if (g_state.load(std::memory_order_relaxed) == kFired) return true;
  if (::access(g_trigger, F_OK) != 0) return false;
  // One shot: gone before the program can be checkpointed again.
  if (::unlink(g_trigger) != 0)
    stderr_line("phos: fault injection: cannot remove %s: %s\n", g_trigger, std::strerror(errno));
  g_state.store(kFired, std::memory_order_relaxed);
  stderr_line("phos: fault injection (PHOS_FAULT=gpu-error): %s appeared; every kernel launch and copy "
              "fails from now on with CUDA_ERROR_ILLEGAL_ADDRESS\n", g_trigger);
  return true;
}

}  // namespace phos::hooks::gpu_fault
