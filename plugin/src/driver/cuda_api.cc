#include "driver/cuda_api.h"

#include <dlfcn.h>

#include <mutex>

namespace phos::plugin {

Result<const CudaApi*> CudaApi::get() {
  static CudaApi api;
  static std::string failure;
  static std::once_flag once;
  std::call_once(once, [] {
    void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
      failure = std::string("cannot load the CUDA driver (libcuda.so.1): ") + dlerror();
      return;
    }
#define PHOS_PLUGIN_CUDA_LOAD(name)                                              \
  api.name = reinterpret_cast<decltype(&::name)>(dlsym(lib, #name));             \
  if (!api.name) {                                                               \
    failure = "the CUDA driver lacks " #name " (driver too old for phos)";       \
    return;                                                                      \
  }
    PHOS_PLUGIN_CUDA_FUNCTIONS(PHOS_PLUGIN_CUDA_LOAD)
#undef PHOS_PLUGIN_CUDA_LOAD
    if (CUresult r = api.cuInit(0); r != CUDA_SUCCESS) failure = api.error("cuInit", r);
  });
  if (!failure.empty()) return make_error(failure, ENODEV);
  return &api;
}

std::string CudaApi::error(const char* what, CUresult r) const {
  const char* name = nullptr;
  if (cuGetErrorName) cuGetErrorName(r, &name);
  return std::string(what) + ": " + (name ? name : "CUDA error " + std::to_string(int(r)));
}

}  // namespace phos::plugin
