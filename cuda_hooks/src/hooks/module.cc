// Module and library loads: each loaded image goes into the module registry
// (module_registry.h) with its hash, size and kind, and every function,
// kernel and global the program takes from it is listed there, so that a
// launch record names its kernel's module.
//
// The runtime-level registration (__cudaRegisterFatBinary and friends) is
// seen only for programs that use the shared libcudart (PyTorch does):
// programs linked with the static cudart (nvcc's default) register inside
// the executable, where no preload can interpose. Their modules are seen
// anyway: cudart loads each registered fatbin with cuLibraryLoadData (or
// cuModuleLoadData on older drivers), hooked here.
#include <vector_types.h>

#include "driver/driver.h"
#include "driver/library_next.h"
#include "runtime.h"

#define PHOS_EXPORT __attribute__((visibility("default")))

using namespace phos::hooks;

namespace {

// What the module hooks use: the gate, the module registry, and what keeps
// per-module state: the kernel registry, the speculation (cubin parameter
// records) and the validation (twins, patches).
struct ModuleDeps : RuntimeView {
  using RuntimeView::gate;
  using RuntimeView::kernels;
  using RuntimeView::modules;
  using RuntimeView::speculation;
  using RuntimeView::validation;
};

// `note` runs after the driver's success, unless the load is the Sanitizer
// API's own (sass_validation.h: its patches are not the program's modules).
template <class Note>
CUresult noted(CUresult r, Note&& note) {
  if (r == CUDA_SUCCESS && !in_sanitizer_call()) note();
  return r;
}

// A module loaded from an image in memory: registered, and while speculation
// is on its cubin's parameter records are read now, while the image is
// certainly valid (the caller may free it after the load).
void loaded_image(ModuleDeps rt, const void* handle, const void* image, const char* source) {
  ModuleImage identified = identify_image(image);
  uint64_t id = rt.modules().loaded(handle, identified, source);
  if (rt.speculation().active()) rt.speculation().module_loaded(identified.hash, image);
  if (!rt.validation().active()) return;
  // Where a PTX for twins comes from: the text itself (NVRTC, cuModuleLoadData
  // of PTX), a fatbin's PTX (nvcc embeds compute_XX PTX by default), or for a
  // bare cubin (Triton's) the PTX Triton's cache keeps beside it.
  switch (identified.kind) {
    case ModuleKind::kPtx:
    case ModuleKind::kFatbin:
      rt.validation().module_loaded(id, identified.hash, image, identified.kind == ModuleKind::kPtx);
      break;
    case ModuleKind::kCubin: rt.validation().cubin_loaded(id, identified.hash, image, identified.size); break;
    default: break;
  }
}

// A module or library unloaded: the module registry forgets it and the
// kernel registry retires its kernels, with what the launch log, the
// speculation and the validation kept for them (the driver may hand a later
// module's functions the handles of this one's); the validation drops the
// twins and patches it made of it.
void unloaded(ModuleDeps rt, const void* handle) {
  if (in_sanitizer_call()) return;
  uint64_t id = rt.kernels().module_unloaded(handle);
  if (rt.validation().ever_active()) rt.validation().module_unloaded(handle, id);
}

}  // namespace

extern "C" PHOS_EXPORT CUresult cuModuleLoad(CUmodule* module, const char* fname) {
  const ModuleDeps rt;
  GatePass pass(rt.gate(), PHOS_CALL_KIND(cuModuleLoad));
  return noted(PHOS_REAL(cuModuleLoad)(module, fname),
               [&] { rt.modules().loaded(*module, identify_file(fname), fname); });
}

extern "C" PHOS_EXPORT CUresult cuModuleLoadData(CUmodule* module, const void* image) {
  const ModuleDeps rt;
  GatePass pass(rt.gate(), PHOS_CALL_KIND(cuModuleLoadData));
  return noted(PHOS_REAL(cuModuleLoadData)(module, image),
               [&] { loaded_image(rt, *module, image, "cuModuleLoadData"); });
}

extern "C" PHOS_EXPORT CUresult cuModuleLoadDataEx(CUmodule* module, const void* image, unsigned int n,
                                                   CUjit_option* options, void** values) {
  const ModuleDeps rt;
  GatePass pass(rt.gate(), PHOS_CALL_KIND(cuModuleLoadDataEx));
  return noted(PHOS_REAL(cuModuleLoadDataEx)(module, image, n, options, values),
               [&] { loaded_image(rt, *module, image, "cuModuleLoadDataEx"); });
}

extern "C" PHOS_EXPORT CUresult cuModuleLoadFatBinary(CUmodule* module, const void* fatbin) {
  const ModuleDeps rt;
  GatePass pass(rt.gate(), PHOS_CALL_KIND(cuModuleLoadFatBinary));
  return noted(PHOS_REAL(cuModuleLoadFatBinary)(module, fatbin),
               [&] { loaded_image(rt, *module, fatbin, "cuModuleLoadFatBinary"); });
}

extern "C" PHOS_EXPORT CUresult cuLibraryLoadData(CUlibrary* library, const void* code, CUjit_option* options,
                                                  void** values, unsigned int n, CUlibraryOption* lib_options,
                                                  void** lib_values, unsigned int lib_n) {
  const ModuleDeps rt;
  GatePass pass(rt.gate(), PHOS_CALL_KIND(cuLibraryLoadData));
  return noted(PHOS_REAL(cuLibraryLoadData)(library, code, options, values, n, lib_options, lib_values, lib_n),
               [&] { loaded_image(rt, *library, code, "cuLibraryLoadData"); });
}

