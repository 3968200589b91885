#include "driver/driver.h"

#include <dlfcn.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <mutex>
#include <unordered_map>

#include "memory/driver_buffer.h"


namespace phos::hooks::driver {
namespace {

constexpr const char* kNames[] = {
#define PHOS_DRIVER_FN(name, params, args) #name,
#define PHOS_DRIVER_HOOKED(name, params, args) #name,
#define PHOS_DRIVER_QUERY(name, params, args) #name,
#include "driver_table.inc"
#undef PHOS_DRIVER_FN
#undef PHOS_DRIVER_HOOKED
#undef PHOS_DRIVER_QUERY
};

// What a program gets for each function's real pointer: our wrapper, or for a
// query (query_functions.txt) nothing, so that it keeps the real one.
void* const kWrappers[] = {
#define PHOS_DRIVER_FN(name, params, args) reinterpret_cast<void*>(&::name),
#define PHOS_DRIVER_HOOKED(name, params, args) reinterpret_cast<void*>(&::name),
#define PHOS_DRIVER_QUERY(name, params, args) nullptr,
#include "driver_table.inc"
#undef PHOS_DRIVER_FN
#undef PHOS_DRIVER_HOOKED
#undef PHOS_DRIVER_QUERY
};

static_assert(std::size(kNames) == kFunctionCount);

using DlsymFn = void* (*)(void*, const char*);

DlsymFn glibc_dlsym() {
  static DlsymFn fn = [] {
    auto f = reinterpret_cast<DlsymFn>(dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.34"));
    if (!f) f = reinterpret_cast<DlsymFn>(dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.2.5"));
    return f;
  }();
  return fn;
}

struct Resolved {
  std::array<void*, kFunctionCount> real{};
  std::unordered_map<void*, void*> wrapper_of;  // real pointer -> our wrapper
  void* real_gpa_v1 = nullptr;
  void* real_event_destroy_v1 = nullptr;
};

Resolved* g_resolved = nullptr;
std::once_flag g_once;

void resolve() {
  auto* r = new Resolved();
  void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL | RTLD_NOLOAD);
  if (!lib) lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
  if (lib) {
    for (size_t i = 0; i < kFunctionCount; i++) {
      r->real[i] = glibc_dlsym()(lib, kNames[i]);
      if (r->real[i] && kWrappers[i]) r->wrapper_of.emplace(r->real[i], kWrappers[i]);
    }
    r->real_gpa_v1 = glibc_dlsym()(lib, "cuGetProcAddress");
    if (r->real_gpa_v1) r->wrapper_of.emplace(r->real_gpa_v1, reinterpret_cast<void*>(&::cuGetProcAddress));
    // Not in cuda.h's table (it names _v2), but a program may reach it
    // (cuGetProcAddress below 4000, dlsym): it destroys events too.
    r->real_event_destroy_v1 = glibc_dlsym()(lib, "cuEventDestroy");
    if (r->real_event_destroy_v1)
      r->wrapper_of.emplace(r->real_event_destroy_v1, reinterpret_cast<void*>(&::phos_cuEventDestroy_v1));
    // Where libcuda's code lies, from any of its functions: its mmaps are
    // told from the program's (memory/driver_buffer.h).
    auto any = std::find_if(r->real.begin(), r->real.end(), [](void* f) { return f != nullptr; });
    if (any != r->real.end()) note_driver_code(*any);
  }
  __atomic_store_n(&g_resolved, r, __ATOMIC_RELEASE);
}

Resolved& resolved() {
  Resolved* r = __atomic_load_n(&g_resolved, __ATOMIC_ACQUIRE);
  if (__builtin_expect(r != nullptr, 1)) return *r;
  std::call_once(g_once, resolve);
  return *g_resolved;
}

}  // namespace

const char* name_of(Fn f) { return kNames[size_t(f)]; }
void* real(Fn f) { return resolved().real[size_t(f)]; }
bool loaded() { return __atomic_load_n(&g_resolved, __ATOMIC_ACQUIRE) != nullptr; }
void* real_dlsym(void* handle, const char* name) { return glibc_dlsym()(handle, name); }
void* (*glibc_dlsym_pointer())(void*, const char*) { return glibc_dlsym(); }

void* substitute(void* p) {
  if (!p) return p;
  auto& map = resolved().wrapper_of;
  auto it = map.find(p);
  return it == map.end() ? p : it->second;
}

void* real_gpa_v1() { return resolved().real_gpa_v1; }
void* real_event_destroy_v1() { return resolved().real_event_destroy_v1; }

}  // namespace phos::hooks::driver

// Called by the dlsym stub (dlsym_x86_64.S) before glibc's dlsym: the wrapper
// for a libcuda function, or null to let glibc answer (with the caller's own
// return address, which RTLD_NEXT depends on).
// glibc's dlsym, which the stub jumps to; set by the hook, which runs first.
extern "C" {
__attribute__((visibility("hidden"))) void* phos_glibc_dlsym = nullptr;
}

extern "C" __attribute__((visibility("hidden"))) void* phos_dlsym_hook(void* handle, const char* name) {
  using namespace phos::hooks::driver;
  if (__builtin_expect(!phos_glibc_dlsym, 0)) phos_glibc_dlsym = reinterpret_cast<void*>(glibc_dlsym_pointer());
  if (!name || name[0] != 'c' || name[1] != 'u') return nullptr;
  void* p = real_dlsym(handle, name);
  if (!p) return nullptr;
  void* w = substitute(p);
  return w == p ? nullptr : w;
}
