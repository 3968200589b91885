// Cost of the hooks, run with and without libphos.so (suite.sh bench; its
// "cycles" run has the call counter on, PHOS_CALL_CYCLES=on: the counter's
// own cost per call is that run's difference to "phos"). Prints
// "bench NAME MICROSECONDS" lines:
//   launch_*:        host time to enqueue one kernel, in bursts of 256 into
//                    an idle stream (so the GPU's queue never pushes back)
//   driver_call:     one cheap driver call (cuCtxSetCurrent of the current
//                    context): the bare cost of the gate wrapper that every
//                    driver function but the queries gets
//   query_call:      one query (cuCtxGetDevice, which PyTorch calls thousands
//                    of times a step): libphos.so hands these out unwrapped
//   memset_async:    one cuMemsetD32Async of 256 bytes, in bursts like the
//                    launches: with PHOS_RECORD_LAUNCHES=1, what recording a
//                    set's range costs
//   malloc_free_N:   one cudaMalloc + cudaFree of N bytes
//   launch_ptr8_driver: a kernel with 8 pointer parameters (4 to const) into
//                    8 of 1000 live allocations: with PHOS_SPECULATE=1, what
//                    speculating a launch's read and write sets costs
//   first_launch:    the program's first launch (natively: the context's and
//                    the module's lazy loading), and first_launch_second:
//                    the first launch of another kernel of the same module
//                    (with phos: its analysis, twin or patch) — the hidden
//                    stalls a feature adds once per kernel
//   launch_worst:    the slowest of 20000 launches of the ptr8 kernel, each
//                    timed alone (after its first)
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>

#include "gpu_check.h"

__global__ void empty_kernel(int) {}
__global__ void ptr8_kernel(const float*, const float*, const float*, const float*, float*, float*, float*, float*) {}
__global__ void first_kernel(float* out, const float* in, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = in[i] * 2.0f;
}

namespace {
using Clock = std::chrono::steady_clock;
double us(Clock::duration d) { return std::chrono::duration<double, std::micro>(d).count(); }

template <class Launch>
double per_launch(cudaStream_t s, Launch&& launch) {
  constexpr int kBurst = 256, kBursts = 400;
  Clock::duration total{};
  for (int b = 0; b < kBursts; b++) {
    CHECK_CUDA(cudaStreamSynchronize(s));
    auto t0 = Clock::now();
    for (int i = 0; i < kBurst; i++) launch(i);
    total += Clock::now() - t0;
  }
  CHECK_CUDA(cudaStreamSynchronize(s));
  return us(total) / (kBurst * kBursts);
}
}  // namespace

