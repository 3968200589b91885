#include "driver/cuda_api.h"

#include <dlfcn.h>

#include <mutex>

namespace phos::plugin {

namespace {
CudaApi api;
}  // namespace

Result<const CudaApi*> CudaApi::loaded() {
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
  });
  if (!failure.empty()) return make_error(failure, ENODEV);
  return &api;
}

Result<const CudaApi*> CudaApi::get() {
  auto lib = loaded();
  if (!lib) return lib;
  static std::string failure;
  static std::once_flag once;
  std::call_once(once, [] {
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
