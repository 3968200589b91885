/* The workload of the e2e test of copy-on-write over two GPUs
 * (multi_gpu_cow.sh), on the fake libcuda with real memory and two devices
 * (FAKE_CUDA_MEMORY=1 FAKE_CUDA_DEVICES=2): device memory A (4 MiB) on GPU 0
 * and B (4 MiB) on GPU 1, and a step every 10 ms:
 *
 *   1. cuCtxSynchronize                   (a call the gate holds)
 *   2. check A[0] == B[0] == n - 1
 *   3. cuMemsetD32(A, n) on GPU 0         (an exact set: saved first)
 *   4. check A[0] == n, B[0] == n - 1
 *   5. cuMemsetD32(B, n) on GPU 1
 *   6. check A[0] == B[0] == n
 *
 * Every call a checkpoint can freeze the program at (1, 3, 5) is followed by
 * a check of what the memory held before it: a restored image that holds a
 * write made after its freeze, on either GPU, fails the next check. STATE
 * gets "TOKEN COUNTER ok gpus=GA,GB" (the e2e contract; GA, GB: the fake
 * GPUs whose memory A and B are, from /proc/self/maps, -1 if none), or
 * "TOKEN COUNTER bad:WHAT ..." once a check failed (and stays so).
 *
 * With "peer", each GPU's context is first given peer access to the other
 * (cuCtxEnablePeerAccess both ways), so that phos's mappings of A and B
 * carry access for both GPUs, which a restore must set again.
 *
 * usage: multi_gpu_client STATE [peer] */
#include <cuda.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

#include "../e2e/state_file.h"

static char bad[96];

static void check(const char *what, uint32_t got, uint32_t want, uint64_t n) {
  if (got == want || bad[0]) return;
  snprintf(bad, sizeof(bad), "bad:%s=%u,want=%u,step=%llu", what, got, want, (unsigned long long)n);
}

/* The fake's context of device d is d + 1. */
static void use_gpu(int d) { cuCtxSetCurrent((CUcontext)(uintptr_t)(d + 1)); }

static CUdeviceptr alloc_on(int d, size_t bytes) {
  CUdeviceptr p = 0;
  use_gpu(d);
  if (cuMemAlloc(&p, bytes) != CUDA_SUCCESS) {
    fprintf(stderr, "cuMemAlloc of %zu bytes on GPU %d failed\n", bytes, d);
    _exit(1);
  }
  return p;
}

/* The fake GPU whose memory is at `addr` (fake_libcuda_copy.c); -1: none. */
int fake_gpu_of(unsigned long long addr);

int main(int argc, char **argv) {
  if (argc < 2) return 2;
  uint64_t token;
  if (getrandom(&token, sizeof(token), 0) != sizeof(token)) return 2;
  cuInit(0);
  int count = 0;
  if (cuDeviceGetCount(&count) != CUDA_SUCCESS || count < 2) {
    fprintf(stderr, "multi_gpu_client: %d GPUs, 2 needed (FAKE_CUDA_DEVICES=2)\n", count);
    return 1;
  }
  if (argc > 2 && strcmp(argv[2], "peer") == 0)
    for (int d = 0; d < 2; d++) {
      use_gpu(d);
      if (cuCtxEnablePeerAccess((CUcontext)(uintptr_t)(2 - d), 0) != CUDA_SUCCESS) {
        fprintf(stderr, "multi_gpu_client: peer access from GPU %d failed\n", d);
        return 1;
      }
    }
  CUdeviceptr a = alloc_on(0, 4u << 20), b = alloc_on(1, 4u << 20);
  /* The fake's device memory is the process's: zero from the start. */
  volatile uint32_t *A = (volatile uint32_t *)(uintptr_t)a, *B = (volatile uint32_t *)(uintptr_t)b;
  char line[192];
  for (uint64_t n = 1;; n++) {
    use_gpu(0);
    cuCtxSynchronize();
    check("A", A[0], (uint32_t)(n - 1), n);
    check("B", B[0], (uint32_t)(n - 1), n);
    cuMemsetD32(a, (unsigned)n, 16384);
    check("A", A[0], (uint32_t)n, n);
    check("B", B[0], (uint32_t)(n - 1), n);
    use_gpu(1);
    cuMemsetD32(b, (unsigned)n, 16384);
    check("A", A[0], (uint32_t)n, n);
    check("B", B[0], (uint32_t)n, n);
    snprintf(line, sizeof(line), "%016llx %llu %s gpus=%d,%d\n", (unsigned long long)token, (unsigned long long)n,
             bad[0] ? bad : "ok", fake_gpu_of(a), fake_gpu_of(b));
    write_state_line(argv[1], line);
    usleep(10000);
  }
}
