// Several GPUs in one process: buffers and kernels on each device, a peer
// copy between them, work from one host thread per device.
// usage: multi_gpu [--ready FILE]: with --ready, the file is written once all
// devices hold their data, and the program waits 2 s before using it (the
// round-trip test closes the gate and remaps meanwhile).
#include <chrono>
#include <cstdint>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "gpu_check.h"

__global__ void fill(uint32_t* p, size_t n, uint32_t seed) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    p[i] = uint32_t(i) * 2654435761u ^ seed;
}
__global__ void sum(const uint32_t* p, size_t n, unsigned long long* out) {
  unsigned long long s = 0;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) s += p[i];
  atomicAdd(out, s);
}

int main(int argc, char** argv) {
  std::string ready = argc > 2 && !std::strcmp(argv[1], "--ready") ? argv[2] : "";
  int devices = 0;
  CHECK_CUDA(cudaGetDeviceCount(&devices));
  if (devices < 2) {
    std::printf("skip: %d device(s)\n", devices);
    return 77;
  }
  constexpr size_t kWords = 64u << 20;
  std::vector<uint32_t*> bufs(devices);
  std::vector<unsigned long long*> acc(devices);
  std::vector<std::thread> threads;
  for (int d = 0; d < devices; d++)
    threads.emplace_back([&, d] {
      CHECK_CUDA(cudaSetDevice(d));
      CHECK_CUDA(cudaMalloc(&bufs[d], kWords * 4));
      CHECK_CUDA(cudaMalloc(&acc[d], sizeof(unsigned long long)));
      CHECK_CUDA(cudaMemset(acc[d], 0, sizeof(unsigned long long)));
      fill<<<256, 256>>>(bufs[d], kWords, 100 + d);
      CHECK_CUDA(cudaDeviceSynchronize());
    });
  for (auto& t : threads) t.join();
  if (!ready.empty()) {
    if (FILE* f = std::fopen(ready.c_str(), "w")) std::fclose(f);
    std::this_thread::sleep_for(std::chrono::seconds(2));
  }
  // Device 0's data to device 1, summed there.
  CHECK_CUDA(cudaMemcpyPeer(bufs[1], 1, bufs[0], 0, kWords * 4));
  unsigned long long total = 0;
  for (int d = 0; d < devices; d++) {
    CHECK_CUDA(cudaSetDevice(d));
    sum<<<256, 256>>>(bufs[d], kWords, acc[d]);
    unsigned long long v = 0;
    CHECK_CUDA(cudaMemcpy(&v, acc[d], sizeof(v), cudaMemcpyDeviceToHost));
    total += v * (d + 1);
    CHECK_CUDA(cudaFree(bufs[d]));
    CHECK_CUDA(cudaFree(acc[d]));
  }
  std::printf("checksum %016llx devices=%d\n", total, devices);
  return 0;
}
