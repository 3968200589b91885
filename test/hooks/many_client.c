/* Many allocations against the fake libcuda: more than one SCM_RIGHTS
 * message of fds (253), so that the plugin hands them back in pages.
 *
 * usage: many_client N   allocates N buffers of 2 MiB, prints "ready PID",
 *                        sleeps (a test takes the memory away and back) */
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

int main(int argc, char **argv) {
  int n = argc > 1 ? atoi(argv[1]) : 300;
  cuCtxSetCurrent((CUcontext)1);  /* device 0 */
  for (int i = 0; i < n; i++) {
    CUdeviceptr p = 0;
    if (cuMemAlloc(&p, 2u << 20) != CUDA_SUCCESS) {
      printf("allocation %d failed\n", i);
      return 1;
    }
  }
  printf("ready %d\n", (int)getpid());
  fflush(stdout);
  sleep(60);
  return 0;
}
