/* A stand-in libcuda.so.1 for testing the interception without a GPU: a few
 * driver functions that count their calls, and a cuGetProcAddress that hands
 * out its own exported functions, as the real one does. */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef int CUresult;
typedef unsigned long long CUdeviceptr;
typedef unsigned long long cuuint64_t;

unsigned long long fake_calls;
int fake_real_memory(void); /* fake_libcuda_vmm.c: FAKE_CUDA_MEMORY=1 */

/* The real cuGetProcAddress hands out libcuda's own functions; so must this
 * one, not whatever a preloaded library exports under the same name. */
#define FAKE_OWN __attribute__((visibility("protected")))

/* Read by the fake libsanitizer-public.so: whether it came too late. */
int fake_cuda_initialized;
CUresult cuInit(unsigned flags) { (void)flags; fake_cuda_initialized = 1; return 0; }
FAKE_OWN CUresult cuDriverGetVersion(int *v) { *v = 13000; return 0; }
/* FAKE_COPY_SLEEP_MS: each synchronous copy between host and device takes
 * that long (a test sees it in flight). */
static void copy_sleep(void) {
  static int ms = -1;
  if (ms < 0) {
    const char *v = getenv("FAKE_COPY_SLEEP_MS");
    ms = v ? atoi(v) : 0;
  }
  if (ms > 0) usleep((useconds_t)ms * 1000);
}
FAKE_OWN CUresult cuMemcpyHtoD_v2(CUdeviceptr dst, const void *src, size_t n) {
  if (fake_real_memory()) memmove((void *)dst, src, n);
  __atomic_add_fetch(&fake_calls, 1, __ATOMIC_RELAXED);
  copy_sleep();
  return 0;
}
CUresult cuMemcpyDtoH_v2(void *dst, CUdeviceptr src, size_t n) {
  if (fake_real_memory()) memmove(dst, (const void *)src, n);
  __atomic_add_fetch(&fake_calls, 1, __ATOMIC_RELAXED);
  copy_sleep();
  return 0;
}
CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int version, cuuint64_t flags, int *status);
/* Elsewhere in the fake (protected there too), for test/bench/launch_path_bench.c. */
typedef struct CUctx_st *CUcontext;
typedef struct CUfunc_st *CUfunction;
typedef struct CUstream_st *CUstream;
CUresult cuLaunchKernel(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, CUstream,
                        void **, void **);
CUresult cuCtxSetCurrent(CUcontext);
FAKE_OWN CUresult fake_cuEventDestroy_v1(void *) __asm__("cuEventDestroy"); /* fake_libcuda_events.c */
CUresult cuMemcpyDtoD_v2(CUdeviceptr, CUdeviceptr, size_t);
CUresult cuEventRecord(void *, CUstream);
/* CUDA IPC, as the driver would serve it: logged ("driver ipc NAME") and
 * refused, so a test sees that phos answered every IPC call itself. */
void fake_log_driver_ipc(const char *name); /* fake_libcuda_vmm.c */
typedef struct { char reserved[64]; } FakeIpcHandle;
FAKE_OWN CUresult cuIpcGetMemHandle(FakeIpcHandle *h, CUdeviceptr p) {
  (void)h; (void)p;
  fake_log_driver_ipc("cuIpcGetMemHandle");
  return 801; /* CUDA_ERROR_NOT_SUPPORTED */
}
FAKE_OWN CUresult cuIpcOpenMemHandle_v2(CUdeviceptr *p, FakeIpcHandle h, unsigned flags) {
  (void)p; (void)h; (void)flags;
  fake_log_driver_ipc("cuIpcOpenMemHandle");
  return 801;
}
FAKE_OWN CUresult cuIpcCloseMemHandle(CUdeviceptr p) {
  (void)p;
  fake_log_driver_ipc("cuIpcCloseMemHandle");
  return 801;
}
FAKE_OWN CUresult cuIpcGetEventHandle(FakeIpcHandle *h, void *event) {
  (void)h; (void)event;
  fake_log_driver_ipc("cuIpcGetEventHandle");
  return 801;
}
FAKE_OWN CUresult cuIpcOpenEventHandle(void **event, FakeIpcHandle h) {
  (void)event; (void)h;
  fake_log_driver_ipc("cuIpcOpenEventHandle");
  return 801;
}
CUresult cuGetProcAddress(const char *symbol, void **pfn, int version, cuuint64_t flags) {
  return cuGetProcAddress_v2(symbol, pfn, version, flags, 0);
}
CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int version, cuuint64_t flags, int *status) {
  (void)flags;
  if (status) *status = 0;
  if (!strcmp(symbol, "cuMemcpyHtoD")) *pfn = (void *)cuMemcpyHtoD_v2;
  else if (!strcmp(symbol, "cuGetProcAddress")) *pfn = (void *)cuGetProcAddress_v2;
  else if (!strcmp(symbol, "cuInit")) *pfn = (void *)cuInit;
  else if (!strcmp(symbol, "cuDriverGetVersion")) *pfn = (void *)cuDriverGetVersion;
  else if (!strcmp(symbol, "cuLaunchKernel")) *pfn = (void *)cuLaunchKernel;
  else if (!strcmp(symbol, "cuCtxSetCurrent")) *pfn = (void *)cuCtxSetCurrent;
  else if (!strcmp(symbol, "cuMemcpyDtoD")) *pfn = (void *)cuMemcpyDtoD_v2;
  else if (!strcmp(symbol, "cuEventRecord")) *pfn = (void *)cuEventRecord;
  else if (!strcmp(symbol, "cuEventDestroy") && version < 4000) *pfn = (void *)fake_cuEventDestroy_v1;
  else if (!strcmp(symbol, "cuIpcGetMemHandle")) *pfn = (void *)cuIpcGetMemHandle;
  else if (!strcmp(symbol, "cuIpcOpenMemHandle")) *pfn = (void *)cuIpcOpenMemHandle_v2;
  else if (!strcmp(symbol, "cuIpcCloseMemHandle")) *pfn = (void *)cuIpcCloseMemHandle;
  else if (!strcmp(symbol, "cuIpcGetEventHandle")) *pfn = (void *)cuIpcGetEventHandle;
  else if (!strcmp(symbol, "cuIpcOpenEventHandle")) *pfn = (void *)cuIpcOpenEventHandle;
  else { *pfn = 0; if (status) *status = 1; return 500; /* CUDA_ERROR_NOT_FOUND */ }
  return 0;
}
