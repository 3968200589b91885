/* cuBLAS's workspaces and own memory through libphos.so, against the fake
 * libcuda and libcublas (fake_libcublas.c), for cublas_workspace.sh.
 *
 * cublas_client --record: prints "addr NAME 0xADDRESS BYTES" for every
 * buffer and "handle NAME 0xVALUE" for every handle, then makes these
 * cublasGemmEx calls (FP16, 8 x 8 x 8, A B C), each after a line "gemm N":
 *   1. on h1 (cublasCreate allocated O1; this call allocates L1 inside)
 *   2. on h1 again
 *   3. on h1 after cublasSetWorkspace(h1, W)
 *   4. on h2, made after cublasDestroy(h1) (the fake hands out the same
 *      value; its own memory O2, and L2 allocated inside)
 *   5. on h2 again, after handles h3..h6 were made (O3..O6): more of the
 *      library's own allocations than the call's ranges have room for
 *   6. on h2 after cublasSetWorkspace(h2, W) and cublasSetWorkspace(h2, NULL, 0)
 *
 * cublas_client STATE workspace|own|side-door: the e2e workload (real
 * memory, FAKE_CUDA_MEMORY=1), a step every 10 ms:
 *   1. cuCtxSynchronize                          (a call the gate holds)
 *   2. check T[0] == n - 1
 *   3. cublasGemmEx on h                         (the fake adds 1 to T[0]
 *                                                 after its own gate pass)
 *   4. check T[0] == n
 * where T, allocated last (copy-on-write copies it last), is
 *   workspace: W, given to cuBLAS by cublasSetWorkspace
 *   own:       the memory cublasCreate of h allocated
 *   side-door: W, given to the fake behind phos's back (the control: a
 *              write phos is not told of)
 * Every call a dump can freeze it at is followed by a check of what memory
 * held before it: a restored image holding a write made after its freeze
 * fails the next check. STATE gets "TOKEN COUNTER ok", or "TOKEN COUNTER
 * bad:WHAT" once a check failed.
 *
 * cublas_client --window GO: a GEMM that begins before a copy window opens
 * (cublas_window.sh): allocates A, B, C and W (1 MiB, the workspace of a
 * handle h), prints "ready PID 0xC 0xW", then makes one cublasGemmEx on h,
 * which the fake holds until the file GO exists (printing "fake_cublas:
 * waiting for GO" first) and which then launches a kernel through the
 * driver; prints "gemm RC" and sleeps (the test ends it). */
#include <cublas_v2.h>
#include <cuda.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

#include "../e2e/state_file.h"

unsigned long long fake_cublas_own_memory(cublasHandle_t h);
unsigned long long fake_cublas_lazy_memory(cublasHandle_t h);
void fake_cublas_side_door(void *p);
void fake_cublas_launch_after(const char *file, CUfunction f);

static CUdeviceptr alloc(const char *name, size_t bytes) {
  CUdeviceptr p = 0;
  if (cuMemAlloc(&p, bytes) != CUDA_SUCCESS) {
    fprintf(stderr, "cuMemAlloc of %zu bytes for %s failed\n", bytes, name);
    _exit(1);
  }
  return p;
}

static cublasHandle_t create(void) {
  cublasHandle_t h;
  if (cublasCreate(&h) != CUBLAS_STATUS_SUCCESS) {
    fprintf(stderr, "cublasCreate failed\n");
    _exit(1);
  }
  return h;
}

static void addr(const char *name, unsigned long long p, unsigned long long bytes) {
  printf("addr %s 0x%llx %llu\n", name, p, bytes);
}

static CUdeviceptr g_a, g_b, g_c;

/* The driver started on the fake's context, and the GEMM's A, B and C
 * (`bytes` each) allocated. */
static void gemm_buffers(size_t bytes) {
  cuInit(0);
  cuCtxSetCurrent((CUcontext)1);
  g_a = alloc("A", bytes);
  g_b = alloc("B", bytes);
  g_c = alloc("C", bytes);
}

static int gemm(cublasHandle_t h) {
  const float one = 1.0f;
  return cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, 8, 8, 8, &one, (void *)(uintptr_t)g_a, CUDA_R_16F, 8,
                      (void *)(uintptr_t)g_b, CUDA_R_16F, 8, &one, (void *)(uintptr_t)g_c, CUDA_R_16F, 8,
                      CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT) != CUBLAS_STATUS_SUCCESS;
}

