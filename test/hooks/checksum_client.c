/* The workload of the e2e tests of validation by checksum (checksum_criu.sh),
 * on the fake libcuda with real memory (FAKE_CUDA_MEMORY=1): device memory
 * A (4 MiB), B (4 MiB) and P (2 MiB), and a step every 10 ms:
 *
 *   1. cuCtxSynchronize                      (a call the gate holds)
 *   2. check A[0] == P[0] == n - 1
 *   3. cuMemsetD32(A, n, 64 KiB)            (an exact set: saved first)
 *   4. check A[0] == n, P[0] == n - 1
 *   5. --plant: P[0] = n, a store of the program's own: a write no hook
 *      sees, as a kernel's outside its speculated set is
 *   6. saxpy(P, B) launched                   (a speculated set: reads P, a
 *                                             pointer to const, writes B;
 *                                             the fake kernel writes nothing:
 *                                             the store of 5 stands for its
 *                                             write through x)
 *   7. check A[0] == n, P[0] == (--plant ? n : 0)
 *
 * Every call a checkpoint can freeze the program at (1, 3, 6) is followed by
 * a check of what the memory held before it: a restored image that holds a
 * write made after its freeze fails the next check. STATE gets
 * "TOKEN COUNTER ok" (the e2e contract), or "TOKEN COUNTER bad:WHAT" once a
 * check failed (and stays so).
 *
 * P is allocated first or last (--plant first|last): recopy's cold-first
 * order and copy-on-write's address order then copy it first or last.
 *
 * With CHECKSUM_ZERO_PLANT_AFTER=PATH, once PATH exists, a store of the
 * program's own into P's second MiB (all zero until then; checked to be
 * zero at every step before it): a write no hook sees into memory all zero
 * at a freeze before it, which the image must hold as zero.
 *
 * usage: checksum_client STATE [--plant first|last] */
#include <cuda.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

#include "../e2e/state_file.h"
#include "fake_saxpy.h"

static char bad[96];

static void check(const char *what, uint32_t got, uint32_t want, uint64_t n) {
  if (got == want || bad[0]) return;
  snprintf(bad, sizeof(bad), "bad:%s=%u,want=%u,step=%llu", what, got, want, (unsigned long long)n);
}

/* With CHECKSUM_READ_BY_COPY=1 the checks read A and P with cuMemcpyDtoH,
 * as a real program must: an on-demand restore makes that call wait for
 * the chunk, not a load of the program's own (restore_overlap.sh). */
static int read_by_copy;

static uint32_t word(CUdeviceptr at, volatile uint32_t *direct) {
  if (!read_by_copy) return *direct;
  uint32_t v = 0;
  if (cuMemcpyDtoH(&v, at, sizeof(v)) != CUDA_SUCCESS) return 0xbadc0feu;
  return v;
}

static CUdeviceptr alloc(size_t bytes) {
  CUdeviceptr p = 0;
  if (cuMemAlloc(&p, bytes) != CUDA_SUCCESS) {
    fprintf(stderr, "cuMemAlloc of %zu bytes failed\n", bytes);
    _exit(1);
  }
  return p;
}

int main(int argc, char **argv) {
  if (argc < 2) return 2;
  const char *plant = argc > 3 && !strcmp(argv[2], "--plant") ? argv[3] : NULL;
  uint64_t token;
  if (getrandom(&token, sizeof(token), 0) != sizeof(token)) return 2;
  read_by_copy = getenv("CHECKSUM_READ_BY_COPY") && !strcmp(getenv("CHECKSUM_READ_BY_COPY"), "1");
  cuInit(0);
  cuCtxSetCurrent((CUcontext)1);
  CUdeviceptr p = 0, a, b;
  if (plant && !strcmp(plant, "first")) p = alloc(2u << 20);
  a = alloc(4u << 20);
  b = alloc(4u << 20);
  /* Zero-plant mode: 32 MiB of zeros copied before P (the table's order is
   * the allocations'), for the control that copies every chunk (sparse=off,
   * at PHOS_FAULT=slow-copy's 20 ms a chunk) to reach P's second MiB well
   * after the store. */
  if (!p && getenv("CHECKSUM_ZERO_PLANT_AFTER")) (void)alloc(32u << 20);
  if (!p) p = alloc(2u << 20);
  /* The fake's device memory is the process's: zero from the start. */
  volatile uint32_t *A = (volatile uint32_t *)(uintptr_t)a, *P = (volatile uint32_t *)(uintptr_t)p;
  CUfunction saxpy = fake_saxpy();
  float alpha = 2.0f;
  int count = 1024;
  void *args[] = {&p, &b, &alpha, &count};
  char line[192];
  const char *zero_plant_after = getenv("CHECKSUM_ZERO_PLANT_AFTER");
  volatile uint32_t *Z = P + (1u << 20) / 4;
  static int zero_planted; /* in the image: a restored process frozen before the store checks Z again */
  for (uint64_t n = 1;; n++) {
    cuCtxSynchronize();
    check("A", word(a, A), (uint32_t)(n - 1), n);
    check("P", word(p, P), plant ? (uint32_t)(n - 1) : 0, n);
    if (zero_plant_after && !zero_planted) {
      check("Z", Z[0], 0, n);
      if (access(zero_plant_after, F_OK) == 0) {
        Z[0] = 0xdeadu;
        zero_planted = 1;
      }
    }
    cuMemsetD32(a, (unsigned)n, 16384);
    check("A", word(a, A), (uint32_t)n, n);
    check("P", word(p, P), plant ? (uint32_t)(n - 1) : 0, n);
    if (plant) P[0] = (uint32_t)n;
    cuLaunchKernel(saxpy, 1, 1, 1, 32, 1, 1, 0, NULL, args, NULL);
    check("A", word(a, A), (uint32_t)n, n);
    check("P", word(p, P), plant ? (uint32_t)n : 0, n);
    snprintf(line, sizeof(line), "%016llx %llu %s\n", (unsigned long long)token, (unsigned long long)n,
             bad[0] ? bad : "ok");
    write_state_line(argv[1], line);
    usleep(10000);
  }
}