int main() {
  cudaStream_t s;
  CHECK_CUDA(cudaStreamCreate(&s));
  {
    float* buf = nullptr;
    CHECK_CUDA(cudaMalloc(&buf, 2 << 20));
    CHECK_CUDA(cudaStreamSynchronize(s));
    auto t0 = Clock::now();
    empty_kernel<<<1, 32, 0, s>>>(0);
    std::printf("bench first_launch_us %.1f\n", us(Clock::now() - t0));
    CHECK_CUDA(cudaStreamSynchronize(s));
    t0 = Clock::now();
    first_kernel<<<1024, 256, 0, s>>>(buf + (1 << 18), buf, 1 << 18);
    std::printf("bench first_launch_second_us %.1f\n", us(Clock::now() - t0));
    CHECK_CUDA(cudaStreamSynchronize(s));
    CHECK_CUDA(cudaFree(buf));
  }
  for (int warm = 0; warm < 1000; warm++) empty_kernel<<<1, 32, 0, s>>>(warm);
  CHECK_CUDA(cudaStreamSynchronize(s));

  std::printf("bench launch_runtime_us %.4f\n", per_launch(s, [&](int i) { empty_kernel<<<1, 32, 0, s>>>(i); }));

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
  std::printf("bench launch_driver_us %.4f\n", per_launch(s, [&](int) {
    launch(reinterpret_cast<CUfunction>(rf), 1, 1, 1, 32, 1, 1, 0, s, params, nullptr);
  }));

  {
    // 1000 live allocations of mixed sizes, 8 of them passed to the kernel.
    std::vector<void*> live(1000);
    for (size_t i = 0; i < live.size(); i++) CHECK_CUDA(cudaMalloc(&live[i], size_t(4096) << (i % 8)));
    cudaFunction_t pf;
    CHECK_CUDA(cudaGetFuncBySymbol(&pf, reinterpret_cast<const void*>(ptr8_kernel)));
    void* ptrs[8];
    for (int i = 0; i < 8; i++) ptrs[i] = static_cast<char*>(live[i * 97]) + 64;
    void* ptr_params[8];
    for (int i = 0; i < 8; i++) ptr_params[i] = &ptrs[i];
    std::printf("bench launch_ptr8_driver_us %.4f\n", per_launch(s, [&](int) {
      launch(reinterpret_cast<CUfunction>(pf), 1, 1, 1, 32, 1, 1, 0, s, ptr_params, nullptr);
    }));
    Clock::duration worst{};
    for (int i = 0; i < 20000; i++) {
      if (i % 256 == 0) CHECK_CUDA(cudaStreamSynchronize(s));
      auto t0 = Clock::now();
      launch(reinterpret_cast<CUfunction>(pf), 1, 1, 1, 32, 1, 1, 0, s, ptr_params, nullptr);
      worst = std::max(worst, Clock::now() - t0);
    }
    CHECK_CUDA(cudaStreamSynchronize(s));
    std::printf("bench launch_worst_us %.2f\n", us(worst));
    for (void* p : live) CHECK_CUDA(cudaFree(p));
  }

  constexpr long kCalls = 2000000;
  using SetCurrent = CUresult (*)(CUcontext);
  CHECK_CUDA(cudaGetDriverEntryPointByVersion("cuCtxSetCurrent", &fn, 12000, cudaEnableDefault, &q));
  auto set_current = reinterpret_cast<SetCurrent>(fn);
  using GetCurrent = CUresult (*)(CUcontext*);
  void* get_current = nullptr;
  CHECK_CUDA(cudaGetDriverEntryPointByVersion("cuCtxGetCurrent", &get_current, 12000, cudaEnableDefault, &q));
  CUcontext ctx = nullptr;
  reinterpret_cast<GetCurrent>(get_current)(&ctx);
  auto t0 = Clock::now();
  for (long i = 0; i < kCalls; i++) set_current(ctx);
  std::printf("bench driver_call_us %.4f\n", us(Clock::now() - t0) / kCalls);

  using GetDevice = CUresult (*)(CUdevice*);
  CHECK_CUDA(cudaGetDriverEntryPointByVersion("cuCtxGetDevice", &fn, 12000, cudaEnableDefault, &q));
  auto get_device = reinterpret_cast<GetDevice>(fn);
  CUdevice dev;
  t0 = Clock::now();
  for (long i = 0; i < kCalls; i++) get_device(&dev);
  std::printf("bench query_call_us %.4f\n", us(Clock::now() - t0) / kCalls);

  using MemsetAsync = CUresult (*)(CUdeviceptr, unsigned, size_t, CUstream);
  CHECK_CUDA(cudaGetDriverEntryPointByVersion("cuMemsetD32Async", &fn, 12000, cudaEnableDefault, &q));
  auto memset_async = reinterpret_cast<MemsetAsync>(fn);
  void* small = nullptr;
  CHECK_CUDA(cudaMalloc(&small, 256));
  std::printf("bench memset_async_us %.4f\n", per_launch(s, [&](int i) {
    memset_async(reinterpret_cast<CUdeviceptr>(small), unsigned(i), 64, s);
  }));
  CHECK_CUDA(cudaFree(small));

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
    std::printf("bench malloc_free_%zu_us %.3f\n", size, us(Clock::now() - t0) / n);
  }
  return 0;
}
