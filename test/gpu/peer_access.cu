// Peer access between two GPUs of one process, for the GPU suite's
// peer_access_2gpu case (the e2e workload contract; issue 31 part 3). GPU 0
// holds A (cudaMalloc: phos's memory under libphos.so; GPU 1 reaches it
// through cudaDeviceEnablePeerAccess, i.e. cuCtxEnablePeerAccess) and V (the
// program's own VMM memory: cuMemCreate, cuMemMap, cuMemSetAccess read-write
// for GPU 0 and GPU 1). Every step:
//   GPU 1: B = mix(A, V, step); A[i] += B[i]; V[i] ^= B[i]  (reads and writes
//          GPU 0's memory from a kernel on GPU 1)
//   GPU 0: A = mix(A, V, step + 1)
//   GPU 0: the checksum of A and V; "STEP SUM" appended to OUTPUTS.
// A process restored without its peer access, or with V's access for GPU 1
// lost, faults in the first kernel on GPU 1 (the step never comes), and
// wrong memory gives other sums. Every step PROPS is rewritten: what the
// driver says of peer access and of the mappings (cuCtxGetFlags of both
// primary contexts, cuDeviceCanAccessPeer both ways, whether peer access
// 1 -> 0 is enabled (asked with cuCtxEnablePeerAccess: ALREADY_ENABLED, or
// enabled now), cuMemGetAccess of A, V and B for both GPUs, their
// addresses); the case compares it before the dump and after the restore.
// STATE: "TOKEN STEP". Exits 77 with fewer than 2 GPUs, or without peer
// access between GPU 0 and 1.
//
// usage: peer_access STATE OUTPUTS STEPS [PACE_MS]
#include <sys/random.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "gpu_check.h"

#define CHECK_CU(x)                                                                   \
  do {                                                                                \
    CUresult r_ = (x);                                                                \
    if (r_ != CUDA_SUCCESS) {                                                         \
      const char* s_ = nullptr;                                                       \
      cuGetErrorName(r_, &s_);                                                        \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, s_ ? s_ : "?"); \
      std::exit(1);                                                                   \
    }                                                                                 \
  } while (0)

namespace {

using gpu_check::append;
using gpu_check::put;

constexpr size_t kWords = (32u << 20) / 8;  // 32 MiB each

__global__ void peer_step(uint64_t* a, uint64_t* v, uint64_t* b, size_t n, uint64_t step) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    // Each thread reads and writes its own words only: no race, the same
    // bits every run.
    uint64_t x = a[i] ^ v[i] ^ (i * 0x9e3779b97f4a7c15ull + step);
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    b[i] = x;
    a[i] += x;
    v[i] ^= x >> 7;
  }
}

__global__ void local_step(uint64_t* a, const uint64_t* v, size_t n, uint64_t step) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    a[i] = (a[i] ^ v[(i + step) % n]) * 0xff51afd7ed558ccdull + step;
}

__global__ void checksum(const uint64_t* a, const uint64_t* v, size_t n, unsigned long long* out) {
  unsigned long long local = 0;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    local += a[i] * (i | 1) + (v[i] ^ i);
  atomicAdd(out, local);
}

