/* A stand-in libcublas (with cublasLt's matmul) for testing libphos.so's
 * interposition without a GPU: each GEMM counts its call, and the plain
 * SGEMM issues a memset through the driver, as real GEMMs issue kernels, so
 * that the record shows work issued inside a library call.
 *
 * A cublasLtMatrixLayout_t here is a cublasLtMatrixLayoutOpaque_t whose
 * data[i] holds attribute i (type, order, rows, cols, ld, batch count,
 * batch stride, plane offset).
 *
 * Handles made by cublasCreate (slots of a table: a destroyed handle's value
 * comes back, as a real one's may) own memory as cuBLAS's do: cublasCreate
 * allocates 1 MiB (its default workspace pool), the first cublasGemmEx on a
 * handle without a workspace 64 KiB more (a pool made at first use); both
 * through the driver, freed by cublasDestroy. cublasGemmEx on such a handle
 * passes the gate (a driver call, as a real GEMM's kernel launch does),
 * then, with FAKE_CUDA_MEMORY=1, adds 1 to the first word of the memory its
 * kernels would write beside C: the workspace cublasSetWorkspace set, else
 * the handle's own pool; and to fake_cublas_side_door's buffer where one is
 * set (memory the library writes without phos being told of it).
 *
 * After fake_cublas_launch_after(FILE, F), cublasGemmEx on such a handle
 * first says "fake_cublas: waiting for FILE" on stdout, waits until FILE
 * exists, then launches F through the driver (a real GEMM's kernel): a call
 * that began, and passed libphos.so's hook, before a dump's copy window
 * opened, and whose kernel runs inside it. */
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

unsigned long long fake_cublas_calls;
static cudaStream_t g_stream;

