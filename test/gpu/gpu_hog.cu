// Another GPU process for the checkpoint tests: it takes device memory,
// either a given amount or all but a given amount of what is free, writes
// "held H MiB, free F MiB" to READY and then keeps working on that memory
// (a kernel on the first MiB of each block every 50 ms, checked) until it is killed. It exits 3 if its
// memory ever reads back wrong.
//
// usage: gpu_hog READY --hold MIB | --leave MIB
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "gpu_check.h"

__global__ void bump(uint32_t* p, size_t n, uint32_t expect, unsigned long long* bad) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    if (p[i] != expect) atomicAdd(bad, 1ull);
    p[i] = expect + 1;
  }
}

int main(int argc, char** argv) {
  if (argc != 4 || (std::strcmp(argv[2], "--hold") && std::strcmp(argv[2], "--leave"))) {
    std::fprintf(stderr, "usage: %s READY --hold MIB | --leave MIB\n", argv[0]);
    return 2;
  }
  const bool leave = !std::strcmp(argv[2], "--leave");
  const size_t mib = size_t(std::atoll(argv[3])) << 20;
  CHECK_CUDA(cudaFree(nullptr));
  unsigned long long* bad;
  CHECK_CUDA(cudaMalloc(&bad, 8));
  CHECK_CUDA(cudaMemset(bad, 0, 8));
  std::vector<std::pair<uint32_t*, size_t>> blocks;
  size_t held = 0, free_b = 0, total = 0;
  for (size_t piece : {size_t(1) << 30, size_t(64) << 20, size_t(2) << 20}) {
    for (;;) {
      CHECK_CUDA(cudaMemGetInfo(&free_b, &total));
      size_t want = leave ? (free_b > mib ? free_b - mib : 0) : (mib > held ? mib - held : 0);
      if (want < piece) break;
      uint32_t* p;
      if (cudaMalloc(&p, piece) != cudaSuccess) {
        (void)cudaGetLastError();
        break;
      }
      CHECK_CUDA(cudaMemset(p, 0, piece));
      blocks.push_back({p, piece / 4});
      held += piece;
    }
  }
  CHECK_CUDA(cudaDeviceSynchronize());
  CHECK_CUDA(cudaMemGetInfo(&free_b, &total));
  char line[128];
  int n = std::snprintf(line, sizeof(line), "held %zu MiB, free %zu MiB\n", held >> 20, free_b >> 20);
  if (FILE* f = std::fopen(argv[1], "w")) {
    std::fwrite(line, 1, size_t(n), f);
    std::fclose(f);
  }
  for (uint32_t round = 0;; round++) {
    for (auto& [p, words] : blocks) bump<<<64, 256>>>(p, words < (256u << 10) ? words : (256u << 10), round, bad);
    unsigned long long errors;
    CHECK_CUDA(cudaMemcpy(&errors, bad, 8, cudaMemcpyDeviceToHost));
    if (errors) {
      std::fprintf(stderr, "gpu_hog: %llu words read back wrong\n", errors);
      return 3;
    }
    usleep(50000);
  }
}
