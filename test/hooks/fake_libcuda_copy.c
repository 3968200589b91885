/* The fake libcuda's copies and sets: each counts its calls, so a test sees
 * that libphos.so's recording hooks still reach the driver. With real
 * memory (FAKE_CUDA_MEMORY=1, fake_libcuda_vmm.c) they copy and set, at
 * once: every stream is always done. */
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

unsigned long long fake_copy_calls;
int fake_real_memory(void);
int fake_current_device(void);
int fake_gpu_may_access(unsigned long long addr, int device);
void fake_mark(const char *what);

static CUresult counted(void) {
  __atomic_add_fetch(&fake_copy_calls, 1, __ATOMIC_RELAXED);
  return CUDA_SUCCESS;
}

/* Device and host addresses alike are the process's own with real memory. */
static CUresult copy(unsigned long long dst, unsigned long long src, size_t n) {
  if (fake_real_memory() && n) memmove((void *)dst, (const void *)src, n);
  return counted();
}
static CUresult set(unsigned long long dst, const void *value, size_t width, size_t count) {
  if (fake_real_memory())
    for (size_t i = 0; i < count; i++) memcpy((char *)dst + i * width, value, width);
  return counted();
}

/* Several GPUs (FAKE_CUDA_DEVICES > 1): the GPU of the device memory at
 * `addr`, from the name of the memfd mapped there (fake_libcuda_vmm.c);
 * -1 for other memory. A test program asks too (multi_gpu_client.c). */
int fake_gpu_of(unsigned long long addr) {
  FILE *f = fopen("/proc/self/maps", "r");
  char line[512];
  int gpu = -1;
  while (f && fgets(line, sizeof(line), f)) {
    unsigned long long lo, hi;
    if (sscanf(line, "%llx-%llx", &lo, &hi) != 2 || addr < lo || addr >= hi) continue;
    const char *m = strstr(line, "memfd:fake-gpu-");
    if (m) gpu = atoi(m + strlen("memfd:fake-gpu-"));
    break;
  }
  if (f) fclose(f);
  return gpu;
}

/* A device-to-device copy in one context reaches that context's GPU, and
 * another GPU's memory only where it is mapped with access for this GPU
 * (cuMemSetAccess, fake_libcuda_vmm.c): with several fake GPUs, a copy
 * that leaves its context's GPU otherwise fails, and says so in
 * FAKE_CUDA_LOG. */
static CUresult dtod(unsigned long long dst, unsigned long long src, size_t n) {
  const char *v = getenv("FAKE_CUDA_DEVICES");
  if (fake_real_memory() && v && atoi(v) > 1) {
    const int ctx = fake_current_device(), from = fake_gpu_of(src), to = fake_gpu_of(dst);
    const int src_ok = from < 0 || from == ctx || fake_gpu_may_access(src, ctx);
    const int dst_ok = to < 0 || to == ctx || fake_gpu_may_access(dst, ctx);
    if (!src_ok || !dst_ok) {
      char what[128];
      snprintf(what, sizeof(what), "cross-gpu copy from GPU %d to GPU %d in GPU %d's context", from, to, ctx);
      fake_mark(what);
      return CUDA_ERROR_INVALID_VALUE;
    }
  }
  return copy(dst, src, n);
}

/* protected: the fake cuGetProcAddress hands out its own (fake_libcuda.c) */
__attribute__((visibility("protected"))) CUresult cuMemcpyDtoD(CUdeviceptr dst, CUdeviceptr src, size_t n) { return dtod(dst, src, n); }
CUresult cuMemcpyDtoDAsync(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s) { (void)s; return dtod(dst, src, n); }
CUresult cuMemcpyDtoHAsync(void *dst, CUdeviceptr src, size_t n, CUstream s) {
  (void)s; return copy((unsigned long long)dst, src, n);
}
CUresult cuMemcpyHtoDAsync(CUdeviceptr dst, const void *src, size_t n, CUstream s) {
  (void)s; return copy(dst, (unsigned long long)src, n);
}
CUresult cuMemcpyPeer(CUdeviceptr dst, CUcontext dc, CUdeviceptr src, CUcontext sc, size_t n) {
  (void)dc; (void)sc; return copy(dst, src, n);
}
CUresult cuMemcpyPeerAsync(CUdeviceptr dst, CUcontext dc, CUdeviceptr src, CUcontext sc, size_t n, CUstream s) {
  (void)dc; (void)sc; (void)s; return copy(dst, src, n);
}
CUresult cuMemcpy2D(const CUDA_MEMCPY2D *c) { (void)c; return counted(); }
CUresult cuMemcpy3DPeerAsync(const CUDA_MEMCPY3D_PEER *c, CUstream s) { (void)c; (void)s; return counted(); }
CUresult cuMemsetD8Async(CUdeviceptr dst, unsigned char v, size_t n, CUstream s) { (void)s; return set(dst, &v, 1, n); }
CUresult cuMemsetD32(CUdeviceptr dst, unsigned int v, size_t n) { return set(dst, &v, 4, n); }
CUresult cuMemsetD2D16Async(CUdeviceptr dst, size_t pitch, unsigned short v, size_t w, size_t h, CUstream s) {
  (void)dst; (void)pitch; (void)v; (void)w; (void)h; (void)s; return counted();
}
CUresult cuStreamWriteValue32(CUstream s, CUdeviceptr addr, cuuint32_t v, unsigned int flags) {
  (void)s; (void)addr; (void)v; (void)flags; return counted();
}
CUresult cuMemcpyBatchAsync(CUdeviceptr *dsts, CUdeviceptr *srcs, size_t *sizes, size_t count, CUmemcpyAttributes *attrs,
                            size_t *attrs_idxs, size_t num_attrs, CUstream s) {
  (void)dsts; (void)srcs; (void)sizes; (void)count; (void)attrs; (void)attrs_idxs; (void)num_attrs; (void)s;
  return counted();
}
