// The SASS-level validator: kernels with no PTX this
// GPU can run (cuBLAS, cuDNN, PyTorch's own: cubins only) or whose twin
// cannot be used are validated in their own machine code, through NVIDIA's
// Sanitizer patching API (libsanitizer-public.so, in the toolkit's
// compute-sanitizer folder). The module of such a kernel is patched so that
// every global-memory access and bulk copy to global memory first calls
// phos's patch (cuda_hooks/sass/sass_patch.cu), which checks writes against
// the launch's range table (ptx/range_table.h, the twins' contract) and
// counts the ones outside it; the access still happens.
//
// The library is attached when the process starts (PHOS_VALIDATE=1 or sass):
// driver 580's Sanitizer API refuses, with INVALID_PARAMETER, to patch
// modules of a context created before it subscribed
// (test/gpu/probes/sanitizer_probe.cu). Modules are patched only while
// validation is on, at the first validated launch of one of their kernels,
// and unpatched when it goes off.
//
// The API's declarations are phos's own (below), from the toolkit's
// sanitizer.h, which CI machines lack; the GPU suite compiles them against
// the real header (test/gpu/sanitizer_abi_check.cc).
#pragma once

#include <cstdint>
#include <mutex>
#include <string>
#include <unordered_map>
#include <unordered_set>

#include "phos/support/result.h"

// The driver's handle types, declared as cuda.h declares them (a repeated
// identical typedef is allowed, so this and cuda.h can be included in either
// order): include/phos/hooks stays free of the CUDA headers.
typedef struct CUctx_st* CUcontext;
typedef struct CUmod_st* CUmodule;
typedef struct CUfunc_st* CUfunction;
typedef struct CUlib_st* CUlibrary;

namespace phos::hooks {

// The subset of the Sanitizer API phos uses (sanitizer_result.h,
// sanitizer_callbacks.h, sanitizer_patching.h).
namespace sanitizer {
using Result = int;  // SanitizerResult
inline constexpr Result kSuccess = 0;
using Subscriber = struct Subscriber_st*;  // Sanitizer_SubscriberHandle
using CallbackFunc = void (*)(void* userdata, int domain, uint32_t cbid, const void* cbdata);
// Sanitizer_InstructionId
inline constexpr int kGlobalMemoryAccess = 3;
inline constexpr int kBulkCopySharedToGlobal = 35;
inline constexpr int kBulkReductionSharedToGlobal = 37;

using GetResultString = Result (*)(Result, const char**);
using Subscribe = Result (*)(Subscriber*, CallbackFunc, void*);
using Unsubscribe = Result (*)(Subscriber);
using AddPatches = Result (*)(const void* image, CUcontext);
using PatchInstructions = Result (*)(int instruction, CUmodule, const char* callback);
using PatchModule = Result (*)(CUmodule);
using UnpatchModule = Result (*)(CUmodule);
using SetCallbackData = Result (*)(CUfunction, const void* userdata);
}  // namespace sanitizer

// Set while phos calls into the Sanitizer API: the modules it loads (the
// patches) are not the program's, and the module hooks leave them alone.
bool in_sanitizer_call();

class SassPatcher {
 public:
  // Loads the library (PHOS_SANITIZER_LIB, else compute-sanitizer/ under
  // CUDA_HOME, /usr/local/cuda, else the loader's path) and subscribes, with
  // no callback domain enabled. Call before the first CUDA call.
  Result<void> attach();
  bool attached() const { return attached_; }

  // What patch() found for a launched handle.
  struct Patched {
    CUmodule module = nullptr;
    CUfunction function = nullptr;  // the one the table is set on
    CUlibrary library = nullptr;    // for a CUkernel: its library
  };
  // The handles of a launched f, from the driver (once per kernel: the
  // caller keeps them). f may be a CUkernel (cudart 13 launches those):
  // the result's function is then its function in the current context.
  Result<Patched> resolve(CUfunction f) const;
  // `handles.module` patched: the patch image is added to the current
  // context once, the module patched once (again after unpatch_all or an
  // unload). A lookup when it is already. An error saying why when it
  // cannot be (the same error again at each later call for that module).
  Result<void> ensure_patched(const Patched& handles);
  // Launches of f (resolve()'s function) from now on hand `table` (a device
  // address, a CUdeviceptr; 0: none) to the patches. False if the API
  // refused.
  bool set_table(CUfunction f, uint64_t table);
  // Every patched module unpatched (validation going off).
  void unpatch_all();
  // `handle` (a module or library) unloaded: the modules it held are
  // forgotten (they are gone with it).
  void unloaded(const void* handle);

  struct Totals {
    uint64_t modules = 0, contexts = 0, patch_ns = 0, patch_max_ns = 0;
  };
  Totals totals() const;

 private:
  std::string message(sanitizer::Result r) const;

  bool attached_ = false;
  void* library_ = nullptr;
  sanitizer::Subscriber subscriber_ = nullptr;
  sanitizer::GetResultString get_result_string_ = nullptr;
  sanitizer::AddPatches add_patches_ = nullptr;
  sanitizer::PatchInstructions patch_instructions_ = nullptr;
  sanitizer::PatchModule patch_module_ = nullptr;
  sanitizer::UnpatchModule unpatch_module_ = nullptr;
  sanitizer::SetCallbackData set_callback_data_ = nullptr;

  // The API wants its patch calls serialized.
  mutable std::mutex mu_;
  std::unordered_set<CUcontext> contexts_;  // the patch image added
  struct ModuleState {
    CUlibrary library = nullptr;
    std::string why_not;  // empty: patched
  };
  std::unordered_map<CUmodule, ModuleState> modules_;
  Totals totals_;
};

// The patch image embedded at build time (sass_patch.cu, built by nvcc);
// empty when the build had no nvcc.
extern const unsigned char kSassPatchImage[];
extern const size_t kSassPatchImageSize;

}  // namespace phos::hooks
