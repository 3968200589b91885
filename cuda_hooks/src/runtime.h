// The state libphos.so keeps for the whole process: the gate, the device
// memory table, the launch-time features, counters and the calls phos
// cannot checkpoint. Never destroyed: hooks may run while the process exits.
//
// Who uses what: the runtime's parts are private. Each family of hooks (a
// file of hooks/), the agent's backend and the entry point reach them
// through a view of their own (RuntimeView, at the end), which names the
// parts it uses: the top of each file says what it depends on. The parts
// that work with one another get each other when the runtime is made (the
// features the kernel registry, the speculation the device memory, the
// validation the gate, the device memory the copy window); none reaches
// another through runtime().
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "driver/driver.h"
#include "launch/copy_window.h"
#include "modules/kernel_info.h"
#include "launch/launch_log.h"
#include "launch/launch_speculation.h"
#include "launch/launch_validation.h"
#include "memory/device_memory.h"
#include "phos/hooks/call_cycles.h"
#include "phos/hooks/gate.h"
#include "phos/hooks/interprocess_events.h"
#include "phos/hooks/step_boundary.h"
#include "phos/hooks/kernel_registry.h"
#include "phos/hooks/library_memory.h"
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

// The hooks' counters. Each thread counts in its own stripe
// (thread_stripe.h): launches from several threads do not share a cache line.
class Counters {
 public:
  void count(Counter c, uint64_t n = 1) {
    stripes_[thread_stripe()].values[size_t(c)].fetch_add(n, std::memory_order_relaxed);
  }
  std::vector<std::pair<std::string, uint64_t>> list() const;

 private:
  struct alignas(64) Stripe {
    std::atomic<uint64_t> values[size_t(Counter::kCount)]{};
  };
  Stripe stripes_[kThreadStripes];
};

// Calls that make a checkpoint impossible (managed memory, IPC handles):
// the program keeps working; a dump is refused with the calls' names.
class UnsupportedCalls {
 public:
  void note(const char* call);
  std::vector<std::string> list() const;

 private:
  mutable std::mutex mu_;
  std::set<std::string> calls_;
};

// Stream captures under way anywhere in the process: while none is, no
// launch needs to ask the driver whether its stream is being captured.
class Captures {
 public:
  void begun() { active_.fetch_add(1, std::memory_order_relaxed); }
  // A capture ends with cuStreamEndCapture whether or not that succeeds.
  void ended() {
    int active = active_.load();
    while (active > 0 && !active_.compare_exchange_weak(active, active - 1)) {
    }
  }
  // Whether work queued on `stream` now goes into a graph being captured.
  bool capturing(CUstream stream, bool per_thread_stream) const {
    return any() && driver_capturing(stream, per_thread_stream);
  }
  // Whether any stream of the process may be capturing.
  bool any() const { return active_.load(std::memory_order_relaxed) != 0; }

 private:
  static bool driver_capturing(CUstream stream, bool per_thread_stream);
  std::atomic<int> active_{0};
};

// The call counter's kinds (call_cycles.h): every driver function
// (driver::call_kind), then the library calls phos stands in for (cuBLAS,
// NCCL), numbered as they first count.
inline constexpr uint32_t kLibraryCallKinds = 256;
inline constexpr uint32_t kCallKinds = uint32_t(driver::kFunctionCount) + kLibraryCallKinds;
// The kind of library call `name`, looked up once per call site (`site`,
// kNoCallKind until then); past kLibraryCallKinds names, the last kind.
CallKind library_call_kind(const char* name, std::atomic<CallKind>& site);
// A kind's name: the driver function's, or the library call's.
std::string call_kind_name(CallKind kind);

// A library hook's count, of kind `name`; its kind looked up the first
// time this site counts.
#define PHOS_LIBRARY_SCOPE(name)                                                    \
  ::phos::hooks::CallScope phos_library_scope_([&] {                                \
    static std::atomic<::phos::hooks::CallKind> site{::phos::hooks::kNoCallKind};   \
    return ::phos::hooks::library_call_kind(name, site);                            \
  })

