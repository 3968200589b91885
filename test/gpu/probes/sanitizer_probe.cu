// Probe (GPU host only; built there against the toolkit's sanitizer.h): can
// the Sanitizer patching API be loaded late, into a process whose context
// exists and whose module is already loaded, patch that module, report
// writes outside a range table, be unpatched, and what does each step cost?
// usage: sanitizer_probe LIBSANITIZER PATCH_FATBIN MODE
//   late            load and subscribe after the context and module exist
//   early-none      load and subscribe before any CUDA call, no domain enabled
//   early-resource  the same with the resource and launch domains enabled
//   inject          CUDA_INJECTION64_PATH=sanitizer_inject.so subscribed at cuInit
#include <cuda.h>
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <sanitizer.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { printf("FAIL %s: %s\n", #x, cudaGetErrorString(e_)); exit(1); } } while (0)

__global__ void fill(int* p, int n) { int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) p[i] = i; }
__global__ void through_pointer(int* const* pp, int n) { int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) (*pp)[i] = -i; }
__global__ void add_atomic(int* p, int n) { int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) atomicAdd(p + (i & 255), 1); }

static double now_ms() { return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

#define SYM(name) auto p_##name = reinterpret_cast<decltype(&name)>(dlsym(lib, #name)); if (!p_##name) { printf("FAIL dlsym %s\n", #name); return 1; }
#define SAN(call) do { SanitizerResult r_ = (call); const char* s_ = "?"; if (p_sanitizerGetResultString) p_sanitizerGetResultString(r_, &s_); printf("  %-60s -> %d %s\n", #call, (int)r_, s_); } while (0)

static int events[4];
static void on_event(void*, Sanitizer_CallbackDomain domain, Sanitizer_CallbackId, const void*) {
  if (domain == SANITIZER_CB_DOMAIN_RESOURCE) ++events[0]; else if (domain == SANITIZER_CB_DOMAIN_LAUNCH) ++events[1]; else ++events[2];
}

static void set_table(unsigned long long* t, const void* a, size_t bytes) {
  memset(t, 0, 64 * 8);
  t[0] = 1; t[4] = reinterpret_cast<uintptr_t>(a); t[5] = t[4] + bytes;
}

int main(int argc, char** argv) {
  setvbuf(stdout, nullptr, _IONBF, 0);
  if (argc < 4) { printf("usage: sanitizer_probe LIBSANITIZER PATCH_FATBIN MODE\n"); return 2; }
  const char* mode = argv[3];
  bool early = !strncmp(mode, "early", 5), inject = !strcmp(mode, "inject");
  void* lib = nullptr;
  double t = now_ms();
  Sanitizer_SubscriberHandle sub{};
  decltype(&sanitizerGetResultString) p_sanitizerGetResultString = nullptr;
  if (early) {
    lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    if (!lib) { printf("FAIL dlopen: %s\n", dlerror()); return 1; }
    SYM(sanitizerSubscribe) SYM(sanitizerEnableDomain)
    p_sanitizerGetResultString = reinterpret_cast<decltype(&sanitizerGetResultString)>(dlsym(lib, "sanitizerGetResultString"));
    SAN(p_sanitizerSubscribe(&sub, on_event, nullptr));
    if (!strcmp(mode, "early-resource")) {
      SAN(p_sanitizerEnableDomain(1, sub, SANITIZER_CB_DOMAIN_RESOURCE));
      SAN(p_sanitizerEnableDomain(1, sub, SANITIZER_CB_DOMAIN_LAUNCH));
    }
    printf("early: dlopen + subscribe before any CUDA call %.1f ms\n", now_ms() - t);
  }
  const int n = 1 << 24;
  int *a, *b, **pp;
  CK(cudaMalloc(&a, n * sizeof(int))); CK(cudaMalloc(&b, n * sizeof(int))); CK(cudaMalloc(&pp, sizeof(int*)));
  CK(cudaMemcpy(pp, &b, sizeof(int*), cudaMemcpyHostToDevice));
  fill<<<n / 256, 256>>>(a, n); CK(cudaDeviceSynchronize());
  auto time_fill = [&](int reps) { double s = now_ms(); for (int i = 0; i < reps; ++i) fill<<<n / 256, 256>>>(a, n); cudaDeviceSynchronize(); return (now_ms() - s) / reps; };
  double native = time_fill(50);
  auto time_launch = [&](int reps) { double s = now_ms(); for (int i = 0; i < reps; ++i) fill<<<1, 32>>>(a, 0); cudaDeviceSynchronize(); return (now_ms() - s) * 1000 / reps; };
  time_launch(1000);
  printf("empty launch %.3f us (%s)\n", time_launch(20000), early || inject ? "subscribed" : "no sanitizer");
  printf("mode %s; fill of %d ints natively %.3f ms\n", mode, n, native);
  if (!lib) { t = now_ms(); lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL); }
  if (!lib) { printf("FAIL dlopen: %s\n", dlerror()); return 1; }
  printf("dlopen %.1f ms\n", now_ms() - t);
  p_sanitizerGetResultString = reinterpret_cast<decltype(&sanitizerGetResultString)>(dlsym(lib, "sanitizerGetResultString"));
  SYM(sanitizerSubscribe) SYM(sanitizerEnableDomain) SYM(sanitizerAddPatchesFromFile)
  SYM(sanitizerPatchInstructions) SYM(sanitizerPatchModule) SYM(sanitizerUnpatchModule) SYM(sanitizerSetCallbackData)
  SYM(sanitizerUnsubscribe)
  CUcontext ctx; cuCtxGetCurrent(&ctx);
  CUfunction f_fill, f_through, f_atomic;
  CK(cudaGetFuncBySymbol(&f_fill, (const void*)fill)); CK(cudaGetFuncBySymbol(&f_through, (const void*)through_pointer));
  CK(cudaGetFuncBySymbol(&f_atomic, (const void*)add_atomic));
  CUmodule mod; CUresult cr = cuFuncGetModule(&mod, f_fill); printf("cuFuncGetModule -> %d\n", (int)cr);
  t = now_ms();
  if (!early && !inject) {
    SAN(p_sanitizerSubscribe(&sub, on_event, nullptr));
    SAN(p_sanitizerEnableDomain(1, sub, SANITIZER_CB_DOMAIN_RESOURCE));
  }
  printf("events so far: resource=%d launch=%d other=%d\n", events[0], events[1], events[2]);
  SAN(p_sanitizerAddPatchesFromFile(argv[2], ctx));
  SAN(p_sanitizerAddPatchesFromFile(argv[2], nullptr));
  SAN(p_sanitizerPatchInstructions(SANITIZER_INSTRUCTION_GLOBAL_MEMORY_ACCESS, mod, "probe_global_access"));
  SAN(p_sanitizerPatchModule(mod));
  printf("subscribe + patches + patch module %.1f ms\n", now_ms() - t);
  unsigned long long* table; CK(cudaHostAlloc(&table, 4096, cudaHostAllocMapped));
  unsigned long long* dtable; CK(cudaHostGetDevicePointer(&dtable, table, 0));
  // 1. honest: the table holds a
  set_table(table, a, n * sizeof(int));
  SAN(p_sanitizerSetCallbackData(f_fill, dtable));
  fill<<<n / 256, 256>>>(a, n); CK(cudaDeviceSynchronize());
  printf("honest fill: violations=%llu; calls=%llu, flags seen %#llx\n", table[1], table[63], table[62]);
  // 2. table holds half of a: the other half's stores are violations
  set_table(table, a, n / 2 * sizeof(int));
  fill<<<n / 256, 256>>>(a, n); CK(cudaDeviceSynchronize());
  printf("half table: violations=%llu (expect %d) first=%#llx (a+%lld) pc=%#llx\n", table[1], n / 2, table[2],
         (long long)(table[2] - (uintptr_t)a), table[3]);
  // 3. planted: writes b through a pointer kept in device memory; table holds pp only
  set_table(table, pp, sizeof(int*));
  SAN(p_sanitizerSetCallbackData(f_through, dtable));
  through_pointer<<<n / 256, 256>>>(pp, n); CK(cudaDeviceSynchronize());
  printf("through pointer: violations=%llu (expect %d) first in b: %s\n", table[1], n, table[2] >= (uintptr_t)b && table[2] < (uintptr_t)b + n * sizeof(int) ? "yes" : "no");
  // 4. atomics outside the table
  set_table(table, b, n * sizeof(int));
  SAN(p_sanitizerSetCallbackData(f_atomic, dtable));
  add_atomic<<<n / 256, 256>>>(a, n); CK(cudaDeviceSynchronize());
  printf("atomics: violations=%llu (expect %d); calls=%llu, flags seen %#llx\n", table[1], n, table[63], table[62]);
  // 5. cost while patched (table honest, in host-mapped memory)
  set_table(table, a, n * sizeof(int));
  double patched = time_fill(20);
  printf("empty launch while patched %.3f us\n", time_launch(20000));
  // table in device memory instead
  unsigned long long* devtable; CK(cudaMalloc(&devtable, 4096)); CK(cudaMemcpy(devtable, table, 64, cudaMemcpyHostToDevice));
  SAN(p_sanitizerSetCallbackData(f_fill, devtable));
  double patched_dev = time_fill(20);
  unsigned long long back[4]; CK(cudaMemcpy(back, devtable, 32, cudaMemcpyDeviceToHost));
  printf("fill patched: %.3f ms with the table in host-mapped memory, %.3f ms in device memory (native %.3f); device-table violations=%llu\n", patched, patched_dev, native, back[1]);
  // 6. unpatch: no more callbacks
  t = now_ms();
  SAN(p_sanitizerUnpatchModule(mod));
  printf("unpatch %.1f ms\n", now_ms() - t);
  set_table(table, a, 0);
  SAN(p_sanitizerSetCallbackData(f_fill, dtable));
  fill<<<n / 256, 256>>>(a, n); CK(cudaDeviceSynchronize());
  printf("after unpatch, empty table: violations=%llu (expect 0); fill %.3f ms\n", table[1], time_fill(50));
  // 7. patch again (second protocol round)
  t = now_ms();
  SAN(p_sanitizerPatchModule(mod));
  fill<<<n / 256, 256>>>(a, n); CK(cudaDeviceSynchronize());
  printf("repatched: violations=%llu (expect %d), %.1f ms\n", table[1], n, now_ms() - t);
  SAN(p_sanitizerUnpatchModule(mod));
  if (!inject) SAN(p_sanitizerUnsubscribe(sub));
  printf("events: resource=%d launch=%d other=%d\n", events[0], events[1], events[2]);
  return 0;
}
