// Lambdas passed by value to template kernels: the closure is a record whose
// captures clang lays out in the order nvcc does. An extended __host__
// __device__ lambda with captures carries one more pointer on the device
// side (nvcc's host-lambda handle); records holding one grow with it.
#include <cuda_runtime.h>

#include "common.cuh"

template <typename F>
__global__ void apply(F f, float* out, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = f(i);
}

template <typename F>
struct Wrap {
  char tag;
  F f;
  float* out;
};
template <typename F>
__global__ void wrapped(Wrap<F> w) { *w.out = w.f(1); }

struct Functor {
  const float* in;
  float s;
  __device__ float operator()(int i) const { return in[i] * s; }
};
template __global__ void apply<Functor>(Functor, float*, int);

void launch_lambdas(float* out, const float* in, float* tmp, float4 v, float scale, int n) {
  auto device_only = [=] __device__(int i) { return in[i] * scale; };
  apply<<<1, 32>>>(device_only, out, n);
  auto both = [=] __host__ __device__(int i) { tmp[i] = scale; return in[i] + tmp[i]; };
  apply<<<1, 32>>>(both, out, n);
  auto nothing = [] __device__(int i) { return float(i); };
  apply<<<1, 32>>>(nothing, out, n);
  auto both_nothing = [] __host__ __device__(int i) { return float(i); };
  apply<<<1, 32>>>(both_nothing, out, n);
  auto both_vector = [=] __host__ __device__(int i) { return v.x + scale + in[i]; };
  apply<<<1, 32>>>(both_vector, out, n);
  wrapped<<<1, 1>>>(Wrap<decltype(device_only)>{1, device_only, out});
  wrapped<<<1, 1>>>(Wrap<decltype(both)>{2, both, out});
  zero<<<1, 1>>>(reinterpret_cast<int*>(out), 4u);  // as kernels.cu does
}
