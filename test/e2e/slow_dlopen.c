/* A program frozen by a checkpoint inside dlopen(), as `import torch` is in
 * its first second (the main thread inside the dlopen of a big library,
 * holding glibc's loader lock). The workload of slow_dlopen.sh.
 *
 * usage: phos-test-slow-dlopen STATE LIBRARY [--cuda] [--nccl]
 *   --cuda: first allocates 4 MiB of device memory (through libphos, on the
 *   fake libcuda with real memory: FAKE_CUDA_MEMORY=1) and fills it; the
 *   counting loop then checks it ("ok" after the counter, else "bad").
 *   --nccl: first makes an NCCL communicator of one rank (the fake
 *   libnccl.so.2), which a checkpoint releases and makes again.
 *   writes "TOKEN 0 loading" to STATE, dlopen()s LIBRARY (whose
 *   constructor, slow_constructor.c, sleeps), then counts as counter.c does:
 *   "TOKEN COUNTER loaded" every 10 ms. */
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/random.h>
#include <time.h>

#include "state_file.h"

#define WORDS ((4u << 20) / 8)
static volatile uint64_t *device;

/* Through libphos's hooks, looked up by name: the program links no libcuda. */
static int allocate(uint64_t token) {
  int (*init)(unsigned) = (int (*)(unsigned))dlsym(RTLD_DEFAULT, "cuInit");
  int (*set_current)(void *) = (int (*)(void *))dlsym(RTLD_DEFAULT, "cuCtxSetCurrent");
  int (*alloc)(uint64_t *, size_t) = (int (*)(uint64_t *, size_t))dlsym(RTLD_DEFAULT, "cuMemAlloc_v2");
  uint64_t p = 0;
  if (!init || !set_current || !alloc || init(0) || set_current((void *)1) || alloc(&p, WORDS * 8)) {
    fprintf(stderr, "device memory: %s\n", init && set_current && alloc ? "a call failed" : dlerror());
    return 0;
  }
  device = (volatile uint64_t *)(uintptr_t)p;
  for (uint64_t i = 0; i < WORDS; i++) device[i] = token ^ i;
  return 1;
}

typedef struct {
  char internal[128];
} UniqueId;

static int communicator(void) {
  if (!dlopen("libnccl.so.2", RTLD_NOW | RTLD_GLOBAL)) {
    fprintf(stderr, "dlopen libnccl.so.2: %s\n", dlerror());
    return 0;
  }
  int (*unique_id)(UniqueId *) = (int (*)(UniqueId *))dlsym(RTLD_DEFAULT, "ncclGetUniqueId");
  int (*init_rank)(void **, int, UniqueId, int) = (int (*)(void **, int, UniqueId, int))dlsym(RTLD_DEFAULT, "ncclCommInitRank");
  UniqueId id;
  void *comm = NULL;
  if (!unique_id || !init_rank || unique_id(&id) || init_rank(&comm, 1, id, 0)) {
    fprintf(stderr, "NCCL communicator: %s\n", unique_id && init_rank ? "a call failed" : dlerror());
    return 0;
  }
  return 1;
}

static const char *checked(uint64_t token, uint64_t counter) {
  if (!device) return "loaded";
  uint64_t i = (counter * 2654435761u) % WORDS;
  return device[i] == (token ^ i) ? "ok" : "bad";
}

int main(int argc, char **argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: %s STATE LIBRARY\n", argv[0]);
    return 2;
  }
  uint64_t token = 0;
  if (getrandom(&token, sizeof(token), 0) != sizeof(token)) return 2;
  for (int i = 3; i < argc; i++) {
    if (strcmp(argv[i], "--cuda") == 0 && !allocate(token)) return 2;
    if (strcmp(argv[i], "--nccl") == 0 && !communicator()) return 2;
  }
  write_state_word(argv[1], token, 0, "loading");
  if (!dlopen(argv[2], RTLD_NOW | RTLD_GLOBAL)) {
    fprintf(stderr, "dlopen %s: %s\n", argv[2], dlerror());
    return 2;
  }
  struct timespec tick = {0, 10 * 1000 * 1000};
  for (uint64_t counter = 1;; counter++) {
    const char *what = checked(token, counter);
    write_state_word(argv[1], token, counter, what);
    if (strcmp(what, "bad") == 0) return 3;
    nanosleep(&tick, NULL);
  }
}
