/* The workload of the e2e test of the copy-on-write pool (cow_pool_criu.sh),
 * on the fake libcuda with real memory (FAKE_CUDA_MEMORY=1) on a GPU of
 * BUDGET MiB (FAKE_CUDA_BUDGET_MIB, set here for this process only): device
 * memory A (32 MiB), and a step every 10 ms:
 *
 *   1. cuCtxSynchronize                        (a call the gate holds)
 *   2. check A's first and last words == n - 1
 *   3. cuMemsetD32(A, n, all of it)            (every chunk written: each
 *                                              saved into the pool first)
 *   4. cuMemAlloc(16 MiB), then cuMemFree:     fits beside A, not beside A
 *                                              and a pool as large as A:
 *                                              phos must give the pool back
 *      (with "pitch": cuMemAllocPitch of 16 MiB instead, 4096-byte rows)
 *   5. check A's words == n
 *
 * STATE gets "TOKEN COUNTER ok|bad:WHAT FAILED_ALLOCATIONS".
 * With PROCESSES 2, a child forked first does the same, its state in
 * STATE.2 (two processes of one dump on the GPU).
 *
 * usage: pool_client STATE BUDGET_MIB [pitch | PROCESSES] */
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

int main(int argc, char **argv) {
  if (argc < 3) return 2;
  setenv("FAKE_CUDA_BUDGET_MIB", argv[2], 1);
  char child_state[1024];
  const char *state = argv[1];
  if (argc > 3 && atoi(argv[3]) == 2) {
    pid_t child = fork();
    if (child < 0) return 2;
    if (child == 0) {
      if (strlen(argv[1]) + 3 > sizeof(child_state)) return 2;
      snprintf(child_state, sizeof(child_state), "%s.2", argv[1]);
      state = child_state;
    }
  }
  uint64_t token;
  if (getrandom(&token, sizeof(token), 0) != sizeof(token)) return 2;
  cuInit(0);
  cuCtxSetCurrent((CUcontext)1);
  const size_t bytes = 32u << 20, words = bytes / 4;
  CUdeviceptr a;
  if (cuMemAlloc(&a, bytes) != CUDA_SUCCESS) return 1;
  volatile uint32_t *A = (volatile uint32_t *)(uintptr_t)a;
  const int pitched = argc > 3 && !strcmp(argv[3], "pitch");
  uint64_t failed = 0;
  char line[192];
  for (uint64_t n = 1;; n++) {
    cuCtxSynchronize();
    check("A[0]", A[0], (uint32_t)(n - 1), n);
    check("A[last]", A[words - 1], (uint32_t)(n - 1), n);
    cuMemsetD32(a, (unsigned)n, words);
    CUdeviceptr t;
    size_t pitch = 0;
    CUresult r = pitched ? cuMemAllocPitch(&t, &pitch, 4096, 4096, 4) : cuMemAlloc(&t, 16u << 20);
    if (r == CUDA_SUCCESS) cuMemFree(t);
    if (r != CUDA_SUCCESS || (pitched && pitch < 4096)) failed++;
    check("A[0]", A[0], (uint32_t)n, n);
    check("A[last]", A[words - 1], (uint32_t)n, n);
    snprintf(line, sizeof(line), "%016llx %llu %s %llu\n", (unsigned long long)token, (unsigned long long)n,
             bad[0] ? bad : "ok", (unsigned long long)failed);
    write_state_line(state, line);
    usleep(10000);
  }
}
