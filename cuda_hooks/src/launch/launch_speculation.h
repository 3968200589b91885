// Read/write-set speculation of every launch while a protocol needs it
// (speculation/): the buffer index follows the program's allocations, each
// kernel's parameter layout is put together at its first launch, kept in
// its registry entry (kernel_registry.h) and cached by module hash and name,
// and every launch, copy, memset and known library call gets its set. For
// now the sets feed per-kernel statistics (agent status, phosctl kernels,
// the stats file); the concurrent protocols will consume them.
//
// Off, a launch pays one relaxed load. On, one lock per launch: the index
// and the caches are shared by every thread that launches.
#pragma once

#include <cuda.h>

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "launch/launch_log.h"
#include "memory/device_memory.h"
#include "phos/hooks/call_ranges.h"
#include "phos/hooks/kernel_registry.h"
#include "phos/hooks/module_registry.h"
#include "phos/images/agent_messages.h"
#include "phos/speculation/fatbin.h"
#include "phos/speculation/signature_db.h"
#include "phos/speculation/speculate.h"

namespace phos::hooks {

// The extents [start, end) of the buffers a launch is speculated to write,
// for a validator's range table; known is false for an unknown set, and for
// a kernel issued inside a known library call (its set is the call's exact
// one, nothing to validate).
struct WriteRanges {
  bool known = false;
  bool exact = false;    // the set is exact (not speculated)
  bool covered = false;  // issued inside a known library call: its exact set covers it

  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  // The buffers it is speculated to read (filled while an on-demand
  // restore's window is open: a launch waits for them to be in).
  std::vector<std::pair<uint64_t, uint64_t>> reads;
};

class LaunchSpeculation final : public BufferObserver {
 public:
  // `memory`: the buffers its index follows while it is on.
  LaunchSpeculation(const KernelRegistry& kernels, DeviceMemory& memory) : kernels_(kernels), memory_(memory) {}

  bool active() const { return active_.load(std::memory_order_relaxed); }
  // On: the index is filled from the device memory and follows it from then
  // on. Off: the index is dropped, statistics are kept.
  void set_active(bool on);
  // Signature databases (phos-sigdb) from a ':'-separated list of files.
  Result<void> load_signatures(const std::string& paths);

  // `out`, if given, gets the set (for the launch record); `writes`, if
  // given, its written buffers (for the validator).
  void on_kernel(Kernel& k, void** params, void** extra, LaunchSet* out = nullptr, WriteRanges* writes = nullptr);
  // A module image just loaded (content hash `hash`): its cubin's kernel
  // records are read now, for the layouts' cross-check.
  void module_loaded(uint64_t hash, const void* image);
  // A kernel whose arguments were copied aside, packed by the driver's
  // layout (a graph's kernel node, launched with its graph).
  void on_packed_kernel(Kernel& k, const std::byte* args, size_t size);
  void on_call(const ranges::RangeList& ranges);

  // BufferObserver (called under DeviceMemory's lock).
  void buffer_added(uint64_t start, uint64_t size, uint64_t unit) override;
  void buffer_removed(uint64_t start) override;

  struct Totals {
    uint64_t launches = 0, exact = 0, speculated = 0, unknown = 0;  // kernels
    uint64_t calls = 0, calls_exact = 0, calls_unknown = 0;         // copies, memsets, library calls
    uint64_t buffers = 0, lookups = 0, indexed = 0, kernels = 0;
    uint64_t cubin_checked = 0;             // kernels whose driver layout was compared with the cubin's
    uint64_t cubin_unreadable = 0;          // modules whose cubin could not be read (not: PTX only)
    uint64_t index_refused = 0;             // buffers the index refused (overlapping one it holds)
    uint64_t integer_words = 0;             // struct words not taken for pointers (AccessSet::integer_words)
    uint64_t analysis_ns = 0, analysis_max_ns = 0;  // time analysing kernels at their first launch
    // The slowest analysis's parts (where a first launch's time went):
    // waiting for the speculation's lock, reading the module's cubin
    // records (once a module), putting the layout together.
    uint64_t worst_lock_ns = 0, worst_metadata_ns = 0, worst_layout_ns = 0;
  };
  Totals totals();
  // Kernels of unloaded modules first (the registry retired them), then the live ones.
  std::vector<agent::KernelSpeculation> kernels();
  // Lookups a second on the live index, from `n` timed lookups of addresses
  // inside and between its buffers (statistics for the GPU suite).
  double measure_lookup_rate(size_t n);

  // Kernels issued inside a known library call are covered by its exact
  // set. The scope keeps that set and the copy window (CopyWindow::
  // sequence(), 0 for none) it was checked against: a call that began
  // before a window opened (its kernels held at the gate while the process
  // was stopped) has its set checked at its first kernel inside the window.
  class ExactScope {
   public:
    ExactScope(const ranges::RangeList* set, const char* call, uint64_t checked_window);
    ~ExactScope();
    ExactScope(const ExactScope&) = delete;
    ExactScope& operator=(const ExactScope&) = delete;
    // This thread's innermost scope, or null.
    static ExactScope* current();

    const ranges::RangeList* const set;
    const char* const call;
    uint64_t checked_window;

   private:
    ExactScope* const outer_;
  };

 private:
  // What the speculation keeps per kernel, in its registry entry.
  struct KernelEntry final : KernelState {
    std::shared_ptr<const speculation::KernelLayout> layout;
    uint64_t launches = 0, exact = 0, speculated = 0, unknown = 0, buffers = 0, reads = 0, writes = 0;
    bool wide_guess_said = false;  // the log line of GuessedWord, once a kernel
  };
  struct ModuleMetadata {
    bool read = false;
    std::vector<speculation::CubinKernel> kernels;
  };
  void speculate(Kernel& k, const speculation::LaunchArgs& args, LaunchSet* out, WriteRanges* writes);
  KernelEntry& entry(Kernel& k, std::unique_lock<std::mutex>& lock);
  static void say_wide_guess(KernelEntry& e, const Kernel& k, const speculation::GuessedWord& w);
  // A module's cubin records into `m`; an unreadable cubin is counted (a
  // module with no cubin for this GPU, PTX only, is not).
  void read_metadata(ModuleMetadata& m, const void* image, uint32_t arch, bool* unreadable);
  // The parts of one analysis, for Totals' worst_* figures.
  struct AnalysisTimes {
    uint64_t lock_ns = 0, metadata_ns = 0, layout_ns = 0;
  };
  std::shared_ptr<const speculation::KernelLayout> analyse(const Kernel& k, AnalysisTimes& times);
  const speculation::CubinKernel* cubin_kernel_locked(const ModuleRef& module, const std::string& name);

  const KernelRegistry& kernels_;
  DeviceMemory& memory_;
  std::atomic<bool> active_{false};
  std::mutex switch_mu_;  // one set_active at a time (taken before DeviceMemory's lock and mu_)
  std::mutex mu_;
  speculation::BufferIndex index_;
  speculation::SignatureDb signatures_;
  // Layouts by (module hash, kernel name): a module loaded twice, or in two
  // contexts, is analysed once. Kernels of modules without a hash are not
  // shared: two of them may have the same name and different parameters.
  std::map<std::pair<uint64_t, std::string>, std::shared_ptr<const speculation::KernelLayout>> layouts_;
  std::unordered_map<uint64_t, ModuleMetadata> metadata_;  // by module hash
  uint32_t arch_ = 0;  // SM version of the device, for the cubin to read
  Totals totals_;
};

}  // namespace phos::hooks
