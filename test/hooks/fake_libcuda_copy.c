/* The fake libcuda's copies and sets: each counts its calls, so a test sees
 * that libphos.so's recording hooks still reach the driver. */
#include <cuda.h>

unsigned long long fake_copy_calls;

static CUresult counted(void) {
  __atomic_add_fetch(&fake_copy_calls, 1, __ATOMIC_RELAXED);
  return CUDA_SUCCESS;
}

/* protected: the fake cuGetProcAddress hands out its own (fake_libcuda.c) */
__attribute__((visibility("protected"))) CUresult cuMemcpyDtoD(CUdeviceptr dst, CUdeviceptr src, size_t n) { (void)dst; (void)src; (void)n; return counted(); }
CUresult cuMemcpyDtoHAsync(void *dst, CUdeviceptr src, size_t n, CUstream s) {
  (void)dst; (void)src; (void)n; (void)s; return counted();
}
CUresult cuMemcpyPeer(CUdeviceptr dst, CUcontext dc, CUdeviceptr src, CUcontext sc, size_t n) {
  (void)dst; (void)dc; (void)src; (void)sc; (void)n; return counted();
}
CUresult cuMemcpy2D(const CUDA_MEMCPY2D *c) { (void)c; return counted(); }
CUresult cuMemcpy3DPeerAsync(const CUDA_MEMCPY3D_PEER *c, CUstream s) { (void)c; (void)s; return counted(); }
CUresult cuMemsetD32(CUdeviceptr dst, unsigned int v, size_t n) { (void)dst; (void)v; (void)n; return counted(); }
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
