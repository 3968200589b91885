// The state libphos.so keeps for the whole process: the gate, the device
// memory table, counters and the calls phos cannot checkpoint. Never
// destroyed: hooks may run while the process exits.
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "launch/copy_window.h"
#include "launch/kernel_info.h"
#include "launch/launch_log.h"
#include "launch/launch_speculation.h"
#include "launch/launch_validation.h"
#include "memory/device_memory.h"
#include "phos/hooks/gate.h"
#include "phos/hooks/step_boundary.h"
#include "phos/hooks/kernel_registry.h"
#include "phos/hooks/module_registry.h"
#include "phos/hooks/nccl_communicators.h"
#include "phos/hooks/thread_stripe.h"

namespace phos::hooks {

enum class Counter : uint32_t {
  kLaunches,         // cuLaunchKernel / Ex / Cooperative, all variants
  kAllocations,      // allocations made by phos (sync and async)
  kAsyncAllocations,
  kFrees,            // frees of phos allocations (sync and async)
  kForeignFrees,     // frees of pointers phos did not allocate
  kUserVmmCreates,   // cuMemCreate calls of the program itself
  kGraphLaunches,    // cuGraphLaunch
  kGraphKernels,     // kernel nodes run by those graph launches
  kCapturedLaunches, // launches that went into a graph being captured (run later, counted there)
  kCount
};

class Runtime {
 public:
  Runtime();
  Runtime(const Runtime&) = delete;
  Runtime& operator=(const Runtime&) = delete;

  Gate gate;
  StepBoundary steps;  // the program's iteration boundaries (phos_step)
  DeviceMemory memory;
  ModuleRegistry modules;
  // One entry per launched kernel, shared by the three features below (kernel_registry.h).
  KernelRegistry kernels{modules, describe_kernel};
  LaunchLog launches{kernels};
  // Its buffer index follows the device memory while it is on.
  LaunchSpeculation speculation{kernels, memory};
  // Its background builds pass the gate.
  LaunchValidation validation{kernels, gate};
  // A concurrent dump's copy window, while one is open (copy_window.h); told
  // by the device memory of the units the program lets go of.
  CopyWindow copy_window;
  // The program's live NCCL communicators (hooks/nccl.cc).
  NcclCommunicators nccl;

  // Each thread counts in its own stripe (thread_stripe.h): launches from
  // several threads do not share a cache line.
  void count(Counter c, uint64_t n = 1) {
    counters_[thread_stripe()].values[size_t(c)].fetch_add(n, std::memory_order_relaxed);
  }
  std::vector<std::pair<std::string, uint64_t>> counters() const;

  // A call that makes a checkpoint impossible (managed memory, IPC handles):
  // the program keeps working; a dump is refused with the call's name.
  void note_unsupported(const char* call);
  std::vector<std::string> unsupported() const;

  std::atomic<bool> cuda_used{false};
  // Stream captures under way anywhere in the process: while none is, no
  // launch needs to ask the driver whether its stream is being captured.
  std::atomic<int> captures_active{0};

 private:
  struct alignas(64) CounterStripe {
    std::atomic<uint64_t> values[size_t(Counter::kCount)]{};
  };
  CounterStripe counters_[kThreadStripes];
  mutable std::mutex mu_;
  std::set<std::string> unsupported_;
};

// The one Runtime, made at first use (a hook may run before libphos.so's
// constructor, from another library's). Inline: every hook asks for it
// several times per call.
Runtime& make_runtime();
extern std::atomic<Runtime*> g_runtime;
inline Runtime& runtime() {
  Runtime* r = g_runtime.load(std::memory_order_acquire);
  return __builtin_expect(r != nullptr, 1) ? *r : make_runtime();
}

// Whether work queued on `stream` now goes into a graph being captured.
bool stream_capturing(CUstream stream, bool per_thread_stream);

}  // namespace phos::hooks
