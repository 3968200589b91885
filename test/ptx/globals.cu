// Module-scope variables: a kernel that writes a __device__ variable, reads
// __constant__ data, writes through a pointer kept in a __device__ variable.
__device__ int hits;
__device__ float history[64];
__device__ float* redirect;
__constant__ float weights[8];

__global__ void use_globals(const float* in, float* out, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) {
    float s = 0;
    for (int k = 0; k < 8; k++) s += weights[k] * in[(i + k) % n];
    out[i] = s;
    history[i % 64] = s;
    redirect[i] = s;
    atomicAdd(&hits, 1);
  }
}
