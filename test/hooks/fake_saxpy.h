/* The fake driver's saxpy kernel (fake_libcuda_module.c), as the test
 * clients load it: a module from a fatbin header the fake accepts. */
#pragma once

#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>

/* saxpy(const float* x, float* y, float alpha, int n), or the client exits 1
 * saying what failed. */
static inline CUfunction fake_saxpy(void) {
  static unsigned char header[16] = {0x50, 0xed, 0x55, 0xba, 1, 0, 16, 0};
  CUmodule module;
  CUfunction saxpy;
  if (cuModuleLoadData(&module, header) != CUDA_SUCCESS ||
      cuModuleGetFunction(&saxpy, module, "_Z5saxpyPKfPffi") != CUDA_SUCCESS) {
    fprintf(stderr, "loading the fake's saxpy failed\n");
    exit(1);
  }
  return saxpy;
}
