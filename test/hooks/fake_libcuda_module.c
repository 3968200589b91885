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

static void *handle(const char *name) {
  struct fake_handle *h = calloc(1, sizeof(*h));
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
CUresult cuFuncGetParamInfo(CUfunction f, size_t i, size_t *offset, size_t *size) {
  (void)f; (void)i; (void)offset; (void)size; return CUDA_ERROR_INVALID_VALUE;
}
CUresult cuKernelGetParamInfo(CUkernel k, size_t i, size_t *offset, size_t *size) {
  (void)k; (void)i; (void)offset; (void)size; return CUDA_ERROR_INVALID_VALUE;
}
CUresult cuLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                        unsigned shmem, CUstream s, void **params, void **extra) {
  (void)f; (void)gx; (void)gy; (void)gz; (void)bx; (void)by; (void)bz; (void)shmem; (void)s; (void)params; (void)extra;
  __atomic_add_fetch(&fake_launches, 1, __ATOMIC_RELAXED);
  return CUDA_SUCCESS;
}
