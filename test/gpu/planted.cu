// Planted mis-speculation, for the validator (PHOS_VALIDATE=1): kernels that
// write where their arguments do not say.
//   through_device_pointer(float** table, which, v): writes table[which][i],
//     a buffer only device memory names (speculation sees `table`);
//   through_struct_in_memory(const Hidden* h, v): writes h->out[i], a field
//     of a struct in device memory behind a pointer to const (read only);
//   through_global(v): writes g_redirect[i], a pointer kept in a __device__
//     variable (a twin module has its own copy: not validated by twins);
//   honest(const float* in, float* out): writes out, as speculated.
// Prints the victim buffer's address and a checksum of the results.
#include <cstdio>

#include "gpu_check.h"

struct Hidden {
  float* out;
};
__device__ float* g_redirect;

__global__ void through_device_pointer(float** table, int which, float v) { table[which][threadIdx.x] = v; }
__global__ void through_struct_in_memory(const Hidden* h, float v) { h->out[threadIdx.x] += v; }
__global__ void through_global(float v) { g_redirect[threadIdx.x] += v; }
__global__ void honest(const float* in, float* out) { out[threadIdx.x] = 2 * in[threadIdx.x]; }

int main() {
  constexpr int kN = 64;
  float *a, *victim, **table;
  Hidden* hidden;
  CHECK_CUDA(cudaMalloc(&a, kN * sizeof(float)));
  CHECK_CUDA(cudaMalloc(&victim, kN * sizeof(float)));
  CHECK_CUDA(cudaMalloc(&table, 2 * sizeof(float*)));
  CHECK_CUDA(cudaMalloc(&hidden, sizeof(Hidden)));
  CHECK_CUDA(cudaMemset(a, 0, kN * sizeof(float)));
  CHECK_CUDA(cudaMemset(victim, 0, kN * sizeof(float)));
  float* pointers[2] = {a, victim};
  CHECK_CUDA(cudaMemcpy(table, pointers, sizeof(pointers), cudaMemcpyHostToDevice));
  Hidden h{victim};
  CHECK_CUDA(cudaMemcpy(hidden, &h, sizeof(h), cudaMemcpyHostToDevice));
  CHECK_CUDA(cudaMemcpyToSymbol(g_redirect, &victim, sizeof(victim)));
  std::printf("victim 0x%llx %zu\n", (unsigned long long)victim, kN * sizeof(float));

  through_device_pointer<<<1, kN>>>(table, 1, 1.0f);
  through_struct_in_memory<<<1, kN>>>(hidden, 2.0f);
  through_global<<<1, kN>>>(4.0f);
  honest<<<1, kN>>>(victim, a);
  CHECK_CUDA(cudaDeviceSynchronize());
  float out[2][kN];
  CHECK_CUDA(cudaMemcpy(out[0], a, sizeof(out[0]), cudaMemcpyDeviceToHost));
  CHECK_CUDA(cudaMemcpy(out[1], victim, sizeof(out[1]), cudaMemcpyDeviceToHost));
  double sum = 0;
  for (int i = 0; i < kN; i++) sum += out[0][i] + 3 * out[1][i];
  std::printf("checksum %.1f\n", sum);  // victim 7 each, a 14 each: 64 * (14 + 21)
  return 0;
}
