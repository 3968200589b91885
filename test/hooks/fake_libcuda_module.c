/* The fake libcuda's modules, libraries and launches: handles are small
 * structs that carry a name, so libphos.so's launch record can name kernels
 * and the module registry can be tested without a GPU. */
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

unsigned long long fake_launches;

struct fake_handle {
  char name[64];
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
CUresult cuModuleGetFunction(CUfunction *f, CUmodule m, const char *name) { (void)m; *f = handle(name); return CUDA_SUCCESS; }
CUresult cuLibraryGetKernel(CUkernel *k, CUlibrary l, const char *name) { (void)l; *k = handle(name); return CUDA_SUCCESS; }
CUresult cuKernelGetFunction(CUfunction *f, CUkernel k) {
  *f = handle(((struct fake_handle *)k)->name);
  return CUDA_SUCCESS;
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
  static const struct { const char *name; size_t n; size_t slots[4][2]; } layouts[] = {
    {"_Z5saxpyPKfPffi", 4, {{0, 8}, {8, 8}, {16, 4}, {20, 4}}},
    {"closure_kernel", 2, {{0, 4}, {8, 24}}},
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
CUresult cuLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                        unsigned shmem, CUstream s, void **params, void **extra) {
  (void)f; (void)gx; (void)gy; (void)gz; (void)bx; (void)by; (void)bz; (void)shmem; (void)s; (void)params; (void)extra;
  __atomic_add_fetch(&fake_launches, 1, __ATOMIC_RELAXED);
  return CUDA_SUCCESS;
}
