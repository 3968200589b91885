/* A stand-in libcublas (with cublasLt's matmul) for testing libphos.so's
 * interposition without a GPU: each GEMM counts its call, and the plain
 * SGEMM issues a memset through the driver, as real GEMMs issue kernels, so
 * that the record shows work issued inside a library call.
 *
 * A cublasLtMatrixLayout_t here is a cublasLtMatrixLayoutOpaque_t whose
 * data[i] holds attribute i (type, order, rows, cols, ld, batch count,
 * batch stride, plane offset). */
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda.h>
#include <string.h>

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

cublasStatus_t cublasGemmEx(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                            const void *alpha, const void *a, cudaDataType at, int lda, const void *b,
                            cudaDataType bt, int ldb, const void *beta, void *c, cudaDataType ct, int ldc,
                            cublasComputeType_t compute, cublasGemmAlgo_t algo) {
  (void)h; (void)ta; (void)tb; (void)m; (void)n; (void)k; (void)alpha; (void)a; (void)at; (void)lda; (void)b;
  (void)bt; (void)ldb; (void)beta; (void)c; (void)ct; (void)ldc; (void)compute; (void)algo;
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
