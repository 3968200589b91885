/* Two processes that share device memory through CUDA IPC and both keep
 * writing it, for the e2e test of copy-on-write of such processes
 * (ipc_cow_criu.sh), on the fake libcuda with real memory
 * (FAKE_CUDA_MEMORY=1). Device memory is only read and written through the
 * driver (copies, memsets, a kernel): only CUDA calls wait at phos's gate.
 *
 * The owner allocates S (8 MiB, shared) and A (2 MiB, its own), gets S's
 * IPC handle and starts the importer (itself again, exec'd: its child, in
 * the dumped tree), which reads the handle from fd 3, allocates B (2 MiB,
 * its own) and opens S. Each writes its own memory and its half of S (the
 * owner the first, the importer the second), a step every 10 ms:
 *
 *   1. check OWN[0] == HALF[end] == n - 1
 *   2. cuMemsetD32(OWN, n)                 (an exact set)
 *   3. check OWN[end] == n, HALF[0] == n - 1
 *   4. cuMemsetD32(HALF, n)                (an exact set, in S)
 *   5. the importer: saxpy(B, HALF)        (a speculated set that writes S;
 *                                           the fake kernel writes nothing)
 *      the owner: saxpy(HALF, A)           (reads S, writes A: the owner's
 *                                           hooks see no write to the
 *                                           importer's half of S)
 *   6. check HALF[0] == HALF[end] == OWN[0] == n
 *
 * Every call a checkpoint can freeze a process at is followed by a check of
 * what the memory held before it: a restored image that holds a write made
 * after its freeze, to S or to its own memory, fails the next check. The
 * owner writes "TOKEN n ok|bad:WHAT PEER" to STATE (PEER: the importer's
 * pid), the importer "m ok|bad:WHAT" to STATE.importer.
 *
 * With IPC_COW_OPEN_AFTER=PATH, the importer opens S only once PATH exists
 * (a handle made and sent before a dump, opened after its give-back).
 *
 * usage: ipc_cow_client STATE | ipc_cow_client STATE --import (handle on fd 3) */
#include <cuda.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

#include "../e2e/state_file.h"
#include "fake_saxpy.h"
#include "ipc_calls.h"

#define SHARED_BYTES (8u << 20)
#define HALF_BYTES (SHARED_BYTES / 2)
#define OWN_BYTES (2u << 20)

static char bad[96];

static uint32_t get(CUdeviceptr p, size_t bytes, int last) {
  uint32_t v = 0;
  if (cuMemcpyDtoH(&v, p + (last ? bytes - 4 : 0), 4) != CUDA_SUCCESS) exit(1);
  return v;
}

static void check(const char *what, uint32_t got, uint32_t want, uint64_t n) {
  if (got == want || bad[0]) return;
  snprintf(bad, sizeof(bad), "bad:%s=%u,want=%u,step=%llu", what, got, want, (unsigned long long)n);
}

/* The steps of one process over its own memory and its half of S, forever;
 * `line` writes its state. `kernel_writes_s`: its kernel writes its half of
 * S (else it reads it and writes its own memory). */
__attribute__((noreturn)) static void run(CUdeviceptr own, CUdeviceptr half, int kernel_writes_s,
                                          void (*line)(uint64_t n)) {
  CUfunction saxpy = fake_saxpy();
  float alpha = 2.0f;
  int count = 1024;
  void *args[] = {kernel_writes_s ? &own : &half, kernel_writes_s ? &half : &own, &alpha, &count};
  for (uint64_t n = 1;; n++) {
    const uint32_t was = (uint32_t)(n - 1), now = (uint32_t)n;
    check("own", get(own, OWN_BYTES, 0), was, n);
    check("shared", get(half, HALF_BYTES, 1), was, n);
    if (cuMemsetD32(own, now, OWN_BYTES / 4) != CUDA_SUCCESS) exit(1);
    check("own", get(own, OWN_BYTES, 1), now, n);
    check("shared", get(half, HALF_BYTES, 0), was, n);
    if (cuMemsetD32(half, now, HALF_BYTES / 4) != CUDA_SUCCESS) exit(1);
    if (cuLaunchKernel(saxpy, 1, 1, 1, 32, 1, 1, 0, NULL, args, NULL) != CUDA_SUCCESS) exit(1);
    check("shared", get(half, HALF_BYTES, 0), now, n);
    check("shared", get(half, HALF_BYTES, 1), now, n);
    check("own", get(own, OWN_BYTES, 0), now, n);
    line(n);
    usleep(10000);
  }
}

