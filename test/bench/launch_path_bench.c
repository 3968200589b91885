/* phos-launch-path-bench: what libphos.so adds to each driver call, on the
 * CPU, against the fake libcuda.so.1 of test/hooks (whose functions return at
 * once, so that only phos's part is left to measure). A measurement to read,
 * not a test: launch_path.sh runs it natively and under libphos.so with
 * nothing on, recording and speculating, and prints the differences.
 *
 * Prints "bench NAME NANOSECONDS" lines:
 *   launch:          cuLaunchKernel (obtained through cuGetProcAddress, as
 *                    cudart does) of a kernel with 8 pointer parameters (4 to
 *                    const) into 8 of 1000 live allocations
 *   launch_2threads: the same from two threads at once, per launch and thread
 *   gated_call:      cuCtxSetCurrent, a driver function that passes the gate
 *   query_call:      cuDriverGetVersion, a query (query_functions.txt)
 *   memcpy_dtod:     cuMemcpyDtoD between two of the allocations
 *   event_record:    cuEventRecord (through cuGetProcAddress) of a plain event,
 *                    the process having no interprocess event
 *   event_record_ipc_live: the same while the process has one (phos's
 *                    lookup of the interprocess events, hooks/ipc.cc)
 *   nccl_allreduce:  ncclAllReduce (test/hooks' fake libnccl) on a
 *                    communicator of one rank: phos's translation of the
 *                    handle, its ticket and its call count
 *   nccl_group_allreduce: the same inside ncclGroupStart/End
 *
 * With PHOS_BENCH_GO=FILE, the first launch done, it prints "ready" and
 * measures once FILE exists (window_launch.sh opens a copy window first). */
#include <cuda.h>
#include <nccl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define ALLOCATIONS 1000
#define CALLS 2000000L

typedef CUresult (*launch_t)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                             CUstream, void **, void **);
typedef CUresult (*gpa_t)(const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *);

static launch_t launch;
static CUfunction kernel;
static CUdeviceptr args[8];

static double now_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1e9 + t.tv_nsec;
}

static void *launches(void *unused) {
  (void)unused;
  cuCtxSetCurrent((CUcontext)1);
  void *params[8];
  for (int i = 0; i < 8; i++) params[i] = &args[i];
  for (long i = 0; i < CALLS; i++) launch(kernel, 1, 1, 1, 32, 1, 1, 0, NULL, params, NULL);
  return NULL;
}

static void *resolve(gpa_t gpa, const char *name) {
  void *fn = NULL;
  CUdriverProcAddressQueryResult status;
  if (gpa(name, &fn, 13000, 0, &status) != CUDA_SUCCESS || !fn) {
    fprintf(stderr, "no %s\n", name);
    exit(2);
  }
  return fn;
}

int main(void) {
  cuCtxSetCurrent((CUcontext)1);
  gpa_t gpa = (gpa_t)cuGetProcAddress_v2;
  launch = (launch_t)resolve(gpa, "cuLaunchKernel");

  /* libphos.so allocates (VMM memory, over the fake's); the fake alone
   * does not, and the addresses then only need to look like pointers. */
  static CUdeviceptr live[ALLOCATIONS];
  for (int i = 0; i < ALLOCATIONS; i++)
    if (cuMemAlloc(&live[i], (size_t)4096 << (i % 8)) != CUDA_SUCCESS) live[i] = 0x7f0000000000ull + ((CUdeviceptr)i << 24);
  for (int i = 0; i < 8; i++) args[i] = live[i * 97] + 64;

  static unsigned char header[16] = {0x50, 0xed, 0x55, 0xba, 1, 0, 16, 0};
  CUmodule module;
  if (cuModuleLoadData(&module, header) != CUDA_SUCCESS ||
      cuModuleGetFunction(&kernel, module, "_Z10bench_ptr8PKfS0_S0_S0_PfS1_S1_S1_") != CUDA_SUCCESS) {
    fprintf(stderr, "no kernel\n");
    return 2;
  }

  launches(NULL);  /* warm-up: the kernel's first launch is analysed */
  const char *go = getenv("PHOS_BENCH_GO");
  if (go) {
    printf("ready\n");
    fflush(stdout);
    while (access(go, F_OK) != 0) usleep(1000);
  }
  double t0 = now_ns();
  launches(NULL);
  printf("bench launch %.1f\n", (now_ns() - t0) / CALLS);

  pthread_t threads[2];
  t0 = now_ns();
  for (int i = 0; i < 2; i++) pthread_create(&threads[i], NULL, launches, NULL);
  for (int i = 0; i < 2; i++) pthread_join(threads[i], NULL);
  printf("bench launch_2threads %.1f\n", (now_ns() - t0) / CALLS);

  CUresult (*set_current)(CUcontext) = (CUresult(*)(CUcontext))resolve(gpa, "cuCtxSetCurrent");
  t0 = now_ns();
  for (long i = 0; i < CALLS; i++) set_current((CUcontext)1);
  printf("bench gated_call %.1f\n", (now_ns() - t0) / CALLS);

  CUresult (*version)(int *) = (CUresult(*)(int *))resolve(gpa, "cuDriverGetVersion");
  int v;
  t0 = now_ns();
  for (long i = 0; i < CALLS; i++) version(&v);
  printf("bench query_call %.1f\n", (now_ns() - t0) / CALLS);

  CUresult (*dtod)(CUdeviceptr, CUdeviceptr, size_t) =
      (CUresult(*)(CUdeviceptr, CUdeviceptr, size_t))resolve(gpa, "cuMemcpyDtoD");
  t0 = now_ns();
  for (long i = 0; i < CALLS / 4; i++) dtod(args[4], args[0], 256);
  printf("bench memcpy_dtod %.1f\n", (now_ns() - t0) / (CALLS / 4));

  CUresult (*record)(CUevent, CUstream) = (CUresult(*)(CUevent, CUstream))resolve(gpa, "cuEventRecord");
  CUevent plain, shared;
  if (cuEventCreate(&plain, CU_EVENT_DISABLE_TIMING) != CUDA_SUCCESS) return 2;
  t0 = now_ns();
  for (long i = 0; i < CALLS / 4; i++) record(plain, NULL);
  printf("bench event_record %.1f\n", (now_ns() - t0) / (CALLS / 4));
  if (cuEventCreate(&shared, CU_EVENT_INTERPROCESS | CU_EVENT_DISABLE_TIMING) != CUDA_SUCCESS) return 2;
  t0 = now_ns();
  for (long i = 0; i < CALLS / 4; i++) record(plain, NULL);
  printf("bench event_record_ipc_live %.1f\n", (now_ns() - t0) / (CALLS / 4));

  ncclUniqueId id;
  ncclComm_t comm;
  if (ncclGetUniqueId(&id) != ncclSuccess || ncclCommInitRank(&comm, 1, id, 0) != ncclSuccess) {
    fprintf(stderr, "no communicator\n");
    return 2;
  }
  t0 = now_ns();
  for (long i = 0; i < CALLS / 4; i++)
    ncclAllReduce((void *)args[0], (void *)args[1], 16, ncclFloat32, ncclSum, comm, NULL);
  printf("bench nccl_allreduce %.1f\n", (now_ns() - t0) / (CALLS / 4));
  t0 = now_ns();
  for (long i = 0; i < CALLS / 4; i++) {
    ncclGroupStart();
    ncclAllReduce((void *)args[0], (void *)args[1], 16, ncclFloat32, ncclSum, comm, NULL);
    ncclGroupEnd();
  }
  printf("bench nccl_group_allreduce %.1f\n", (now_ns() - t0) / (CALLS / 4));
  return 0;
}
