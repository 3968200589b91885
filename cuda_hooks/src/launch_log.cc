#include "launch_log.h"

#include <cstring>

#include "driver.h"

namespace phos::hooks {

void LaunchLog::enable(bool on) {
  std::lock_guard<std::mutex> lock(mu_);
  if (on && !ring_) ring_ = std::make_unique<LaunchRecord[]>(kRingSize);
  enabled_.store(on, std::memory_order_release);
}

LaunchLog::Kernel& LaunchLog::kernel_locked(CUfunction f) {
  auto [it, inserted] = kernels_.try_emplace(f);
  if (!inserted) return it->second;
  Kernel& k = it->second;
  // cudart launches context-independent kernels (CUkernel) through
  // cuLaunchKernel; the CUfunction queries refuse those, the CUkernel ones
  // answer.
  const char* name = nullptr;
  auto kernel = reinterpret_cast<CUkernel>(f);
  if (PHOS_REAL(cuFuncGetName)(&name, f) == CUDA_SUCCESS || PHOS_REAL(cuKernelGetName)(&name, kernel) == CUDA_SUCCESS)
    k.name = name ? name : "";
  size_t offset0 = 0, size0 = 0;
  bool as_kernel = PHOS_REAL(cuFuncGetParamInfo)(f, 0, &offset0, &size0) != CUDA_SUCCESS &&
                   PHOS_REAL(cuKernelGetParamInfo)(kernel, 0, &offset0, &size0) == CUDA_SUCCESS;
  for (size_t i = 0;; i++) {
    size_t offset = 0, size = 0;
    CUresult r = as_kernel ? PHOS_REAL(cuKernelGetParamInfo)(kernel, i, &offset, &size)
                           : PHOS_REAL(cuFuncGetParamInfo)(f, i, &offset, &size);
    if (r != CUDA_SUCCESS) break;
    k.params.push_back({uint32_t(offset), uint32_t(size)});
  }
  return k;
}

void LaunchLog::record(CUfunction f, const uint32_t grid[3], const uint32_t block[3], uint32_t shared_bytes,
                       CUstream stream, void** params, void** extra) {
  std::lock_guard<std::mutex> lock(mu_);
  Kernel& k = kernel_locked(f);
  k.launches++;
  uint64_t seq = next_.fetch_add(1);
  LaunchRecord& r = ring_[seq % kRingSize];
  r.sequence = seq;
  r.function = f;
  std::memcpy(r.grid, grid, sizeof(r.grid));
  std::memcpy(r.block, block, sizeof(r.block));
  r.shared_bytes = shared_bytes;
  r.stream = stream;
  r.arg_bytes = 0;
  r.truncated = false;
  if (params) {
    for (size_t i = 0; i < k.params.size(); i++) {
      const ParamSlot& p = k.params[i];
      if (p.offset + p.size > LaunchRecord::kMaxArgBytes) {
        r.truncated = true;
        continue;
      }
      std::memcpy(r.args + p.offset, params[i], p.size);
      r.arg_bytes = std::max(r.arg_bytes, p.offset + p.size);
    }
  } else if (extra) {
    // {CU_LAUNCH_PARAM_BUFFER_POINTER, buf, CU_LAUNCH_PARAM_BUFFER_SIZE, &size, CU_LAUNCH_PARAM_END}
    void* buffer = nullptr;
    size_t size = 0;
    for (size_t i = 0; extra[i] != CU_LAUNCH_PARAM_END && i < 16; i += 2) {
      if (extra[i] == CU_LAUNCH_PARAM_BUFFER_POINTER) buffer = extra[i + 1];
      if (extra[i] == CU_LAUNCH_PARAM_BUFFER_SIZE) size = *static_cast<size_t*>(extra[i + 1]);
    }
    if (buffer) {
      r.truncated = size > LaunchRecord::kMaxArgBytes;
      r.arg_bytes = uint32_t(std::min(size, LaunchRecord::kMaxArgBytes));
      std::memcpy(r.args, buffer, r.arg_bytes);
    }
  }
}

std::vector<KernelSummary> LaunchLog::kernels() {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<KernelSummary> out;
  for (const auto& [f, k] : kernels_) out.push_back({k.name, k.launches, k.params});
  return out;
}

}  // namespace phos::hooks
