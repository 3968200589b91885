// Generic addresses: pointers taken from a struct, from device memory, from
// an array of pointers; a function called with both global and shared
// pointers (so its accesses are generic and isspacep decides).
struct Args {
  float* out;
  const float* in;
  int* counts[2];
  int n;
};

__device__ __noinline__ void scale_into(float* dst, const float* src, float k) { *dst = *src * k; }

__global__ void through_struct(Args a) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  __shared__ float tile[128];
  if (i < a.n) {
    scale_into(&tile[threadIdx.x % 128], &a.in[i], 2.0f);
    __syncthreads();
    scale_into(&a.out[i], &tile[(threadIdx.x + 1) % 128], 0.5f);
    a.counts[i & 1][i] = i;
  }
}

__global__ void through_device_pointer(float** table, int which, float v) {
  float* p = table[which];
  p[threadIdx.x] = v;
}

__global__ void pointer_chase(int** next, int steps) {
  int* p = next[0];
  for (int s = 0; s < steps; s++) {
    p = reinterpret_cast<int*>(next[*p]);
    *p += 1;
  }
}
