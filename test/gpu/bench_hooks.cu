// Cost of the hooks, run with and without libphos.so: time per kernel launch
// (runtime and driver API), per cudaMalloc+cudaFree pair at several sizes.
// Prints "bench NAME VALUE_US" lines.
#include <chrono>
#include <cstdio>

#include "gpu_check.h"

__global__ void empty_kernel(int) {}

namespace {
using Clock = std::chrono::steady_clock;
double us_per(Clock::time_point t0, long n) {
  return std::chrono::duration<double, std::micro>(Clock::now() - t0).count() / double(n);
}
}  // namespace

int main() {
  cudaStream_t s;
  CHECK_CUDA(cudaStreamCreate(&s));
  constexpr long kLaunches = 200000;
  for (int warm = 0; warm < 1000; warm++) empty_kernel<<<1, 32, 0, s>>>(warm);
  CHECK_CUDA(cudaStreamSynchronize(s));

  auto t0 = Clock::now();
  for (long i = 0; i < kLaunches; i++) empty_kernel<<<1, 32, 0, s>>>(int(i));
  double enqueue = us_per(t0, kLaunches);
  CHECK_CUDA(cudaStreamSynchronize(s));
  std::printf("bench launch_runtime_us %.4f\n", enqueue);

  // The driver API entry point, as a program or library gets it.
  using Launch = CUresult (*)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                              CUstream, void**, void**);
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult q;
  CHECK_CUDA(cudaGetDriverEntryPointByVersion("cuLaunchKernel", &fn, 12000, cudaEnableDefault, &q));
  cudaFunction_t rf;
  CHECK_CUDA(cudaGetFuncBySymbol(&rf, reinterpret_cast<const void*>(empty_kernel)));
  int arg = 0;
  void* params[] = {&arg};
  auto launch = reinterpret_cast<Launch>(fn);
  t0 = Clock::now();
  for (long i = 0; i < kLaunches; i++) launch(reinterpret_cast<CUfunction>(rf), 1, 1, 1, 32, 1, 1, 0, s, params, nullptr);
  double driver = us_per(t0, kLaunches);
  CHECK_CUDA(cudaStreamSynchronize(s));
  std::printf("bench launch_driver_us %.4f\n", driver);

  for (size_t size : {size_t(256), size_t(64) << 10, size_t(1) << 20, size_t(64) << 20}) {
    long n = size >= (64u << 20) ? 500 : 5000;
    void* p;
    CHECK_CUDA(cudaMalloc(&p, size));
    CHECK_CUDA(cudaFree(p));
    t0 = Clock::now();
    for (long i = 0; i < n; i++) {
      CHECK_CUDA(cudaMalloc(&p, size));
      CHECK_CUDA(cudaFree(p));
    }
    std::printf("bench malloc_free_%zu_us %.3f\n", size, us_per(t0, n));
  }
  return 0;
}
