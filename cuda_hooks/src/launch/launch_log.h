// The record of kernel launches and of the calls whose buffers are known
// exactly, in one ring of the latest, in the order they were issued. A kernel
// launch keeps the kernel, its grid and block, stream and the raw bytes of
// its arguments, laid out by the kernel's parameter layout
// (cuFuncGetParamInfo). A memcpy, memset, cuBLAS GEMM or NCCL collective
// keeps the device ranges it reads and writes (call_ranges.h). Work a library
// call issues (its kernels, copies, nested library calls) names that call.
// Off, it costs one relaxed load per launch or copy; the protocols that need
// it (speculation, lazy restore) turn it on.
#pragma once

#include <cuda.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "modules/kernel_info.h"
#include "phos/hooks/call_ranges.h"
#include "phos/hooks/kernel_registry.h"

namespace phos::hooks {


enum class RecordKind : uint8_t {
  kKernel,   // cuLaunchKernel and its variants
  kCopy,     // cuMemcpy*
  kSet,      // cuMemset*
  kLibrary,  // a cuBLAS or NCCL call
};
const char* record_kind_name(RecordKind k);

// A kernel's read/write set as the speculation gave it (launch_speculation.h),
// the first kMax buffers of it.
struct LaunchSet {
  static constexpr size_t kMax = 8;
  struct Item {
    uint64_t unit;   // the allocation (what a checkpoint copies)
    uint64_t start;  // the buffer's first byte
    uint8_t access;  // speculation::Access bits
  };
  bool present = false;  // speculation was on for this launch
  uint8_t kind = 0;      // speculation::SetKind
  uint8_t count = 0;
  uint32_t total = 0;    // buffers in the whole set
  Item items[kMax];
};

struct LaunchRecord {
  static constexpr size_t kMaxArgBytes = 1024;  // longer argument buffers are cut (truncated set)
  uint64_t sequence = 0;
  RecordKind kind = RecordKind::kKernel;
  const char* call = nullptr;  // the entry point (not for kernels): a string that lives for ever
  uint64_t within = 0;         // 1 + the sequence of the library call that issued this one; 0: none
  ranges::RangeList ranges;    // what the call reads and writes (not for kernels)
  CUfunction function = nullptr;
  const Kernel* kernel = nullptr;  // its registry entry (kernel_registry.h): names it even once retired
  uint64_t module = 0;  // the kernel's (module_registry.h); 0: not known
  uint32_t grid[3] = {};
  uint32_t block[3] = {};
  uint32_t shared_bytes = 0;
  CUstream stream = nullptr;
  uint32_t arg_bytes = 0;
  bool truncated = false;
  LaunchSet set;  // kernels, while speculation is on
  std::byte args[kMaxArgBytes];
};

struct KernelSummary {
  CUfunction function = nullptr;
  uint64_t module = 0;
  std::string name;
  uint64_t launches = 0;
  std::vector<ParamSlot> params;
};

class LaunchLog {
 public:
  static constexpr size_t kRingSize = 4096;
  explicit LaunchLog(const KernelRegistry& kernels) : kernels_(kernels) {}

  bool enabled() const { return enabled_.load(std::memory_order_relaxed); }
  void enable(bool on);
  void record(Kernel& k, const uint32_t grid[3], const uint32_t block[3], uint32_t shared_bytes, CUstream stream,
              void** params, void** extra, const LaunchSet* set = nullptr);
  // A call with known buffers; returns its sequence number.
  uint64_t record_call(RecordKind kind, const char* call, CUstream stream, const ranges::RangeList& ranges);
  uint64_t recorded() const { return next_.load(); }
  // The kernels recorded: those of unloaded modules first (the registry
  // retired them; the driver may have handed their handles to new kernels),
  // then the live ones.
  std::vector<KernelSummary> kernels();
  // The records still in the ring, oldest first.
  std::vector<LaunchRecord> recent();

 private:
  // What the log keeps per kernel, in its registry entry.
  struct Recorded final : KernelState {
    uint64_t launches = 0;
  };
  LaunchRecord& next_locked();

  const KernelRegistry& kernels_;
  std::atomic<bool> enabled_{false};
  std::atomic<uint64_t> next_{0};
  std::mutex mu_;
  std::unique_ptr<LaunchRecord[]> ring_;
};

// The library call under way on this thread (1 + its sequence), so that the
// work it issues names it; set only while recording.
class LibraryCallScope {
 public:
  explicit LibraryCallScope(uint64_t sequence);
  ~LibraryCallScope();
  LibraryCallScope(const LibraryCallScope&) = delete;
  LibraryCallScope& operator=(const LibraryCallScope&) = delete;
  static uint64_t current();

 private:
  uint64_t outer_;
};

}  // namespace phos::hooks
