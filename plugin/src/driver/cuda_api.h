// The CUDA driver as the plugin uses it, loaded at run time (dlopen): criu
// with the phos plugin must start on hosts without a GPU, and the plugin
// must not link libcuda into criu.
#pragma once

#include <cuda.h>

#include <string>

#include "phos/support/result.h"

#undef cuGetProcAddress

namespace phos::plugin {

#define PHOS_PLUGIN_CUDA_FUNCTIONS(X)        \
  X(cuInit)                                  \
  X(cuGetErrorName)                          \
  X(cuDeviceGet)                             \
  X(cuDeviceGetCount)                        \
  X(cuDeviceGetName)                         \
  X(cuDeviceGetUuid_v2)                      \
  X(cuDeviceTotalMem_v2)                     \
  X(cuDeviceGetAttribute)                    \
  X(cuDevicePrimaryCtxRetain)                \
  X(cuDevicePrimaryCtxRelease_v2)            \
  X(cuCtxSetCurrent)                         \
  X(cuCtxSetLimit)                           \
  X(cuMemGetAllocationGranularity)           \
  X(cuMemCreate)                             \
  X(cuMemRelease)                            \
  X(cuMemImportFromShareableHandle)          \
  X(cuMemExportToShareableHandle)            \
  X(cuMemAddressReserve)                     \
  X(cuMemAddressFree)                        \
  X(cuMemMap)                                \
  X(cuMemUnmap)                              \
  X(cuMemSetAccess)                          \
  X(cuMemHostAlloc)                          \
  X(cuMemFreeHost)                           \
  X(cuMemHostRegister_v2)                    \
  X(cuMemHostUnregister)                     \
  X(cuMemcpyDtoH_v2)                         \
  X(cuMemcpyHtoD_v2)                         \
  X(cuMemcpyDtoHAsync_v2)                    \
  X(cuMemcpyHtoDAsync_v2)                    \
  X(cuMemcpyDtoDAsync_v2)                    \
  X(cuMemcpyPeerAsync)                       \
  X(cuDeviceCanAccessPeer)                   \
  X(cuMemsetD8Async)                         \
  X(cuMemAlloc_v2)                           \
  X(cuMemFree_v2)                            \
  X(cuMemGetInfo_v2)                         \
  X(cuStreamCreate)                          \
  X(cuStreamSynchronize)                     \
  X(cuStreamDestroy_v2)                      \
  X(cuModuleLoadData)                        \
  X(cuModuleGetFunction)                     \
  X(cuLaunchKernel)                          \
  X(cuMemHostGetDevicePointer_v2)            \
  X(cuCheckpointProcessGetRestoreThreadId)   \
  X(cuCheckpointProcessGetState)             \
  X(cuCheckpointProcessLock)                 \
  X(cuCheckpointProcessCheckpoint)           \
  X(cuCheckpointProcessRestore)              \
  X(cuCheckpointProcessUnlock)

struct CudaApi {
#define PHOS_PLUGIN_CUDA_MEMBER(name) decltype(&::name) name = nullptr;
  PHOS_PLUGIN_CUDA_FUNCTIONS(PHOS_PLUGIN_CUDA_MEMBER)
#undef PHOS_PLUGIN_CUDA_MEMBER

  // Loads libcuda.so.1 and cuInit()s it, once per process.
  static Result<const CudaApi*> get();
  // Loads libcuda.so.1 without cuInit (the same table): for the
  // checkpoint calls, where the driver takes them without it.
  static Result<const CudaApi*> loaded();

  // "what: CUDA_ERROR_NAME", for messages.
  std::string error(const char* what, CUresult r) const;
};

// Turns a CUresult into a Result: PHOS_CU(api, call, "what").
#define PHOS_CU(api, expr, what)                                                 \
  do {                                                                           \
    CUresult phos_cu_r_ = (expr);                                                \
    if (phos_cu_r_ != CUDA_SUCCESS) return ::phos::make_error((api).error(what, phos_cu_r_), EIO); \
  } while (0)

}  // namespace phos::plugin
