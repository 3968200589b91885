/* The fake libcuda's modules, libraries and launches: handles are small
 * structs that carry a name, so libphos.so's launch record can name kernels
 * and the module registry can be tested without a GPU. */
#include <cuda.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

unsigned long long fake_launches;

struct fake_handle {
  char name[64];
  void *module; /* a function's module or library */
};

/* Set by a test: the next handle is this one again, renamed (the driver
 * reusing a handle once its module is unloaded). */
void *fake_next_handle;

static void *handle(const char *name) {
  struct fake_handle *h = fake_next_handle ? fake_next_handle : calloc(1, sizeof(*h));
  fake_next_handle = NULL;
  snprintf(h->name, sizeof(h->name), "%s", name ? name : "");
  return h;
}

CUresult cuModuleLoadData(CUmodule *m, const void *image) { (void)image; *m = handle("module"); return CUDA_SUCCESS; }
CUresult cuModuleUnload(CUmodule m) { free(m); return CUDA_SUCCESS; }
CUresult cuLibraryLoadData(CUlibrary *l, const void *code, CUjit_option *o, void **v, unsigned n, CUlibraryOption *lo,
                           void **lv, unsigned ln) {
  (void)code; (void)o; (void)v; (void)n; (void)lo; (void)lv; (void)ln;
  *l = handle("library");
  return CUDA_SUCCESS;
}
static void *handle_in(const char *name, void *module) {
  struct fake_handle *h = handle(name);
  h->module = module;
  return h;
}
CUresult cuModuleGetFunction(CUfunction *f, CUmodule m, const char *name) { *f = handle_in(name, m); return CUDA_SUCCESS; }
CUresult cuFuncGetAttribute(int *v, CUfunction_attribute a, CUfunction f) {
  (void)f;
  *v = a == CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK ? 1024 : 0;
  return CUDA_SUCCESS;
}
CUresult cuLibraryGetKernel(CUkernel *k, CUlibrary l, const char *name) { *k = handle_in(name, l); return CUDA_SUCCESS; }
CUresult cuKernelGetFunction(CUfunction *f, CUkernel k) {
  *f = handle_in(((struct fake_handle *)k)->name, ((struct fake_handle *)k)->module);
  return CUDA_SUCCESS;
}
CUresult cuFuncGetModule(CUmodule *m, CUfunction f) {
  *m = ((struct fake_handle *)f)->module;
  return *m ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}
CUresult cuModuleGetGlobal(CUdeviceptr *p, size_t *bytes, CUmodule m, const char *name) {
  (void)m; (void)name;
  if (p) *p = 0x4000;
  if (bytes) *bytes = 8;
  return CUDA_SUCCESS;
}
CUresult cuFuncGetName(const char **name, CUfunction f) { *name = ((struct fake_handle *)f)->name; return CUDA_SUCCESS; }
CUresult cuKernelGetName(const char **name, CUkernel k) { *name = ((struct fake_handle *)k)->name; return CUDA_SUCCESS; }
/* Parameter layouts for the kernels the speculation test launches; other
 * names have none (index out of range from parameter 0), and "noinfo"
 * gets no answer at all. */
static CUresult param_info(const char *name, size_t i, size_t *offset, size_t *size) {
  /* A twin has its original's parameters and the table pointer. */
  if (!strcmp(name, "_Z5saxpyPKfPffi__phos_twin") && i == 4) {
    if (offset) *offset = 24;
    if (size) *size = 8;
    return CUDA_SUCCESS;
  }
  if (!strcmp(name, "_Z5saxpyPKfPffi__phos_twin")) name = "_Z5saxpyPKfPffi";
  static const struct { const char *name; size_t n; size_t slots[8][2]; } layouts[] = {
    {"_Z5saxpyPKfPffi", 4, {{0, 8}, {8, 8}, {16, 4}, {20, 4}}},
    {"closure_kernel", 2, {{0, 4}, {8, 24}}},
    /* test/bench/launch_path_bench.c's kernel: 4 const and 4 other pointers */
    {"_Z10bench_ptr8PKfS0_S0_S0_PfS1_S1_S1_", 8, {{0, 8}, {8, 8}, {16, 8}, {24, 8}, {32, 8}, {40, 8}, {48, 8}, {56, 8}}},
  };
  if (!strcmp(name, "noinfo")) return CUDA_ERROR_NOT_SUPPORTED;
  for (size_t k = 0; k < sizeof(layouts) / sizeof(layouts[0]); k++) {
    if (strcmp(layouts[k].name, name)) continue;
    if (i >= layouts[k].n) return CUDA_ERROR_INVALID_VALUE;
    if (offset) *offset = layouts[k].slots[i][0];
    if (size) *size = layouts[k].slots[i][1];
    return CUDA_SUCCESS;
  }
  return CUDA_ERROR_INVALID_VALUE;
}
CUresult cuFuncGetParamInfo(CUfunction f, size_t i, size_t *offset, size_t *size) {
  return param_info(((struct fake_handle *)f)->name, i, offset, size);
}
CUresult cuKernelGetParamInfo(CUkernel k, size_t i, size_t *offset, size_t *size) {
  return param_info(((struct fake_handle *)k)->name, i, offset, size);
}
unsigned long long fake_twin_launches;
/* fake_libcuda_kernels.cc: criu's engine's kernels, run on the CPU. */
int fake_phos_kernel(const char *name, unsigned blocks, void **params);

