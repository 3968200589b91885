// The CUDA driver as libphos.so sees it: every entry point of cuda.h (the
// generated driver_table.inc), the real libcuda functions behind them, and
// the substitution of libphos's wrappers for real pointers wherever a
// program obtains one (dlsym, cuGetProcAddress).
#pragma once

#include <cuda.h>

// cuda.h renames cuGetProcAddress to cuGetProcAddress_v2; libphos.so must
// define both exported functions under their own names.
#undef cuGetProcAddress

#include <cstddef>
#include <cstdint>
#include <string>

#include "phos/hooks/call_cycles.h"
#include "phos/support/result.h"

// Every driver function, declared: libphos.so defines each (generated
// wrappers and hand-written hooks); the per-thread-stream variants are not
// declared by cuda.h in a normal build.
extern "C" {
#define PHOS_DRIVER_FN(name, params, args) CUresult name params;
#define PHOS_DRIVER_HOOKED(name, params, args) CUresult name params;
#define PHOS_DRIVER_QUERY(name, params, args) CUresult name params;
#include "driver_table.inc"
#undef PHOS_DRIVER_FN
#undef PHOS_DRIVER_HOOKED
#undef PHOS_DRIVER_QUERY
// The 4-argument cuGetProcAddress of CUDA 11.3-12.x, still exported.
CUresult cuGetProcAddress(const char* symbol, void** pfn, int cudaVersion, cuuint64_t flags);
// The unversioned cuEventDestroy of CUDA < 4.0, still exported (and handed
// out by cuGetProcAddress for such versions); cuda.h names _v2 so.
CUresult phos_cuEventDestroy_v1(CUevent event) __asm__("cuEventDestroy");
}

namespace phos::hooks::driver {

enum class Fn : uint16_t {
#define PHOS_DRIVER_FN(name, params, args) name,
#define PHOS_DRIVER_HOOKED(name, params, args) name,
#define PHOS_DRIVER_QUERY(name, params, args) name,
#include "driver_table.inc"
#undef PHOS_DRIVER_FN
#undef PHOS_DRIVER_HOOKED
#undef PHOS_DRIVER_QUERY
  kCount
};

inline constexpr size_t kFunctionCount = size_t(Fn::kCount);

const char* name_of(Fn f);

// The real libcuda function, or null where this driver lacks it. Loads
// libcuda.so.1 on first use.
void* real(Fn f);
template <class F>
F real_as(Fn f) {
  return reinterpret_cast<F>(real(f));
}

// libphos's wrapper for a real libcuda function pointer, or `p` itself (for
// functions libcuda has and phos does not wrap, and for the queries of
// query_functions.txt, which pass no gate).
void* substitute(void* p);

// True once libcuda is loaded and its entry points resolved.
bool loaded();

// The glibc dlsym (not ours), for code that must bypass the substitution.
void* real_dlsym(void* handle, const char* name);
void* (*glibc_dlsym_pointer())(void*, const char*);
// libcuda's own 4-argument cuGetProcAddress.
void* real_gpa_v1();
// libcuda's own unversioned cuEventDestroy.
void* real_event_destroy_v1();

}  // namespace phos::hooks::driver

namespace phos::hooks::driver {

// The call counter's kind of a driver function (call_cycles.h): its place
// in the table; library calls come after them (runtime.h).
inline constexpr CallKind call_kind(Fn f) { return CallKind(f); }

// A real libcuda function, called as the function itself. While the call
// counter is on, the call a hook forwards (the real function of the hook's
// own kind) runs with phos's clock stopped; the driver calls phos makes for
// itself (any other function) stay phos's cost.
template <class F>
class Real;
template <class R, class... A>
class Real<R (*)(A...)> {
 public:
  explicit Real(Fn f) : f_(f), fn_(real_as<R (*)(A...)>(f)) {}
  explicit operator bool() const { return fn_ != nullptr; }
  R operator()(A... a) const {
    return forwarded_call(call_kind(f_), [&] { return fn_(a...); });
  }

 private:
  Fn f_;
  R (*fn_)(A...);
};

}  // namespace phos::hooks::driver

// Every real call goes through this: the function's real pointer, typed.
#define PHOS_REAL(name) (::phos::hooks::driver::Real<decltype(&::name)>(::phos::hooks::driver::Fn::name))
// A hook's kind for GatePass and CallScope.
#define PHOS_CALL_KIND(name) (::phos::hooks::driver::call_kind(::phos::hooks::driver::Fn::name))

namespace phos::hooks {
// The driver's name of `r` (CUDA_ERROR_OUT_OF_MEMORY), else its number.
inline std::string cu_name(CUresult r) {
  const char* name = nullptr;
  if (auto get = PHOS_REAL(cuGetErrorName)) get(r, &name);
  return name ? name : "CUresult " + std::to_string(int(r));
}
// "what: CUDA_ERROR_...", as the hooks' errors say it.
inline std::string cu_error(const char* what, CUresult r) { return std::string(what) + ": " + cu_name(r); }

// `fn()` (returning Result<void>) with `ctx` current on the calling thread
// (the agent's), the thread's own context current again after it.
template <class Fn>
Result<void> in_context(CUcontext ctx, Fn&& fn) {
  if (CUresult r = PHOS_REAL(cuCtxPushCurrent_v2)(ctx); r != CUDA_SUCCESS)
    return make_error(cu_error("cuCtxPushCurrent", r), EIO);
  Result<void> result = fn();
  CUcontext popped = nullptr;
  PHOS_REAL(cuCtxPopCurrent_v2)(&popped);
  return result;
}
}  // namespace phos::hooks