static const char *g_state;
static uint64_t g_token;
static int g_peer;

static void owner_line(uint64_t n) {
  char out[192];
  snprintf(out, sizeof(out), "%016llx %llu %s %d\n", (unsigned long long)g_token, (unsigned long long)n,
           bad[0] ? bad : "ok", g_peer);
  write_state_line(g_state, out);
}

static void importer_line(uint64_t n) {
  char path[4000], out[160];
  snprintf(path, sizeof(path), "%s.importer", g_state);
  snprintf(out, sizeof(out), "%llu %s\n", (unsigned long long)n, bad[0] ? bad : "ok");
  write_state_line(path, out);
}

__attribute__((noreturn)) static void importer(void) {
  CUipcMemHandle h;
  if (read(3, &h, sizeof(h)) != (ssize_t)sizeof(h)) {
    fprintf(stderr, "ipc_cow_client: no handle on fd 3\n");
    exit(1);
  }
  close(3);
  CUdeviceptr b = alloc(OWN_BYTES), s = 0;
  const char *after = getenv("IPC_COW_OPEN_AFTER");
  while (after && access(after, F_OK) != 0) usleep(2000);
  CUresult r = ((OpenHandle)proc("cuIpcOpenMemHandle"))(&s, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS);
  if (r != CUDA_SUCCESS) {
    fprintf(stderr, "cuIpcOpenMemHandle failed: %d\n", (int)r);
    exit(1);
  }
  run(b, s + HALF_BYTES, 1, importer_line);
}

int main(int argc, char **argv) {
  if (argc < 2) return 2;
  g_state = argv[1];
  cuInit(0);
  cuCtxSetCurrent((CUcontext)1);
  if (argc == 3 && !strcmp(argv[2], "--import")) importer();
  if (getrandom(&g_token, sizeof(g_token), 0) != sizeof(g_token)) return 2;
  CUdeviceptr s = alloc(SHARED_BYTES), a = alloc(OWN_BYTES);
  /* A late open: the importer's half must hold data at the freeze, for the
   * open to have something to push through the window (a chunk all zero
   * then is in the image as a hole already, settle_zero_chunks). Between
   * the words the importer checks, which its first memset overwrites. */
  if (getenv("IPC_COW_OPEN_AFTER") && cuMemsetD32(s + HALF_BYTES + HALF_BYTES / 2, 0x5eed, 1024) != CUDA_SUCCESS) {
    fprintf(stderr, "ipc_cow_client: the marker in the importer's half failed\n");
    return 1;
  }
  CUipcMemHandle h;
  if (((GetHandle)proc("cuIpcGetMemHandle"))(&h, s) != CUDA_SUCCESS) {
    fprintf(stderr, "cuIpcGetMemHandle failed\n");
    return 1;
  }
  int fds[2];
  if (pipe(fds) != 0) return 1;
  pid_t child = fork();
  if (child == 0) {
    close(fds[1]);
    if (dup2(fds[0], 3) != 3) _exit(127);
    execl("/proc/self/exe", argv[0], argv[1], "--import", (char *)NULL);
    _exit(127);
  }
  close(fds[0]);
  if (write(fds[1], &h, sizeof(h)) != (ssize_t)sizeof(h)) return 1;
  close(fds[1]);
  g_peer = (int)child;
  run(a, s, 0, owner_line);
}
