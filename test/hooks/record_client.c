/* Makes the calls whose buffers libphos.so records, against the fake
 * libcuda, libcublas and libnccl, at made-up device addresses; the test
 * (record.sh) reads the record back from PHOS_STATS_FILE.
 *
 * usage: record_client NCCL_USER_LIBRARY [wait]
 * wait: print "ready PID" and sleep, for a test to ask the agent. */
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

extern unsigned long long fake_copy_calls, fake_cublas_calls;

static void layout(cublasLtMatrixLayoutOpaque_t *l, cudaDataType type, int order, unsigned long long rows,
                   unsigned long long cols, long long ld, int batch, long long stride) {
  memset(l, 0, sizeof(*l));
  l->data[0] = (unsigned long long)type;
  l->data[1] = (unsigned long long)order;
  l->data[2] = rows;
  l->data[3] = cols;
  l->data[4] = (unsigned long long)ld;
  l->data[5] = (unsigned long long)batch;
  l->data[6] = (unsigned long long)stride;
}

/* Modules and launches: a fatbin with two kernels (one launched twice), a
 * library with a kernel launched through cuKernelGetFunction's function, a
 * PTX module loaded and unloaded. */
static int modules(void) {
  static unsigned char fatbin[16 + 200];
  unsigned int magic = 0xBA55ED50;
  unsigned short version = 1, header = 16;
  unsigned long long payload = 200;
  memcpy(fatbin, &magic, 4);
  memcpy(fatbin + 4, &version, 2);
  memcpy(fatbin + 6, &header, 2);
  memcpy(fatbin + 8, &payload, 8);
  memset(fatbin + 16, 0x42, 200);
  int bad = 0;
  CUmodule m, ptx;
  CUfunction f, g, lf;
  CUlibrary lib;
  CUkernel k;
  CUdeviceptr global;
  size_t global_bytes;
  bad |= cuModuleLoadData(&m, fatbin);
  bad |= cuModuleGetFunction(&f, m, "vec_add");
  bad |= cuModuleGetFunction(&g, m, "scale");
  bad |= cuModuleGetGlobal(&global, &global_bytes, m, "table");
  bad |= cuLibraryLoadData(&lib, fatbin, NULL, NULL, 0, NULL, NULL, 0);
  bad |= cuLibraryGetKernel(&k, lib, "lib_kernel");
  bad |= cuKernelGetFunction(&lf, k);
  bad |= cuModuleLoadData(&ptx, ".version 8.0\n.target sm_90\n");
  bad |= cuModuleUnload(ptx);
  bad |= cuLaunchKernel(f, 1, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL);
  bad |= cuLaunchKernel(f, 1, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL);
  bad |= cuLaunchKernel(lf, 1, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL);
  return bad;
}

