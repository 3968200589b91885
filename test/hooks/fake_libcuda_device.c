/* The fake libcuda's device as criu's plugin sees it (FAKE_CUDA_MEMORY=1,
 * fake_libcuda_vmm.c): one 16 GiB GPU (FAKE_CUDA_DEVICES of them, for a
 * process on several GPUs) with half of it free, peer access,
 * (FAKE_CUDA_FREE_MIB: that much free instead, a fuller GPU),
 * pinned host memory as it is, and no driver checkpoint: the plugin finds
 * no CUDA state of the driver's in the process and skips its lock,
 * checkpoint and restore, as for a process that never used the GPU. */
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>

CUresult cuDeviceGetCount(int *n) {
  const char *v = getenv("FAKE_CUDA_DEVICES");
  *n = v && atoi(v) > 1 ? atoi(v) : 1;
  return CUDA_SUCCESS;
}
CUresult cuDeviceGetName(char *name, int len, CUdevice d) {
  (void)d;  /* one model on every device, as a migration between them needs */
  snprintf(name, (size_t)len, "Fake GPU");
  return CUDA_SUCCESS;
}
CUresult cuDeviceTotalMem(size_t *bytes, CUdevice d) { (void)d; *bytes = 16ull << 30; return CUDA_SUCCESS; }
CUresult cuMemGetInfo(size_t *free_bytes, size_t *total) {
  const char *v = getenv("FAKE_CUDA_FREE_MIB");
  *free_bytes = v && atoll(v) > 0 ? (size_t)atoll(v) << 20 : 8ull << 30;
  *total = 16ull << 30;
  return CUDA_SUCCESS;
}
CUresult cuDeviceCanAccessPeer(int *can, CUdevice a, CUdevice b) { (void)a; (void)b; *can = 1; return CUDA_SUCCESS; }
CUresult cuMemHostRegister(void *p, size_t bytes, unsigned int flags) { (void)p; (void)bytes; (void)flags; return CUDA_SUCCESS; }
CUresult cuMemHostUnregister(void *p) { (void)p; return CUDA_SUCCESS; }

/* FAKE_CUDA_CHECKPOINT_NEEDS_INIT=1: the checkpoint calls refuse a caller
 * that has not called cuInit (CUDA_ERROR_NOT_INITIALIZED), as a driver may;
 * driver 580 takes them without it. Each such refusal is logged to
 * FAKE_CUDA_LOG ("mark checkpoint call before cuInit: NAME"). */
extern int fake_cuda_initialized;
void fake_mark(const char *what);
static CUresult checkpoint_call(const char *name) {
  if (getenv("FAKE_CUDA_CHECKPOINT_NEEDS_INIT") && !fake_cuda_initialized) {
    char what[96];
    snprintf(what, sizeof(what), "checkpoint call before cuInit: %s", name);
    fake_mark(what);
    return CUDA_ERROR_NOT_INITIALIZED;
  }
  return CUDA_ERROR_NOT_SUPPORTED;
}
CUresult cuCheckpointProcessGetState(int pid, CUprocessState *state) {
  (void)pid; (void)state;
  return checkpoint_call("cuCheckpointProcessGetState");
}
CUresult cuCheckpointProcessGetRestoreThreadId(int pid, int *tid) {
  (void)pid; (void)tid;
  return checkpoint_call("cuCheckpointProcessGetRestoreThreadId");
}
CUresult cuCheckpointProcessLock(int pid, CUcheckpointLockArgs *args) {
  (void)pid; (void)args;
  return checkpoint_call("cuCheckpointProcessLock");
}
CUresult cuCheckpointProcessCheckpoint(int pid, CUcheckpointCheckpointArgs *args) {
  (void)pid; (void)args;
  return checkpoint_call("cuCheckpointProcessCheckpoint");
}
CUresult cuCheckpointProcessRestore(int pid, CUcheckpointRestoreArgs *args) {
  (void)pid; (void)args;
  return checkpoint_call("cuCheckpointProcessRestore");
}
CUresult cuCheckpointProcessUnlock(int pid, CUcheckpointUnlockArgs *args) {
  (void)pid; (void)args;
  return checkpoint_call("cuCheckpointProcessUnlock");
}

/* The buffer the driver's checkpoint copies a process's device state into:
 * one private anonymous mapping, made by libcuda with MAP_POPULATE (as
 * driver 580 does; test/gpu/bench_driver_state.sh). driver_buffer_client
 * asks for one as the checkpoint would. */
void *fake_cuda_checkpoint_buffer(size_t bytes) {
  void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
  return p == MAP_FAILED ? NULL : p;
}
