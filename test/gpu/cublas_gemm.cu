// cuBLAS in the GPU suite: SGEMM, DGEMM and a strided batched GEMM; prints a
// checksum of the results and CUPTI's count of the kernels the GPU ran
// (cuBLAS reaches the driver by dlsym, so this checks that path).
#include <cublas_v2.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "gpu_check.h"

#define CHECK_CUBLAS(x)                                                             \
  do {                                                                              \
    cublasStatus_t s_ = (x);                                                        \
    if (s_ != CUBLAS_STATUS_SUCCESS) {                                              \
      std::fprintf(stderr, "%s:%d: %s: cuBLAS status %d\n", __FILE__, __LINE__, #x, int(s_)); \
      std::exit(1);                                                                 \
    }                                                                               \
  } while (0)

namespace {
long g_launches = 0;

template <class T>
__global__ void fill(T* p, size_t n, uint32_t seed) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    uint32_t x = uint32_t(i) * 2654435761u ^ seed;
    p[i] = T((x >> 8) % 1000) / T(1000) - T(0.5);
  }
}

template <class T>
T* device_buffer(size_t n, uint32_t seed) {
  T* p;
  CHECK_CUDA(cudaMalloc(&p, n * sizeof(T)));
  fill<<<128, 256>>>(p, n, seed);
  CHECK_CUDA(cudaGetLastError());
  g_launches++;
  return p;
}

template <class T>
double host_sum(const T* d, size_t n) {
  std::vector<T> h(n);
  CHECK_CUDA(cudaMemcpy(h.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost));
  double s = 0;
  for (size_t i = 0; i < n; i++) s += double(h[i]) * double((i % 7) + 1);
  return s;
}
}  // namespace

int main() {
  CHECK_CUDA(cudaFree(nullptr));
  gpu_check::start_kernel_count();
  cublasHandle_t h;
  CHECK_CUBLAS(cublasCreate(&h));
  const int n = 1024, b = 16, m = 256;
  float *A = device_buffer<float>(n * n, 1), *B = device_buffer<float>(n * n, 2), *C = device_buffer<float>(n * n, 3);
  double *dA = device_buffer<double>(n * n, 4), *dB = device_buffer<double>(n * n, 5), *dC = device_buffer<double>(n * n, 6);
  float *bA = device_buffer<float>(size_t(b) * m * m, 7), *bB = device_buffer<float>(size_t(b) * m * m, 8),
        *bC = device_buffer<float>(size_t(b) * m * m, 9);
  const float one = 1.f, half = 0.5f;
  const double done = 1.0, dzero = 0.0;
  for (int rep = 0; rep < 5; rep++) {
    CHECK_CUBLAS(cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_T, n, n, n, &one, A, n, B, n, &half, C, n));
    CHECK_CUBLAS(cublasDgemm(h, CUBLAS_OP_T, CUBLAS_OP_N, n, n, n, &done, dA, n, dB, n, &dzero, dC, n));
    CHECK_CUBLAS(cublasSgemmStridedBatched(h, CUBLAS_OP_N, CUBLAS_OP_N, m, m, m, &one, bA, m, m * m, bB, m,
                                           m * m, &half, bC, m, m * m, b));
  }
  double s = host_sum(C, size_t(n) * n) + host_sum(dC, size_t(n) * n) + host_sum(bC, size_t(b) * m * m);
  unsigned long long kernels = gpu_check::kernel_count();
  CHECK_CUBLAS(cublasDestroy(h));
  uint64_t bits;
  std::memcpy(&bits, &s, sizeof(bits));
  std::printf("checksum %016llx (%.6f)\n", (unsigned long long)bits, s);
  std::printf("counts own_launches=%ld cupti_kernels=%llu\n", g_launches, kernels);
  return 0;
}
