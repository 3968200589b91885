// Device functions that stay functions (__noinline__), with return values,
// recursion, templates; printf and assert (external calls that touch no
// buffer); a call through a function pointer (the twin is incomplete).
#include <cstdio>
#include <cassert>

template <typename T>
__device__ __noinline__ T accumulate(T* acc, T v) {
  T old = *acc;
  *acc = old + v;
  return old;
}

__device__ __noinline__ int depth(int* trace, int n) {
  trace[n] = n;
  return n == 0 ? 0 : 1 + depth(trace, n - 1);
}

__device__ __noinline__ void write_both(float* a, double* b, int i) {
  a[i] = 1.0f;
  b[i] = accumulate(b, 2.0);
}

template <typename T, int N>
__global__ void templated(T* data, int* trace) {
  T s = 0;
#pragma unroll
  for (int k = 0; k < N; k++) s += data[threadIdx.x * N + k];
  accumulate(data, s);
  if (threadIdx.x == 0) trace[0] = depth(trace + 1, 4);
}
template __global__ void templated<float, 4>(float*, int*);
template __global__ void templated<int, 2>(int*, int*);
template __global__ void templated<double, 8>(double*, int*);

__global__ void caller(float* a, double* b, int n) {
  if (threadIdx.x < n) write_both(a, b, threadIdx.x);
  if (threadIdx.x == 0) printf("caller: n=%d\n", n);
  assert(n >= 0);
}

typedef void (*writer_t)(float*, int);
__device__ __noinline__ void write_one(float* p, int i) { p[i] = 1.0f; }
__device__ __noinline__ void write_two(float* p, int i) { p[i] = 2.0f; }
__device__ writer_t writers[2] = {write_one, write_two};

__global__ void indirect(float* p, int which) { writers[which & 1](p, threadIdx.x); }
