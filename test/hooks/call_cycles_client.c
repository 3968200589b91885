/* A known sequence of CUDA calls against the fake libcuda and libcublas,
 * for call_cycles.sh to compare with what libphos.so's call counter
 * (PHOS_CALL_CYCLES=on) says, through the agent and the stats file:
 *   cuInit 1, cuModuleLoadData 1, cuModuleGetFunction 1,
 *   cuCtxSetCurrent 5 here and 6 on a second thread,
 *   cuLaunchKernel 7 (through cuGetProcAddress, as cudart calls it),
 *   cuMemcpyHtoD_v2 3 (each sleeps FAKE_COPY_SLEEP_MS in the fake driver),
 *   cublasSgemm_v2 2 (each issues one cuMemsetD32_v2 inside cuBLAS),
 *   cuDriverGetVersion 4 (a query: handed out unwrapped, not counted).
 * Prints "copies_ms=T" (the wall time of the three copies) and
 * "ready PID", then waits for a line on stdin before it exits.
 *
 * usage: call_cycles_client */
#include <cublas_v2.h>
#include <cuda.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

typedef CUresult (*gpa_t)(const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *);
typedef CUresult (*launch_t)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                             CUstream, void **, void **);

static int bad;

static double now_ms(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

static void *other_thread(void *unused) {
  (void)unused;
  for (int i = 0; i < 6; i++) bad |= cuCtxSetCurrent((CUcontext)1);
  return NULL;
}

static void *resolve(const char *name) {
  void *fn = NULL;
  CUdriverProcAddressQueryResult status;
  if (cuGetProcAddress_v2(name, &fn, 13000, 0, &status) != CUDA_SUCCESS || !fn) {
    fprintf(stderr, "no %s\n", name);
    bad = 1;
  }
  return fn;
}

int main(void) {
  bad |= cuInit(0);
  static unsigned char fatbin[16 + 64];
  unsigned int magic = 0xBA55ED50;
  unsigned short version = 1, header = 16;
  unsigned long long payload = 64;
  memcpy(fatbin, &magic, 4);
  memcpy(fatbin + 4, &version, 2);
  memcpy(fatbin + 6, &header, 2);
  memcpy(fatbin + 8, &payload, 8);
  CUmodule module;
  CUfunction kernel;
  bad |= cuModuleLoadData(&module, fatbin);
  bad |= cuModuleGetFunction(&kernel, module, "vec_add");

  for (int i = 0; i < 5; i++) bad |= cuCtxSetCurrent((CUcontext)1);
  pthread_t t;
  pthread_create(&t, NULL, other_thread, NULL);
  pthread_join(t, NULL);

  launch_t launch = (launch_t)resolve("cuLaunchKernel");
  for (int i = 0; i < 7 && launch; i++) bad |= launch(kernel, 1, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL);

  static char host[256];
  double t0 = now_ms();
  for (int i = 0; i < 3; i++) bad |= cuMemcpyHtoD((CUdeviceptr)0x100000, host, sizeof(host));
  double copies_ms = now_ms() - t0;

  cublasHandle_t h = NULL;
  float alpha = 1, beta = 0;
  for (int i = 0; i < 2; i++)
    bad |= cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, 4, 4, 4, &alpha, (const float *)0xa00000, 4,
                       (const float *)0xb00000, 4, &beta, (float *)0xc00000, 4);

  CUresult (*driver_version)(int *) = (CUresult(*)(int *))resolve("cuDriverGetVersion");
  int v;
  for (int i = 0; i < 4 && driver_version; i++) bad |= driver_version(&v);

  printf("calls failed %d\n", bad != 0);
  printf("copies_ms=%.1f\n", copies_ms);
  printf("ready %d\n", (int)getpid());
  fflush(stdout);
  char line[8];
  if (!fgets(line, sizeof(line), stdin)) return bad != 0;
  return bad != 0;
}