class Runtime {
 public:
  Runtime();
  Runtime(const Runtime&) = delete;
  Runtime& operator=(const Runtime&) = delete;

 private:
  friend class RuntimeView;  // the only way in

  Gate gate_;
  StepBoundary steps_;  // the program's iteration boundaries (phos_step)
  DeviceMemory memory_;
  // cuBLAS's workspaces and its own memory: what its calls write beside
  // their arguments (told by the cuBLAS and allocation hooks).
  LibraryMemory library_memory_;
  ModuleRegistry modules_;
  // One entry per launched kernel, shared by the three features below (kernel_registry.h).
  KernelRegistry kernels_{modules_, describe_kernel};
  LaunchLog launches_{kernels_};
  // Its buffer index follows the device memory while it is on.
  LaunchSpeculation speculation_{kernels_, memory_};
  // Its background builds pass the gate.
  LaunchValidation validation_{kernels_, gate_};
  // A concurrent dump's copy window, while one is open (copy_window.h); told
  // by the device memory of the units the program lets go of.
  CopyWindow copy_window_;
  // The program's live NCCL communicators (hooks/nccl.cc).
  NcclCommunicators nccl_;
  Counters counters_;
  // Off unless PHOS_CALL_CYCLES=on (read when the runtime is made, before
  // the first hook counts).
  CallCycles call_cycles_{kCallKinds};
  UnsupportedCalls unsupported_;
  Captures captures_;
  // Events another process may record or wait on (hooks/ipc.cc).
  InterprocessEvents interprocess_events_;
  std::atomic<bool> cuda_used_{false};
};

// The one Runtime, made at first use (a hook may run before libphos.so's
// constructor, from another library's). Inline: every hook's view asks
// for it, once per call.
Runtime& make_runtime();
extern std::atomic<Runtime*> g_runtime;
inline Runtime& runtime() {
  Runtime* r = g_runtime.load(std::memory_order_acquire);
  return __builtin_expect(r != nullptr, 1) ? *r : make_runtime();
}

// The way into the runtime: one pointer, taken once per call (one load of
// g_runtime), each part an offset from it. A family's view derives from it
// and makes public, with a using-declaration each, the parts the family
// uses, e.g.
//
//   // What the VMM hooks use.
//   struct VmmDeps : RuntimeView {
//     using RuntimeView::gate;
//     using RuntimeView::memory;
//   };
//   ... const VmmDeps rt; GatePass pass(rt.gate()); ...
class RuntimeView {
 public:
  explicit RuntimeView(Runtime& r = runtime()) : r_(&r) {}

 protected:
  Gate& gate() const { return r_->gate_; }
  StepBoundary& steps() const { return r_->steps_; }
  DeviceMemory& memory() const { return r_->memory_; }
  LibraryMemory& library_memory() const { return r_->library_memory_; }
  ModuleRegistry& modules() const { return r_->modules_; }
  KernelRegistry& kernels() const { return r_->kernels_; }
  LaunchLog& launches() const { return r_->launches_; }
  LaunchSpeculation& speculation() const { return r_->speculation_; }
  LaunchValidation& validation() const { return r_->validation_; }
  CopyWindow& copy_window() const { return r_->copy_window_; }
  NcclCommunicators& nccl() const { return r_->nccl_; }
  Counters& counters() const { return r_->counters_; }
  CallCycles& call_cycles() const { return r_->call_cycles_; }
  UnsupportedCalls& unsupported() const { return r_->unsupported_; }
  Captures& captures() const { return r_->captures_; }
  InterprocessEvents& interprocess_events() const { return r_->interprocess_events_; }
  // Whether the program called the driver (cuInit).
  std::atomic<bool>& cuda_used() const { return r_->cuda_used_; }

 private:
  Runtime* r_;
};

}  // namespace phos::hooks