int main(int argc, char **argv) {
  if (argc < 2) return 2;
  int bad = 0;
  /* Copies and sets. */
  bad |= cuMemcpyDtoD(0x100000, 0x200000, 4096);
  bad |= cuMemcpyDtoHAsync(&bad, 0x300000, 64, (CUstream)0x7);
  bad |= cuMemcpyPeer(0x400000, NULL, 0x500000, NULL, 100);
  CUDA_MEMCPY2D c2 = {0};
  c2.srcMemoryType = CU_MEMORYTYPE_HOST;
  c2.dstMemoryType = CU_MEMORYTYPE_DEVICE;
  c2.dstDevice = 0x600000;
  c2.dstXInBytes = 16;
  c2.dstY = 2;
  c2.dstPitch = 512;
  c2.WidthInBytes = 100;
  c2.Height = 4;
  bad |= cuMemcpy2D(&c2);
  CUDA_MEMCPY3D_PEER c3 = {0};
  c3.srcMemoryType = CU_MEMORYTYPE_UNIFIED;
  c3.srcDevice = 0x700000;
  c3.srcPitch = 256;
  c3.srcHeight = 10;
  c3.srcZ = 1;
  c3.dstMemoryType = CU_MEMORYTYPE_ARRAY;
  c3.WidthInBytes = 64;
  c3.Height = 3;
  c3.Depth = 2;
  bad |= cuMemcpy3DPeerAsync(&c3, NULL);
  bad |= cuMemsetD32(0x800000, 0, 10);
  bad |= cuMemsetD2D16Async(0x900000, 1024, 7, 100, 3, NULL);
  bad |= cuStreamWriteValue32(NULL, 0x910000, 5, 0);
  CUdeviceptr dsts[2] = {0x920000, 0x930000}, srcs[2] = {0x940000, 0x950000};
  size_t sizes[2] = {64, 128}, attr_idx = 0;
  CUmemcpyAttributes attrs;
  memset(&attrs, 0, sizeof(attrs));
  bad |= cuMemcpyBatchAsync(dsts, srcs, sizes, 2, &attrs, &attr_idx, 1, NULL);

  /* cuBLAS. */
  cublasHandle_t h = (cublasHandle_t)0x1;
  cublasSetStream(h, (cudaStream_t)0x9);
  float one = 1;
  double done = 1;
  bad |= cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_T, 4, 5, 3, &one, (float *)0xa00000, 4, (float *)0xb00000, 6, &one,
                     (float *)0xc00000, 4);
  bad |= cublasDgemmStridedBatched(h, CUBLAS_OP_T, CUBLAS_OP_N, 2, 2, 3, &done, (double *)0xd00000, 3, 6,
                                   (double *)0xe00000, 3, 6, &done, (double *)0xf00000, 2, 4, 3);
  bad |= cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, 8, 8, 8, &one, (void *)0x1000000, CUDA_R_16F, 8, (void *)0x1100000,
                      CUDA_R_16F, 8, &one, (void *)0x1200000, CUDA_R_32F, 8, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
  bad |= cublasGemmBatchedEx(h, CUBLAS_OP_N, CUBLAS_OP_N, 8, 8, 8, &one, (const void *const *)0x1300000, CUDA_R_16F,
                             8, (const void *const *)0x1400000, CUDA_R_16F, 8, &one, (void *const *)0x1500000,
                             CUDA_R_16F, 8, 5, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
  cublasLtMatrixLayoutOpaque_t la, lb, lc;
  layout(&la, CUDA_R_16BF, CUBLASLT_ORDER_COL, 64, 32, 64, 1, 0);
  layout(&lb, CUDA_R_16BF, CUBLASLT_ORDER_ROW, 32, 16, 32, 1, 0);
  layout(&lc, CUDA_R_32F, CUBLASLT_ORDER_COL32, 64, 16, 64, 1, 0);
  bad |= cublasLtMatmul((cublasLtHandle_t)0x1, NULL, &one, (void *)0x1600000, &la, (void *)0x1700000, &lb, &one,
                        (void *)0x1800000, &lc, (void *)0x1800000, &lc, NULL, (void *)0x1900000, 1 << 20,
                        (cudaStream_t)0x9);

  /* NCCL, from a library opened with RTLD_LOCAL. */
  void *user = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  int (*run)(void) = user ? (int (*)(void))dlsym(user, "phos_nccl_user_run") : NULL;
  if (!run) { printf("no nccl user: %s\n", dlerror()); return 2; }
  bad |= run();
  int (*comms)(void) = (int (*)(void))dlsym(user, "phos_nccl_user_comms");
  if (!comms) { printf("no nccl user comms: %s\n", dlerror()); return 2; }
  bad |= comms();
  unsigned long long *nccl_calls = (unsigned long long *)dlsym(RTLD_DEFAULT, "fake_nccl_calls");
  void *nccl = dlopen("libnccl.so.2", RTLD_NOW | RTLD_NOLOAD);
  if (nccl) nccl_calls = (unsigned long long *)dlsym(nccl, "fake_nccl_calls");
  bad |= modules();
  printf("calls failed %d\n", bad);
  printf("reached copies %llu cublas %llu nccl %llu\n", fake_copy_calls, fake_cublas_calls,
         nccl_calls ? *nccl_calls : 0ULL);
  /* "wait late-split RANK": also the splits of phos_nccl_user_late_split. */
  if (argc > 4 && !strcmp(argv[3], "late-split")) {
    int (*late_split)(int) = (int (*)(int))dlsym(user, "phos_nccl_user_late_split");
    if (!late_split || late_split(atoi(argv[4]))) { printf("late split failed\n"); return 2; }
  }
  if (argc > 2 && !strcmp(argv[2], "wait")) {
    printf("ready %d\n", (int)getpid());
    fflush(stdout);
    sleep(60);
  }
  return 0;
}
