/* A process whose writes a copy window (copy_window.h) must hold back, against
 * the fake libcuda: it allocates two buffers, prints "ready PID ADDR ADDR",
 * waits for the file GO, then writes the first buffer (a memset: an exact
 * set), makes its own copies between host and device (6 that cross the
 * link: 5 of 4096 bytes each, written into the first buffer's first 64 KiB,
 * and a synchronous one of 1 MiB from the second buffer; and 2
 * device-to-device ones that do not: "transfers 6 1069056"), and makes a
 * batch of stream memory operations (a set phos does not read), printing
 * how long the memset and the batch took: "memset MS" and "unknown MS".
 *
 * usage: copy_window_client GO [GO2]   GO2: wait for that file too before the
 * second call (a test looks at the table in between) */
#include <cuda.h>
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <time.h>
#include <unistd.h>

static double now_ms(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

typedef CUresult (*copy_async_fn)(CUdeviceptr, const void *, size_t, CUstream);
typedef CUresult (*copy_unified_fn)(CUdeviceptr, CUdeviceptr, size_t);

/* Through dlsym where the fake has none: libphos.so's hook is what counts
 * (it tells the window before the driver call, found or not). */
static void transfers(CUdeviceptr a, CUdeviceptr b) {
  static unsigned char host[4096], big[1 << 20];
  copy_async_fn htod_async = (copy_async_fn)dlsym(RTLD_DEFAULT, "cuMemcpyHtoDAsync_v2");
  copy_unified_fn unified = (copy_unified_fn)dlsym(RTLD_DEFAULT, "cuMemcpy");
  cuMemcpyHtoD(a + 8192, host, sizeof(host));                 /* synchronous, small */
  cuMemcpyDtoH(big, b, sizeof(big));                            /* synchronous, 1 MiB: told as queued */
  if (htod_async) htod_async(a + 8192, host, sizeof(host), NULL);
  cuMemcpyDtoHAsync(host, b, sizeof(host), NULL);
  if (unified) unified((CUdeviceptr)(uintptr_t)host, b, sizeof(host)); /* to the host */
  CUDA_MEMCPY2D c = {0};
  c.srcMemoryType = CU_MEMORYTYPE_HOST;
  c.srcHost = host;
  c.srcPitch = 1024;
  c.dstMemoryType = CU_MEMORYTYPE_DEVICE;
  c.dstDevice = a + 8192;
  c.dstPitch = 1024;
  c.WidthInBytes = 1024;
  c.Height = 4;
  cuMemcpy2D(&c);
  /* Device to device: no transfer over the link. */
  cuMemcpyDtoD(a + 4096, b, sizeof(host));
  if (unified) unified(a + 4096, b, sizeof(host));
  printf("transfers 6 1069056\n");
  fflush(stdout);
}

int main(int argc, char **argv) {
  if (argc < 2) return 2;
  CUdeviceptr a = 0, b = 0;
  cuCtxSetCurrent((CUcontext)1);
  if (cuMemAlloc(&a, 4u << 20) != CUDA_SUCCESS || cuMemAlloc(&b, 4u << 20) != CUDA_SUCCESS) {
    printf("allocation failed\n");
    return 1;
  }
  printf("ready %d 0x%llx 0x%llx\n", (int)getpid(), (unsigned long long)a, (unsigned long long)b);
  fflush(stdout);
  while (access(argv[1], F_OK) != 0) usleep(10000);
  double t0 = now_ms();
  CUresult r = cuMemsetD32(a + 4096, 7, 1024);
  printf("memset %.0f %d\n", now_ms() - t0, (int)r);
  fflush(stdout);
  transfers(a, b);
  if (argc > 2)
    while (access(argv[2], F_OK) != 0) usleep(10000);
  t0 = now_ms();
  /* Through dlsym: the fake has none, libphos.so's hook is what counts. */
  CUresult (*batch)(CUstream, unsigned int, CUstreamBatchMemOpParams *, unsigned int) =
      (CUresult(*)(CUstream, unsigned int, CUstreamBatchMemOpParams *, unsigned int))dlsym(RTLD_DEFAULT,
                                                                                           "cuStreamBatchMemOp_v2");
  if (batch) batch(NULL, 0, NULL, 0);
  printf("unknown %.0f\n", now_ms() - t0);
  fflush(stdout);
  sleep(60);
  return 0;
}