// The program's own VMM memory on GPU 0, read-write for both GPUs.
uint64_t* vmm_on_0(size_t bytes) {
  CUmemAllocationProp prop = {};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = 0;
  size_t gran = 0;
  CHECK_CU(cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
  bytes = (bytes + gran - 1) / gran * gran;
  CUmemGenericAllocationHandle h;
  CHECK_CU(cuMemCreate(&h, bytes, &prop, 0));
  CUdeviceptr p = 0;
  CHECK_CU(cuMemAddressReserve(&p, bytes, 0, 0, 0));
  CHECK_CU(cuMemMap(p, bytes, 0, h, 0));
  CUmemAccessDesc access[2] = {};
  for (int d = 0; d < 2; d++) {
    access[d].location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    access[d].location.id = d;
    access[d].flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  }
  CHECK_CU(cuMemSetAccess(p, bytes, access, 2));
  return reinterpret_cast<uint64_t*>(p);
}

unsigned long long access_of(const void* p, int device) {
  CUmemLocation loc = {};
  loc.type = CU_MEM_LOCATION_TYPE_DEVICE;
  loc.id = device;
  unsigned long long flags = 0;
  CUresult r = cuMemGetAccess(&flags, &loc, reinterpret_cast<CUdeviceptr>(p));
  return r == CUDA_SUCCESS ? flags : 1000 + r;  // an error shows as 1000 + its code
}

// What the driver says of peer access and of the mappings, one per line.
std::string props(uint64_t* a, uint64_t* v, uint64_t* b) {
  std::string out;
  char line[160];
  CUcontext ctx[2];
  for (int d = 0; d < 2; d++) {
    CHECK_CUDA(cudaSetDevice(d));
    CHECK_CU(cuCtxGetCurrent(&ctx[d]));
    unsigned flags = 0;
    CHECK_CU(cuCtxGetFlags(&flags));
    std::snprintf(line, sizeof(line), "ctx_flags %d %#x\n", d, flags);
    out += line;
  }
  for (int d = 0; d < 2; d++) {
    int can = 0;
    CHECK_CU(cuDeviceCanAccessPeer(&can, d, 1 - d));
    std::snprintf(line, sizeof(line), "can_access_peer %d->%d %d\n", d, 1 - d, can);
    out += line;
  }
  // From GPU 1's context: already enabled is what a process that kept its
  // peer access answers; "enabled now" is one that had lost it.
  CHECK_CUDA(cudaSetDevice(1));
  CUresult r = cuCtxEnablePeerAccess(ctx[0], 0);
  std::snprintf(line, sizeof(line), "peer_access 1->0 %s\n",
                r == CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED ? "already-enabled"
                : r == CUDA_SUCCESS                         ? "was-not-enabled"
                                                            : "error");
  out += line;
  const void* ptrs[3] = {a, v, b};
  const char* names[3] = {"A", "V", "B"};
  for (int i = 0; i < 3; i++)
    for (int d = 0; d < 2; d++) {
      std::snprintf(line, sizeof(line), "access %s@%p gpu%d %llu\n", names[i], ptrs[i], d, access_of(ptrs[i], d));
      out += line;
    }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 4) {
    std::fprintf(stderr, "usage: %s STATE OUTPUTS STEPS [PACE_MS]\n", argv[0]);
    return 2;
  }
  const std::string state = argv[1], outputs = argv[2], props_file = std::string(argv[1]) + ".props";
  const uint64_t steps = std::strtoull(argv[3], nullptr, 10);
  const unsigned pace_us = (argc > 4 ? std::atoi(argv[4]) : 20) * 1000;
  int devices = 0;
  CHECK_CUDA(cudaGetDeviceCount(&devices));
  if (devices < 2) {
    std::fprintf(stderr, "skip: %d device(s)\n", devices);
    return 77;
  }
  int can = 0;
  CHECK_CUDA(cudaDeviceCanAccessPeer(&can, 1, 0));
  if (!can) {
    std::fprintf(stderr, "skip: GPU 1 cannot access GPU 0's memory (no peer access)\n");
    return 77;
  }
  uint64_t token;
  if (getrandom(&token, sizeof(token), 0) != sizeof(token)) return 2;
  uint64_t *a = nullptr, *b = nullptr;
  unsigned long long *sum = nullptr, *host = nullptr;
  CHECK_CUDA(cudaSetDevice(0));
  CHECK_CUDA(cudaMalloc(&a, kWords * 8));
  CHECK_CUDA(cudaMalloc(&sum, 8));
  CHECK_CUDA(cudaMallocHost(&host, 8));
  CHECK_CUDA(cudaMemset(a, 0x3c, kWords * 8));
  uint64_t* v = vmm_on_0(kWords * 8);
  CHECK_CUDA(cudaMemset(v, 0xa5, kWords * 8));
  CHECK_CUDA(cudaDeviceSynchronize());
  CHECK_CUDA(cudaSetDevice(1));
  CHECK_CUDA(cudaDeviceEnablePeerAccess(0, 0));
  CHECK_CUDA(cudaMalloc(&b, kWords * 8));
  char line[128];
  for (uint64_t step = 1; step <= steps; step++) {
    CHECK_CUDA(cudaSetDevice(1));
    peer_step<<<256, 256>>>(a, v, b, kWords, step);
    CHECK_CUDA(cudaGetLastError());
    CHECK_CUDA(cudaDeviceSynchronize());
    CHECK_CUDA(cudaSetDevice(0));
    local_step<<<256, 256>>>(a, v, kWords, step + 1);
    CHECK_CUDA(cudaMemset(sum, 0, 8));
    checksum<<<256, 256>>>(a, v, kWords, sum);
    CHECK_CUDA(cudaMemcpy(host, sum, 8, cudaMemcpyDeviceToHost));
    std::snprintf(line, sizeof(line), "%llu %016llx\n", (unsigned long long)step, *host);
    append(outputs, line);
    put(props_file, props(a, v, b));
    std::snprintf(line, sizeof(line), "%016llx %llu\n", (unsigned long long)token, (unsigned long long)step);
    put(state, line);
    usleep(pace_us);
  }
  return 0;
}
