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
    HeldGpu h;
    h.ordinal = ordinal;
    CUdevice dev = 0;
    if (CUresult r = cu.cuDeviceGet(&dev, ordinal); r != CUDA_SUCCESS) {
      h.why_not = cu.error("cuDeviceGet", r);
      held.push_back(std::move(h));
      continue;
    }
    char name[256] = "";
    if (cu.cuDeviceGetName(name, sizeof(name), dev) == CUDA_SUCCESS) h.name = name;
    int mode = CU_COMPUTEMODE_DEFAULT;
    (void)cu.cuDeviceGetAttribute(&mode, CU_DEVICE_ATTRIBUTE_COMPUTE_MODE, dev);
    if (mode != CU_COMPUTEMODE_DEFAULT) {
      h.why_not = mode == CU_COMPUTEMODE_EXCLUSIVE_PROCESS
                      ? "compute mode exclusive-process: a context held there would keep every other process off it"
                      : "compute mode " + std::to_string(mode) + " (not the default)";
      held.push_back(std::move(h));
      continue;
    }
    CUcontext ctx = nullptr;
    if (CUresult r = cu.cuDevicePrimaryCtxRetain(&ctx, dev); r != CUDA_SUCCESS) {
      h.why_not = cu.error("its context", r);
      held.push_back(std::move(h));
      continue;
    }
    g_held.push_back(ordinal);
    h.held = true;
    if (cu.cuCtxSetCurrent(ctx) == CUDA_SUCCESS) {
      // Its least: the driver takes 0 for the stack and rounds the others up.
      for (CUlimit limit : {CU_LIMIT_STACK_SIZE, CU_LIMIT_PRINTF_FIFO_SIZE, CU_LIMIT_MALLOC_HEAP_SIZE})
        (void)cu.cuCtxSetLimit(limit, 0);
      size_t free_bytes = 0, total = 0;
      if (cu.cuMemGetInfo_v2(&free_bytes, &total) == CUDA_SUCCESS) h.free_bytes = free_bytes;
    }
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