static cublasStatus_t counted(void) {
  __atomic_add_fetch(&fake_cublas_calls, 1, __ATOMIC_RELAXED);
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetStream_v2(cublasHandle_t h, cudaStream_t s) { (void)h; g_stream = s; return CUBLAS_STATUS_SUCCESS; }
cublasStatus_t cublasGetStream_v2(cublasHandle_t h, cudaStream_t *s) { (void)h; *s = g_stream; return CUBLAS_STATUS_SUCCESS; }

cublasStatus_t cublasSgemm_v2(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                              const float *alpha, const float *a, int lda, const float *b, int ldb, const float *beta,
                              float *c, int ldc) {
  (void)h; (void)ta; (void)tb; (void)n; (void)k; (void)alpha; (void)a; (void)lda; (void)b; (void)ldb; (void)beta;
  (void)ldc;
  cuMemsetD32((CUdeviceptr)c, 0, (size_t)m);
  return counted();
}

cublasStatus_t cublasDgemmStridedBatched(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n,
                                         int k, const double *alpha, const double *a, int lda, long long sa,
                                         const double *b, int ldb, long long sb, const double *beta, double *c,
                                         int ldc, long long sc, int batch) {
  (void)h; (void)ta; (void)tb; (void)m; (void)n; (void)k; (void)alpha; (void)a; (void)lda; (void)sa; (void)b;
  (void)ldb; (void)sb; (void)beta; (void)c; (void)ldc; (void)sc; (void)batch;
  return counted();
}

cublasStatus_t cublasGemmBatchedEx(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                                   const void *alpha, const void *const a[], cudaDataType at, int lda,
                                   const void *const b[], cudaDataType bt, int ldb, const void *beta, void *const c[],
                                   cudaDataType ct, int ldc, int batch, cublasComputeType_t compute,
                                   cublasGemmAlgo_t algo) {
  (void)h; (void)ta; (void)tb; (void)m; (void)n; (void)k; (void)alpha; (void)a; (void)at; (void)lda; (void)b;
  (void)bt; (void)ldb; (void)beta; (void)c; (void)ct; (void)ldc; (void)batch; (void)compute; (void)algo;
  return counted();
}

int fake_real_memory(void); /* fake_libcuda_vmm.c: FAKE_CUDA_MEMORY=1 */

enum { kOwnBytes = 1 << 20, kLazyBytes = 64 << 10, kHandles = 16 };
struct FakeHandle {
  int used;
  CUdeviceptr own, lazy;    /* the library's own memory */
  void *workspace;          /* cublasSetWorkspace's */
  size_t workspace_bytes;
};
static struct FakeHandle g_handles[kHandles];
static void *g_side_door;
static const char *g_wait_file;
static CUfunction g_kernel_after_wait;

static struct FakeHandle *made(cublasHandle_t h) {
  struct FakeHandle *f = (struct FakeHandle *)h;
  return f >= g_handles && f < g_handles + kHandles && f->used ? f : NULL;
}

/* For the tests: the memory a handle's library owns, and the side door. */
unsigned long long fake_cublas_own_memory(cublasHandle_t h) { return made(h) ? made(h)->own : 0; }
unsigned long long fake_cublas_lazy_memory(cublasHandle_t h) { return made(h) ? made(h)->lazy : 0; }
void fake_cublas_side_door(void *p) { g_side_door = p; }
void fake_cublas_launch_after(const char *file, CUfunction f) {
  g_wait_file = file;
  g_kernel_after_wait = f;
}

static void wait_then_launch(void) {
  if (!g_wait_file) return;
  printf("fake_cublas: waiting for %s\n", g_wait_file);
  fflush(stdout);
  while (access(g_wait_file, F_OK) != 0) usleep(5000);
  cuLaunchKernel(g_kernel_after_wait, 1, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL);
}

cublasStatus_t cublasCreate_v2(cublasHandle_t *h) {
  for (int i = 0; i < kHandles; i++) {
    if (g_handles[i].used) continue;
    memset(&g_handles[i], 0, sizeof(g_handles[i]));
    if (cuMemAlloc(&g_handles[i].own, kOwnBytes) != CUDA_SUCCESS) return CUBLAS_STATUS_ALLOC_FAILED;
    g_handles[i].used = 1;
    *h = (cublasHandle_t)&g_handles[i];
    return CUBLAS_STATUS_SUCCESS;
  }
  return CUBLAS_STATUS_ALLOC_FAILED;
}

cublasStatus_t cublasDestroy_v2(cublasHandle_t h) {
  struct FakeHandle *f = made(h);
  if (!f) return CUBLAS_STATUS_NOT_INITIALIZED;
  cuMemFree(f->own);
  if (f->lazy) cuMemFree(f->lazy);
  f->used = 0;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetWorkspace_v2(cublasHandle_t h, void *workspace, size_t bytes) {
  struct FakeHandle *f = made(h);
  if (!f) return CUBLAS_STATUS_NOT_INITIALIZED;
  f->workspace = workspace;
  f->workspace_bytes = bytes;
  return CUBLAS_STATUS_SUCCESS;
}

static void bump(void *p) {
  if (p && fake_real_memory()) (*(volatile unsigned *)p)++;
}

cublasStatus_t cublasGemmEx(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                            const void *alpha, const void *a, cudaDataType at, int lda, const void *b,
                            cudaDataType bt, int ldb, const void *beta, void *c, cudaDataType ct, int ldc,
                            cublasComputeType_t compute, cublasGemmAlgo_t algo) {
  (void)ta; (void)tb; (void)m; (void)n; (void)k; (void)alpha; (void)a; (void)at; (void)lda; (void)b;
  (void)bt; (void)ldb; (void)beta; (void)c; (void)ct; (void)ldc; (void)compute; (void)algo;
  struct FakeHandle *f = made(h);
  if (f) {
    wait_then_launch();
    if (!f->workspace && !f->lazy && cuMemAlloc(&f->lazy, kLazyBytes) != CUDA_SUCCESS)
      return CUBLAS_STATUS_ALLOC_FAILED;
    cuCtxSynchronize();
    bump(f->workspace ? f->workspace : (void *)(uintptr_t)f->own);
    bump(g_side_door);
  }
  return counted();
}

cublasStatus_t cublasLtMatrixLayoutGetAttribute(cublasLtMatrixLayout_t l, cublasLtMatrixLayoutAttribute_t attr,
                                                void *buf, size_t size, size_t *written) {
  if ((unsigned)attr >= 8 || size > sizeof(l->data[0])) return CUBLAS_STATUS_INVALID_VALUE;
  memcpy(buf, &l->data[attr], size);  /* little-endian: the low bytes */
  *written = size;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmul(cublasLtHandle_t h, cublasLtMatmulDesc_t desc, const void *alpha, const void *a,
                              cublasLtMatrixLayout_t ad, const void *b, cublasLtMatrixLayout_t bd, const void *beta,
                              const void *c, cublasLtMatrixLayout_t cd, void *d, cublasLtMatrixLayout_t dd,
                              const cublasLtMatmulAlgo_t *algo, void *ws, size_t ws_bytes, cudaStream_t s) {
  (void)h; (void)desc; (void)alpha; (void)a; (void)ad; (void)b; (void)bd; (void)beta; (void)c; (void)cd; (void)d;
  (void)dd; (void)algo; (void)ws; (void)ws_bytes; (void)s;
  return counted();
}
