/* A program around one checkpoint round trip, against the fake libcuda:
 * it sets its own stack limit, allocates (phos learns its context), prints
 * "ready PID" and waits for a line on stdin (a test drives the round trip
 * meanwhile), then prints the limits it finds, "after stack=N
 * printf_fifo=N malloc_heap=N" (driver_limits.sh), and makes four gated
 * calls: a copy to the device (slow under FAKE_COPY_SLEEP_MS) and three
 * cuCtxSynchronize (slow_calls.sh). */
#include <cuda.h>
#include <stdio.h>
#include <unistd.h>

void fake_mark(const char *what);

int main(void) {
  CUdeviceptr p = 0;
  cuCtxSetCurrent((CUcontext)(unsigned long)1); /* device 0 */
  if (cuCtxSetLimit(CU_LIMIT_STACK_SIZE, 4096) != CUDA_SUCCESS) printf("set stack failed\n");
  if (cuMemAlloc(&p, 4u << 20) != CUDA_SUCCESS) printf("allocation failed\n");
  fake_mark("ready");
  printf("ready %d\n", (int)getpid());
  fflush(stdout);
  char line[16];
  if (!fgets(line, sizeof(line), stdin)) return 1;
  fake_mark("after");
  size_t v[3] = {0, 0, 0};
  cuCtxGetLimit(&v[0], CU_LIMIT_STACK_SIZE);
  cuCtxGetLimit(&v[1], CU_LIMIT_PRINTF_FIFO_SIZE);
  cuCtxGetLimit(&v[2], CU_LIMIT_MALLOC_HEAP_SIZE);
  printf("after stack=%zu printf_fifo=%zu malloc_heap=%zu\n", v[0], v[1], v[2]);
  char host[16] = {0};
  if (cuMemcpyHtoD(p, host, sizeof(host)) != CUDA_SUCCESS) printf("copy failed\n");
  for (int i = 0; i < 3; i++) cuCtxSynchronize();
  return 0;
}
