// Vector and scalar loads and stores of every width, cache-hinted ones, and
// read-only (ld.global.nc) loads.
#include <cuda_fp16.h>

__global__ void copy_float4(const float4* __restrict__ in, float4* __restrict__ out, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = __ldg(&in[i]);
}

__global__ void copy_float2_double2(const float2* a, float2* b, const double2* c, double2* d, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) {
    b[i] = a[i];
    d[i] = c[i];
  }
}

__global__ void widths(char* c, short* s, int* i, long long* l, int4* v, __half2* h, const int* in) {
  int t = threadIdx.x;
  int x = in[t];
  c[t] = static_cast<char>(x);
  s[t] = static_cast<short>(x);
  i[t] = x;
  l[t] = x;
  v[t] = make_int4(x, x + 1, x + 2, x + 3);
  h[t] = __floats2half2_rn(static_cast<float>(x), 1.0f);
}

__global__ void hinted(float* out, const float* in, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) {
    float v = __ldcs(in + i) + __ldlu(in + n - 1 - i);
    __stcs(out + i, v);
    __stwt(out + n + i, v);
  }
}

#if __CUDA_ARCH__ >= 1000
// 256-bit loads and stores (ld/st .v8.f32) on sm_100.
__global__ void wide_vectors(const float4* in, float4* out) {
  int i = threadIdx.x;
  float4 a = in[2 * i], b = in[2 * i + 1];
  out[2 * i] = a;
  out[2 * i + 1] = b;
}
#endif
