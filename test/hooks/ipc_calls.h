/* The IPC calls of the test clients, taken through cuGetProcAddress as
 * cudart's cudaIpc* take them (phos substitutes its own). */
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
