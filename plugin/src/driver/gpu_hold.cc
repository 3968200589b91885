#include "phos/plugin/gpu_hold.h"

#include <mutex>

#include "driver/cuda_api.h"

namespace phos::plugin {
namespace {

std::mutex g_mu;
std::vector<int> g_held;  // ordinals whose primary context is retained

}  // namespace

Result<std::vector<HeldGpu>> hold_gpu_contexts() {
  std::lock_guard<std::mutex> lock(g_mu);
  auto api = CudaApi::get();
  if (!api) return api.error();
  const CudaApi& cu = **api;
  int count = 0;
  if (CUresult r = cu.cuDeviceGetCount(&count); r != CUDA_SUCCESS) return make_error(cu.error("cuDeviceGetCount", r), ENODEV);
  std::vector<HeldGpu> held;
  for (int ordinal = 0; ordinal < count; ordinal++) {
    const std::string what = "GPU " + std::to_string(ordinal);
    CUdevice dev = 0;
    CUcontext ctx = nullptr;
    if (CUresult r = cu.cuDeviceGet(&dev, ordinal); r != CUDA_SUCCESS) return make_error(cu.error(what.c_str(), r), ENODEV);
    if (CUresult r = cu.cuDevicePrimaryCtxRetain(&ctx, dev); r != CUDA_SUCCESS)
      return make_error(cu.error((what + ": its context").c_str(), r), ENODEV);
    g_held.push_back(ordinal);
    if (CUresult r = cu.cuCtxSetCurrent(ctx); r != CUDA_SUCCESS)
      return make_error(cu.error((what + ": make its context current").c_str(), r), ENODEV);
    // Its least: the driver takes 0 for the stack and rounds the others up.
    for (CUlimit limit : {CU_LIMIT_STACK_SIZE, CU_LIMIT_PRINTF_FIFO_SIZE, CU_LIMIT_MALLOC_HEAP_SIZE})
      (void)cu.cuCtxSetLimit(limit, 0);
    HeldGpu h;
    h.ordinal = ordinal;
    char name[256] = "";
    if (cu.cuDeviceGetName(name, sizeof(name), dev) == CUDA_SUCCESS) h.name = name;
    size_t free_bytes = 0, total = 0;
    if (cu.cuMemGetInfo_v2(&free_bytes, &total) == CUDA_SUCCESS) h.free_bytes = free_bytes;
    held.push_back(std::move(h));
  }
  return held;
}

void release_gpu_contexts() {
  std::lock_guard<std::mutex> lock(g_mu);
  auto api = CudaApi::get();
  if (!api) return;
  for (int ordinal : g_held) {
    CUdevice dev = 0;
    if ((*api)->cuDeviceGet(&dev, ordinal) == CUDA_SUCCESS) (void)(*api)->cuDevicePrimaryCtxRelease_v2(dev);
  }
  g_held.clear();
}

}  // namespace phos::plugin