static int record(void) {
  int bad = 0;
  gemm_buffers(128);
  CUdeviceptr w = alloc("W", 4u << 20);
  addr("A", g_a, 128);
  addr("B", g_b, 128);
  addr("C", g_c, 128);
  addr("W", w, 4u << 20);
  cublasHandle_t h1 = create();
  printf("handle h1 %p\n", (void *)h1);
  addr("O1", fake_cublas_own_memory(h1), 1u << 20);
  printf("gemm 1\n");
  bad |= gemm(h1);
  addr("L1", fake_cublas_lazy_memory(h1), 64u << 10);
  printf("gemm 2\n");
  bad |= gemm(h1);
  bad |= cublasSetWorkspace(h1, (void *)(uintptr_t)w, 4u << 20) != CUBLAS_STATUS_SUCCESS;
  printf("gemm 3\n");
  bad |= gemm(h1);
  bad |= cublasDestroy(h1) != CUBLAS_STATUS_SUCCESS;
  cublasHandle_t h2 = create();
  printf("handle h2 %p\n", (void *)h2);
  addr("O2", fake_cublas_own_memory(h2), 1u << 20);
  printf("gemm 4\n");
  bad |= gemm(h2);
  addr("L2", fake_cublas_lazy_memory(h2), 64u << 10);
  char name[8];
  for (int i = 3; i <= 6; i++) {
    cublasHandle_t h = create();
    snprintf(name, sizeof(name), "O%d", i);
    addr(name, fake_cublas_own_memory(h), 1u << 20);
  }
  printf("gemm 5\n");
  bad |= gemm(h2);
  bad |= cublasSetWorkspace(h2, (void *)(uintptr_t)w, 4u << 20) != CUBLAS_STATUS_SUCCESS;
  bad |= cublasSetWorkspace(h2, NULL, 0) != CUBLAS_STATUS_SUCCESS;
  printf("gemm 6\n");
  bad |= gemm(h2);
  printf("calls failed %d\n", bad);
  return bad;
}

static char bad[96];
static void check(const char *what, uint32_t got, uint32_t want, uint64_t n) {
  if (got == want || bad[0]) return;
  snprintf(bad, sizeof(bad), "bad:%s=%u,want=%u,step=%llu", what, got, want, (unsigned long long)n);
}

static int loop(const char *state, const char *mode) {
  uint64_t token;
  if (getrandom(&token, sizeof(token), 0) != sizeof(token)) return 2;
  cuInit(0);
  cuCtxSetCurrent((CUcontext)1);
  int own = !strcmp(mode, "own"), side_door = !strcmp(mode, "side-door");
  if (!own && !side_door && strcmp(mode, "workspace")) return 2;
  cublasHandle_t h = own ? NULL : create();
  g_a = alloc("A", 4u << 20);
  g_b = alloc("B", 4u << 20);
  g_c = alloc("C", 4u << 20);
  CUdeviceptr t;
  if (own) {
    h = create();
    t = fake_cublas_own_memory(h);
  } else {
    t = alloc("W", 4u << 20);
    if (side_door) fake_cublas_side_door((void *)(uintptr_t)t);
    else if (cublasSetWorkspace(h, (void *)(uintptr_t)t, 4u << 20) != CUBLAS_STATUS_SUCCESS) return 1;
  }
  /* The fake's device memory is the process's: zero from the start. */
  volatile uint32_t *T = (volatile uint32_t *)(uintptr_t)t;
  char line[192];
  for (uint64_t n = 1;; n++) {
    cuCtxSynchronize();
    check("T", T[0], (uint32_t)(n - 1), n);
    if (gemm(h)) snprintf(bad, sizeof(bad), "bad:gemm-failed,step=%llu", (unsigned long long)n);
    check("T", T[0], (uint32_t)n, n);
    snprintf(line, sizeof(line), "%016llx %llu %s\n", (unsigned long long)token, (unsigned long long)n,
             bad[0] ? bad : "ok");
    write_state_line(state, line);
    usleep(10000);
  }
}

static int window(const char *go) {
  gemm_buffers(4096);
  CUdeviceptr w = alloc("W", 1u << 20);
  cublasHandle_t h = create();
  if (cublasSetWorkspace(h, (void *)(uintptr_t)w, 1u << 20) != CUBLAS_STATUS_SUCCESS) return 1;
  /* Any image does for the fake driver: the GEMM's kernel. */
  static const char image[] = ".version 8.0\n.target sm_90\n";
  CUmodule m;
  CUfunction f;
  if (cuModuleLoadData(&m, image) != CUDA_SUCCESS || cuModuleGetFunction(&f, m, "fake_gemm_kernel") != CUDA_SUCCESS) {
    fprintf(stderr, "loading the GEMM's kernel failed\n");
    return 1;
  }
  fake_cublas_launch_after(go, f);
  printf("ready %d 0x%llx 0x%llx\n", (int)getpid(), (unsigned long long)g_c, (unsigned long long)w);
  fflush(stdout);
  printf("gemm %d\n", gemm(h));
  fflush(stdout);
  sleep(60);
  return 0;
}

int main(int argc, char **argv) {
  if (argc == 2 && !strcmp(argv[1], "--record")) return record();
  if (argc == 3 && !strcmp(argv[1], "--window")) return window(argv[2]);
  if (argc == 3) return loop(argv[1], argv[2]);
  fprintf(stderr, "usage: cublas_client --record | --window GO | STATE workspace|own|side-door\n");
  return 2;
}
