/* The workload of the supervisor's e2e test (supervise.sh), on the fake
 * libcuda with real memory (FAKE_CUDA_MEMORY=1): a deterministic
 * computation whose state lives in device memory. W (4 MiB) is read back,
 * advanced and written again every step; K (4 MiB) holds a constant pattern
 * written once, checked every step (an incremental image references it in
 * its parent). Step n appends "n SUM" to OUT (opened and closed each time:
 * criu checks the size of open files), SUM a hash of W after the step, and
 * writes "TOKEN n ok|bad:WHAT" to STATE. A run restored from any image
 * writes, for every step, the SUM an uninterrupted run writes.
 *
 * A CUDA call that fails (PHOS_FAULT=gpu-error: libphos.so fails them once
 * its trigger file appears) ends the program with status 3, the error in
 * STATE.error: a CUDA error it cannot recover from.
 *
 * usage: supervised_client STATE OUT STEPS [PACE_MS] */
#include <cuda.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include "../e2e/state_file.h"

#define MIB (1u << 20)
#define WORDS (4 * MIB / 8)

static const char *state;

static void die_cuda(const char *what, CUresult r, unsigned long n) {
  char path[4096], line[256];
  snprintf(path, sizeof(path), "%s.error", state);
  snprintf(line, sizeof(line), "%s failed with CUDA error %d at step %lu\n", what, (int)r, n);
  write_state_line(path, line);
  fputs(line, stderr);
  /* SUPERVISED_LINGER=1: alive after the error, as a program is while it
   * unwinds, for a dump to be tried on it. */
  if (getenv("SUPERVISED_LINGER"))
    for (;;) pause();
  exit(3);
}

static uint64_t next(uint64_t x) {
  x ^= x << 13, x ^= x >> 7, x ^= x << 17;
  return x;
}

int main(int argc, char **argv) {
  if (argc < 4) {
    fprintf(stderr, "usage: %s STATE OUT STEPS [PACE_MS]\n", argv[0]);
    return 2;
  }
  state = argv[1];
  const char *out = argv[2];
  unsigned long steps = strtoul(argv[3], NULL, 10);
  long pace_ms = argc > 4 ? atol(argv[4]) : 20;
  uint64_t token;
  if (getrandom(&token, sizeof(token), 0) != sizeof(token)) return 2;
  static uint64_t w[WORDS], k[WORDS], seen[WORDS];
  CUdeviceptr dw = 0, dk = 0;
  cuInit(0);
  cuCtxSetCurrent((CUcontext)1); /* the fake's context */
  if (cuMemAlloc(&dw, sizeof(w)) != CUDA_SUCCESS ||
      cuMemAlloc(&dk, sizeof(k)) != CUDA_SUCCESS) {
    fprintf(stderr, "cuMemAlloc failed\n");
    return 2;
  }
  uint64_t seed = 0x9e3779b97f4a7c15ull;
  for (size_t i = 0; i < WORDS; i++) w[i] = seed = next(seed), k[i] = seed = next(seed);
  CUresult r;
  if ((r = cuMemcpyHtoD(dw, w, sizeof(w))) != CUDA_SUCCESS) die_cuda("cuMemcpyHtoD", r, 0);
  if ((r = cuMemcpyHtoD(dk, k, sizeof(k))) != CUDA_SUCCESS) die_cuda("cuMemcpyHtoD", r, 0);
  char bad[96] = "ok";
  for (unsigned long n = 1; n <= steps; n++) {
    if ((r = cuMemcpyDtoH(w, dw, sizeof(w))) != CUDA_SUCCESS) die_cuda("cuMemcpyDtoH", r, n);
    if ((r = cuMemcpyDtoH(seen, dk, sizeof(seen))) != CUDA_SUCCESS) die_cuda("cuMemcpyDtoH", r, n);
    if (strcmp(bad, "ok") == 0 && memcmp(seen, k, sizeof(k)) != 0) snprintf(bad, sizeof(bad), "bad:K,step=%lu", n);
    uint64_t sum = n;
    for (size_t i = 0; i < WORDS; i++) {
      w[i] = next(w[i] + n);
      sum = next(sum ^ w[i]);
    }
    if ((r = cuMemcpyHtoD(dw, w, sizeof(w))) != CUDA_SUCCESS) die_cuda("cuMemcpyHtoD", r, n);
    char line[128];
    FILE *f = fopen(out, "a");
    if (!f) return 2;
    fprintf(f, "%lu %016llx\n", n, (unsigned long long)sum);
    fclose(f);
    snprintf(line, sizeof(line), "%016llx %lu %s\n", (unsigned long long)token, n, bad);
    write_state_line(state, line);
    if (pace_ms) {
      struct timespec ts = {pace_ms / 1000, (pace_ms % 1000) * 1000000L};
      nanosleep(&ts, NULL);
    }
  }
  return 0;
}