extern "C" PHOS_EXPORT CUresult cuLibraryLoadFromFile(CUlibrary* library, const char* file, CUjit_option* options,
                                                      void** values, unsigned int n, CUlibraryOption* lib_options,
                                                      void** lib_values, unsigned int lib_n) {
  const ModuleDeps rt;
  GatePass pass(rt.gate(), PHOS_CALL_KIND(cuLibraryLoadFromFile));
  return noted(PHOS_REAL(cuLibraryLoadFromFile)(library, file, options, values, n, lib_options, lib_values, lib_n),
               [&] { rt.modules().loaded(*library, identify_file(file), file); });
}

extern "C" PHOS_EXPORT CUresult cuModuleUnload(CUmodule module) {
  const ModuleDeps rt;
  GatePass pass(rt.gate(), PHOS_CALL_KIND(cuModuleUnload));
  return noted(PHOS_REAL(cuModuleUnload)(module), [&] { unloaded(rt, module); });
}

extern "C" PHOS_EXPORT CUresult cuLibraryUnload(CUlibrary library) {
  const ModuleDeps rt;
  GatePass pass(rt.gate(), PHOS_CALL_KIND(cuLibraryUnload));
  return noted(PHOS_REAL(cuLibraryUnload)(library), [&] { unloaded(rt, library); });
}

extern "C" PHOS_EXPORT CUresult cuModuleGetFunction(CUfunction* f, CUmodule module, const char* name) {
  const ModuleDeps rt;
  GatePass pass(rt.gate(), PHOS_CALL_KIND(cuModuleGetFunction));
  return noted(PHOS_REAL(cuModuleGetFunction)(f, module, name), [&] { rt.modules().function(module, *f, name); });
}

extern "C" PHOS_EXPORT CUresult cuLibraryGetKernel(CUkernel* kernel, CUlibrary library, const char* name) {
  const ModuleDeps rt;
  GatePass pass(rt.gate(), PHOS_CALL_KIND(cuLibraryGetKernel));
  return noted(PHOS_REAL(cuLibraryGetKernel)(kernel, library, name),
               [&] { rt.modules().function(library, *kernel, name); });
}

extern "C" PHOS_EXPORT CUresult cuKernelGetFunction(CUfunction* f, CUkernel kernel) {
  const ModuleDeps rt;
  GatePass pass(rt.gate(), PHOS_CALL_KIND(cuKernelGetFunction));
  return noted(PHOS_REAL(cuKernelGetFunction)(f, kernel), [&] { rt.modules().same_module(kernel, *f); });
}

extern "C" PHOS_EXPORT CUresult cuModuleGetGlobal_v2(CUdeviceptr* dptr, size_t* bytes, CUmodule module,
                                                     const char* name) {
  const ModuleDeps rt;
  GatePass pass(rt.gate(), PHOS_CALL_KIND(cuModuleGetGlobal_v2));
  return noted(PHOS_REAL(cuModuleGetGlobal_v2)(dptr, bytes, module, name), [&] { rt.modules().global(module, name); });
}

extern "C" PHOS_EXPORT CUresult cuLibraryGetGlobal(CUdeviceptr* dptr, size_t* bytes, CUlibrary library,
                                                   const char* name) {
  const ModuleDeps rt;
  GatePass pass(rt.gate(), PHOS_CALL_KIND(cuLibraryGetGlobal));
  return noted(PHOS_REAL(cuLibraryGetGlobal)(dptr, bytes, library, name), [&] { rt.modules().global(library, name); });
}

// cudart's registration (crt/host_runtime.h), interposed from libphos.so and
// forwarded to the shared libcudart. Not gated: cudart's own driver calls are.
extern "C" {
void** __cudaRegisterFatBinary(void* fatbin);
void __cudaRegisterFatBinaryEnd(void** handle);
void __cudaUnregisterFatBinary(void** handle);
void __cudaRegisterFunction(void** handle, const char* host_function, char* device_function, const char* device_name,
                            int thread_limit, uint3* tid, uint3* bid, dim3* block, dim3* grid, int* warp_size);
}

namespace {
constexpr const char* kCudart = "libcudart.so";
}

extern "C" PHOS_EXPORT void** __cudaRegisterFatBinary(void* fatbin) {
  auto real = PHOS_NEXT(__cudaRegisterFatBinary, kCudart);
  void** handle = real ? real(fatbin) : nullptr;
  if (handle) ModuleDeps().modules().loaded(handle, identify_image(fatbin), "cudart registration", fatbin);
  return handle;
}

extern "C" PHOS_EXPORT void __cudaRegisterFatBinaryEnd(void** handle) {
  if (auto real = PHOS_NEXT(__cudaRegisterFatBinaryEnd, kCudart)) real(handle);
}

extern "C" PHOS_EXPORT void __cudaUnregisterFatBinary(void** handle) {
  if (auto real = PHOS_NEXT(__cudaUnregisterFatBinary, kCudart)) real(handle);
  unloaded(ModuleDeps(), handle);
}

extern "C" PHOS_EXPORT void __cudaRegisterFunction(void** handle, const char* host_function, char* device_function,
                                                   const char* device_name, int thread_limit, uint3* tid, uint3* bid,
                                                   dim3* block, dim3* grid, int* warp_size) {
  if (auto real = PHOS_NEXT(__cudaRegisterFunction, kCudart))
    real(handle, host_function, device_function, device_name, thread_limit, tid, bid, block, grid, warp_size);
  ModuleDeps().modules().function(handle, host_function, device_name);
}