/* What saxpy's checks would find, in its twin or in its patched module: it
 * writes y (parameter 1), and with FAKE_SAXPY_WRITES_X=1 also x (parameter
 * 0, a pointer to const: a planted mis-speculation); each address outside
 * the table's ranges counts. */
static void fake_saxpy_checks(void **params, unsigned long long *table) {
  const char *planted = getenv("FAKE_SAXPY_WRITES_X");
  CUdeviceptr written[2] = {*(CUdeviceptr *)params[1], *(CUdeviceptr *)params[0]};
  int n = planted && *planted == '1' ? 2 : 1;
  for (int w = 0; w < n; w++) {
    int inside = 0;
    for (unsigned long long r = 0; r < table[0]; r++)
      inside |= written[w] >= table[4 + 2 * r] && written[w] + 4 <= table[5 + 2 * r];
    if (inside) continue;
    if (table[1]++ == 0) {
      table[2] = written[w];
      table[3] = 0;
    }
  }
}

__attribute__((visibility("protected"))) CUresult cuLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                        unsigned shmem, CUstream s, void **params, void **extra) {
  (void)gx; (void)gy; (void)gz; (void)bx; (void)by; (void)bz; (void)shmem; (void)s; (void)extra;
  __atomic_add_fetch(&fake_launches, 1, __ATOMIC_RELAXED);
  struct fake_handle *h = (struct fake_handle *)f;
  if (!strncmp(h->name, "phos_chunk_", 11) && fake_phos_kernel(h->name, gx, params)) return CUDA_SUCCESS;
  /* The benchmark's kernel: as cheap as a launch can be, so what phos adds shows. */
  if (h->name[0] == '_' && !strcmp(h->name, "_Z10bench_ptr8PKfS0_S0_S0_PfS1_S1_S1_")) return CUDA_SUCCESS;
  if (!strcmp(h->name, "_Z5saxpyPKfPffi__phos_twin")) {
    __atomic_add_fetch(&fake_twin_launches, 1, __ATOMIC_RELAXED);
    fake_saxpy_checks(params, (unsigned long long *)*(CUdeviceptr *)params[4]);
    return CUDA_SUCCESS;
  }
  /* A kernel in a module the fake libsanitizer-public.so patched: its
   * patch runs with the callback data set for f (none: nothing checked). */
  void *sanitizer = dlopen("libsanitizer-public.so", RTLD_NOW | RTLD_NOLOAD);
  if (!sanitizer) return CUDA_SUCCESS;
  int (*patched)(void *) = (int (*)(void *))dlsym(sanitizer, "fake_sanitizer_patched");
  void *(*data)(void *) = (void *(*)(void *))dlsym(sanitizer, "fake_sanitizer_data");
  if (patched && data && patched(h->module)) {
    unsigned long long *table = data(f);
    if (table && !strcmp(h->name, "_Z5saxpyPKfPffi")) fake_saxpy_checks(params, table);
  }
  dlclose(sanitizer);
  return CUDA_SUCCESS;
}

/* Pinned host memory the "device" addresses as it is: enough for
 * libphos.so's validation tables (events: fake_libcuda_events.c). */
CUresult cuMemHostAlloc(void **p, size_t bytes, unsigned int flags) {
  (void)flags;
  *p = calloc(1, bytes);
  return *p ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}
CUresult cuMemHostGetDevicePointer(CUdeviceptr *d, void *p, unsigned int flags) {
  (void)flags;
  *d = (CUdeviceptr)p;
  return CUDA_SUCCESS;
}
CUresult cuMemFreeHost(void *p) { free(p); return CUDA_SUCCESS; }
CUresult cuGetErrorName(CUresult r, const char **s) { (void)r; *s = "CUDA_ERROR_FAKE"; return CUDA_SUCCESS; }
