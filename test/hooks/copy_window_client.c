/* A process whose writes a copy window (copy_window.h) must hold back, against
 * the fake libcuda: it allocates two buffers, prints "ready PID ADDR ADDR",
 * waits for the file GO, then writes the first buffer (a memset: an exact
 * set) and makes a batch of stream memory operations (a set phos does not
 * read), printing how long each call took: "memset MS" and "unknown MS".
 *
 * usage: copy_window_client GO [GO2]   GO2: wait for that file too before the
 * second call (a test looks at the table in between) */
#include <cuda.h>
#include <dlfcn.h>
#include <stdio.h>
#include <time.h>
#include <unistd.h>

static double now_ms(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
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
