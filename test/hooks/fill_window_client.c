/* A restored process's calls under an on-demand fill window (copy_window.h,
 * the fill protocol), against the fake libcuda: it allocates two buffers,
 * prints "ready PID ADDR ADDR", waits for the file GO, then
 *   - sets the second buffer's first 64 KiB whole (a memset: it needs no
 *     fill, so it must not wait): "overwrite MS RC";
 *   - reads 16 bytes at the first buffer + 8192 (a copy to the host: it
 *     waits until that chunk is in): "read MS RC";
 *   - makes a batch of stream memory operations (a set phos does not read:
 *     it waits for the whole fill): "unknown MS".
 * usage: fill_window_client GO [wait-value]   wait-value: the read is a
 * cuStreamWaitValue32 on that word instead (the fake driver has none: its
 * CUresult is CUDA_ERROR_NOT_FOUND, after phos's wait). */
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
  CUresult r = cuMemsetD32(b, 0, (64u << 10) / 4);
  printf("overwrite %.0f %d\n", now_ms() - t0, (int)r);
  fflush(stdout);
  unsigned char host[16];
  t0 = now_ms();
  if (argc > 2) {
    CUresult (*wait_value)(CUstream, CUdeviceptr, cuuint32_t, unsigned int) =
        (CUresult(*)(CUstream, CUdeviceptr, cuuint32_t, unsigned int))dlsym(RTLD_DEFAULT, "cuStreamWaitValue32_v2");
    r = wait_value ? wait_value(NULL, a + 8192, 1, 0) : CUDA_ERROR_NOT_FOUND;
  } else {
    r = cuMemcpyDtoHAsync(host, a + 8192, sizeof host, NULL);
  }
  printf("read %.0f %d\n", now_ms() - t0, (int)r);
  fflush(stdout);
  t0 = now_ms();
  CUresult (*batch)(CUstream, unsigned int, CUstreamBatchMemOpParams *, unsigned int) =
      (CUresult(*)(CUstream, unsigned int, CUstreamBatchMemOpParams *, unsigned int))dlsym(RTLD_DEFAULT,
                                                                                           "cuStreamBatchMemOp_v2");
  if (batch) batch(NULL, 0, NULL, 0);
  printf("unknown %.0f\n", now_ms() - t0);
  fflush(stdout);
  sleep(60);
  return 0;
}
