// Atomics and reductions: integer, float, double, half2, CAS, exchange,
// min/max, system and block scope, shared-memory atomics (not checked).
#include <cuda_fp16.h>

__global__ void counters(int* count, unsigned long long* total, float* fsum, double* dsum, __half2* hsum,
                         const float* in, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  __shared__ int local_count;
  if (threadIdx.x == 0) local_count = 0;
  __syncthreads();
  if (i < n) {
    atomicAdd(&local_count, 1);
    atomicAdd(fsum, in[i]);
    atomicAdd(dsum, static_cast<double>(in[i]));
    atomicAdd(hsum, __floats2half2_rn(in[i], 1.0f));
    atomicAdd(total, 1ull);
    atomicMax(count + 1, i);
    atomicMin(count + 2, i);
  }
  __syncthreads();
  if (threadIdx.x == 0) atomicAdd(count, local_count);
}

__global__ void lock_and_swap(int* lock, int* slots, int* old) {
  while (atomicCAS(lock, 0, 1) != 0) {
  }
  old[blockIdx.x] = atomicExch(&slots[blockIdx.x], static_cast<int>(threadIdx.x));
  atomicExch(lock, 0);
}

__global__ void scoped(int* a, unsigned int* b) {
  atomicAdd_system(a, 1);
  atomicAdd_block(a + 1, 1);
  atomicInc(b, 100u);
  atomicOr(b + 1, 1u << (threadIdx.x % 32));
}
