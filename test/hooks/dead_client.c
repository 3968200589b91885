/* The workload of the e2e test of dead memory (dead_memory.sh), on the fake
 * libcuda with real memory (FAKE_CUDA_MEMORY=1), in chunks of 1 MiB: device
 * memory L (2 MiB) and F (8 MiB). F's head [0, 1 MiB) and tail [7.5, 8 MiB)
 * hold a pattern of the program's (live); its middle M = [1, 7.5 MiB) is a
 * free block of the program's allocator at every iteration boundary, used
 * as scratch in each iteration: written first, then read. A step:
 *
 *   1. the boundary, as the SDK's phos.step() makes it: where a checkpoint
 *      waits (phos_step_pending), M handed as free (phos_step_dead); else
 *      phos_step()
 *   2. M[0] before this iteration writes it: n - 1 as the last one left it,
 *      else M came back unfilled (a restore of an image where it was dead)
 *   3. cuMemsetD32(M, n) (an exact write set: copy-on-write saves what it
 *      protects), check M[0] == n
 *   4. check L[0] == n - 1, cuMemsetD32(L, n), check L[0] == n
 *   5. check the pattern of F's head and tail
 *
 * --no-dead: step 1 hands no free memory (the control). --stale: M is live
 * too (patterned once, checked every step); the program hands it as free
 * once, at its first step, where no checkpoint waits, and never again: a
 * list that a later checkpoint must not use.
 *
 * STATE gets "TOKEN COUNTER ok|bad:WHAT UNFILLED", UNFILLED counting the
 * iterations that found M unfilled (2).
 *
 * usage: dead_client STATE [--no-dead|--stale] */
#include <cuda.h>
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

#include "../e2e/state_file.h"

#define MIB (1u << 20)

static char bad[96];

static void check(const char *what, uint64_t got, uint64_t want, uint64_t n) {
  if (got == want || bad[0]) return;
  snprintf(bad, sizeof(bad), "bad:%s=%llx,want=%llx,step=%llu", what, (unsigned long long)got,
           (unsigned long long)want, (unsigned long long)n);
}

static CUdeviceptr alloc(size_t bytes) {
  CUdeviceptr p = 0;
  if (cuMemAlloc(&p, bytes) != CUDA_SUCCESS) {
    fprintf(stderr, "cuMemAlloc of %zu bytes failed\n", bytes);
    _exit(1);
  }
  return p;
}

/* A pattern no chunk of which is zero, from `seed`; and its sum. */
static void fill(uint64_t *p, size_t words, uint64_t seed) {
  for (size_t i = 0; i < words; i++) {
    seed ^= seed << 13, seed ^= seed >> 7, seed ^= seed << 17;
    p[i] = seed | 1;
  }
}
static uint64_t sum(const volatile uint64_t *p, size_t words) {
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < words; i++) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

int main(int argc, char **argv) {
  if (argc < 2) return 2;
  const int no_dead = argc > 2 && !strcmp(argv[2], "--no-dead");
  const int stale = argc > 2 && !strcmp(argv[2], "--stale");
  void (*step)(void) = (void (*)(void))dlsym(RTLD_DEFAULT, "phos_step");
  void (*step_dead)(const uint64_t *, size_t) = (void (*)(const uint64_t *, size_t))dlsym(RTLD_DEFAULT, "phos_step_dead");
  int (*pending)(void) = (int (*)(void))dlsym(RTLD_DEFAULT, "phos_step_pending");
  if (!step || !step_dead || !pending) {
    fprintf(stderr, "libphos.so's phos_step, phos_step_dead, phos_step_pending: not found\n");
    return 1;
  }
  uint64_t token;
  if (getrandom(&token, sizeof(token), 0) != sizeof(token)) return 2;
  cuInit(0);
  cuCtxSetCurrent((CUcontext)1);
  const CUdeviceptr l = alloc(2 * MIB), f = alloc(8 * MIB);
  const CUdeviceptr m = f + MIB;
  const size_t m_bytes = 13 * MIB / 2;
  volatile uint32_t *L = (volatile uint32_t *)(uintptr_t)l, *M = (volatile uint32_t *)(uintptr_t)m;
  uint64_t *head = (uint64_t *)(uintptr_t)f, *tail = (uint64_t *)(uintptr_t)(f + 15 * MIB / 2);
  const size_t head_words = MIB / 8, tail_words = MIB / 16, m_words = m_bytes / 8;
  fill(head, head_words, token);
  fill(tail, tail_words, token + 1);
  const uint64_t head_sum = sum(head, head_words), tail_sum = sum(tail, tail_words);
  uint64_t m_sum = 0;
  const uint64_t free_block[2] = {m, m_bytes};
  uint64_t unfilled = 0;
  char line[192];
  for (uint64_t n = 1;; n++) {
    if (stale && n == 1) {
      step_dead(free_block, 1); /* no checkpoint waits: a list for none */
      fill((uint64_t *)(uintptr_t)m, m_words, token + 2);
      m_sum = sum((volatile uint64_t *)(uintptr_t)m, m_words);
    } else if (!no_dead && !stale && pending()) {
      step_dead(free_block, 1);
    } else {
      step();
    }
    if (stale) {
      check("M", sum((volatile uint64_t *)(uintptr_t)m, m_words), m_sum, n);
    } else {
      if (n > 1 && M[0] != (uint32_t)(n - 1)) unfilled++;
      cuMemsetD32(m, (unsigned)n, m_bytes / 4);
      check("M", M[0], (uint32_t)n, n);
    }
    check("L", L[0], (uint32_t)(n - 1), n);
    cuMemsetD32(l, (unsigned)n, 2 * MIB / 4);
    check("L", L[0], (uint32_t)n, n);
    check("head", sum(head, head_words), head_sum, n);
    check("tail", sum(tail, tail_words), tail_sum, n);
    snprintf(line, sizeof(line), "%016llx %llu %s %llu\n", (unsigned long long)token, (unsigned long long)n,
             bad[0] ? bad : "ok", (unsigned long long)unfilled);
    write_state_line(argv[1], line);
    usleep(10000);
  }
}
