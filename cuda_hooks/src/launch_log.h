// The record of kernel launches: for each, the kernel, its grid and block,
// stream and the raw bytes of its arguments, laid out by the kernel's
// parameter layout (cuFuncGetParamInfo), in a ring of the latest launches.
// Off, it costs one relaxed load per launch; the protocols that need it
// (speculation, lazy restore) turn it on.
#pragma once

#include <cuda.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

namespace phos::hooks {

struct ParamSlot {
  uint32_t offset;
  uint32_t size;
};

struct LaunchRecord {
  static constexpr size_t kMaxArgBytes = 1024;  // longer argument buffers are cut (truncated set)
  uint64_t sequence = 0;
  CUfunction function = nullptr;
  uint32_t grid[3] = {};
  uint32_t block[3] = {};
  uint32_t shared_bytes = 0;
  CUstream stream = nullptr;
  uint32_t arg_bytes = 0;
  bool truncated = false;
  std::byte args[kMaxArgBytes];
};

struct KernelSummary {
  std::string name;
  uint64_t launches = 0;
  std::vector<ParamSlot> params;
};

class LaunchLog {
 public:
  static constexpr size_t kRingSize = 4096;

  bool enabled() const { return enabled_.load(std::memory_order_relaxed); }
  void enable(bool on);
  void record(CUfunction f, const uint32_t grid[3], const uint32_t block[3], uint32_t shared_bytes, CUstream stream,
              void** params, void** extra);
  uint64_t recorded() const { return next_.load(); }
  std::vector<KernelSummary> kernels();

 private:
  struct Kernel {
    std::string name;
    std::vector<ParamSlot> params;
    uint64_t launches = 0;
  };
  Kernel& kernel_locked(CUfunction f);

  std::atomic<bool> enabled_{false};
  std::atomic<uint64_t> next_{0};
  std::mutex mu_;
  std::unordered_map<CUfunction, Kernel> kernels_;
  std::unique_ptr<LaunchRecord[]> ring_;
};

}  // namespace phos::hooks
