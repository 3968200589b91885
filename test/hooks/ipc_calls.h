/* The IPC calls of the test clients, taken through cuGetProcAddress as
 * cudart's cudaIpc* take them (phos substitutes its own), and their
 * allocations. */
#pragma once

#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>

typedef CUresult (*GetHandle)(CUipcMemHandle *, CUdeviceptr);
typedef CUresult (*OpenHandle)(CUdeviceptr *, CUipcMemHandle, unsigned int);
typedef CUresult (*CloseHandle)(CUdeviceptr);
typedef CUresult (*GetEventHandle)(CUipcEventHandle *, CUevent);
typedef CUresult (*OpenEventHandle)(CUevent *, CUipcEventHandle);

static inline void *proc(const char *name) {
  void *p = NULL;
  if (cuGetProcAddress(name, &p, 12000, 0, NULL) != CUDA_SUCCESS || !p) {
    fprintf(stderr, "cuGetProcAddress(%s) failed\n", name);
    exit(1);
  }
  return p;
}

/* cuMemAlloc of `bytes`, or the client exits 1 saying so. */
static inline CUdeviceptr alloc(size_t bytes) {
  CUdeviceptr p = 0;
  if (cuMemAlloc(&p, bytes) != CUDA_SUCCESS) {
    fprintf(stderr, "cuMemAlloc of %zu bytes failed\n", bytes);
    exit(1);
  }
  return p;
}
