// Helpers of the GPU suite's CUDA programs: error checks, and a ground-truth
// count of kernels from CUPTI's activity records (independent of phos).
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>
#include <cupti.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <string>

#define CHECK_CUDA(x)                                                                          \
  do {                                                                                         \
    cudaError_t e_ = (x);                                                                      \
    if (e_ != cudaSuccess) {                                                                   \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      std::exit(1);                                                                            \
    }                                                                                          \
  } while (0)

#define CHECK_CUPTI(x)                                                          \
  do {                                                                          \
    CUptiResult r_ = (x);                                                       \
    if (r_ != CUPTI_SUCCESS) {                                                  \
      std::fprintf(stderr, "%s:%d: %s: CUPTI error %d\n", __FILE__, __LINE__, #x, int(r_)); \
      std::exit(1);                                                             \
    }                                                                           \
  } while (0)

namespace gpu_check {

inline std::atomic<unsigned long long> cupti_kernels{0};

inline void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *size = 8 << 20;
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, *size));
  *max_records = 0;
}

inline void CUPTIAPI buffer_completed(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
  CUpti_Activity* record = nullptr;
  while (cuptiActivityGetNextRecord(buffer, valid, &record) == CUPTI_SUCCESS)
    if (record->kind == CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL || record->kind == CUPTI_ACTIVITY_KIND_KERNEL)
      cupti_kernels++;
  std::free(buffer);
}

// Counts every kernel the GPU runs from now until kernel_count(), unless
// GPU_CHECK_NO_CUPTI is set (the driver's checkpoint API refuses processes
// that CUPTI is attached to).
inline bool cupti_off() { return std::getenv("GPU_CHECK_NO_CUPTI") != nullptr; }
inline void start_kernel_count() {
  if (cupti_off()) return;
  CHECK_CUPTI(cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed));
  CHECK_CUPTI(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL));
}

inline unsigned long long kernel_count() {
  CHECK_CUDA(cudaDeviceSynchronize());
  if (cupti_off()) return 0;
  CHECK_CUPTI(cuptiActivityFlushAll(1));
  return cupti_kernels.load();
}

// The workload contract's files: STATE rewritten whole (a .tmp renamed over
// it: a reader never sees half a line), OUTPUTS appended to. Exit 2 if not.
inline void put(const std::string& path, const std::string& text) {
  FILE* f = std::fopen((path + ".tmp").c_str(), "w");
  if (!f) std::exit(2);
  std::fputs(text.c_str(), f);
  std::fclose(f);
  if (std::rename((path + ".tmp").c_str(), path.c_str()) != 0) std::exit(2);
}
inline void append(const std::string& path, const std::string& line) {
  FILE* f = std::fopen(path.c_str(), "a");
  if (!f) std::exit(2);
  std::fputs(line.c_str(), f);
  std::fclose(f);
}

}  // namespace gpu_check
