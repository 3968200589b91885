// Two CUDA processes sharing device memory through the runtime's cudaIpc*
// (served by phos under libphos.so), for the GPU suite's gpu_ipc case (the
// e2e workload contract): the owner allocates S (64 MiB) and its own O,
// makes S's IPC handle and starts the importer (itself again, exec'd, its
// child: one tree); the importer opens S. Every step, over two pipes:
//   owner:    S[0, H)  = mix(S[H, 2H), step)      (a kernel)
//   importer: S[H, 2H) = mix(S[0, H), step + 1)   (a kernel, through its mapping)
//   owner:    O        = S[H, 2H) checksum; "STEP SUM" appended to OUTPUTS
// (H: half of S, in 64-bit words). A pair dumped and restored must write
// exactly the outputs of an uninterrupted run, which it can only if both
// map the same memory after the restore. STATE: "TOKEN STEP".
//
// usage: gpu_ipc STATE OUTPUTS STEPS | gpu_ipc --import HEX TO_FD FROM_FD
#include <sys/random.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "gpu_check.h"

namespace {

using gpu_check::append;
using gpu_check::put;

constexpr size_t kWords = (64u << 20) / 8;
constexpr size_t kHalf = kWords / 2;

__global__ void mix(uint64_t* dst, const uint64_t* src, size_t n, uint64_t step) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    uint64_t v = src[(i * 7 + step) % n] ^ (i * 0x9e3779b97f4a7c15ull + step);
    dst[i] = v * 6364136223846793005ull + 1442695040888963407ull;
  }
}

__global__ void checksum(const uint64_t* s, size_t n, unsigned long long* out) {
  unsigned long long local = 0;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    local += s[i] * (i | 1);
  atomicAdd(out, local);
}

void send(int fd, uint64_t v) {
  if (write(fd, &v, sizeof(v)) != sizeof(v)) std::exit(3);
}
uint64_t receive(int fd) {
  uint64_t v = 0;
  if (read(fd, &v, sizeof(v)) != sizeof(v)) std::exit(3);
  return v;
}

int importer(const char* hex, int to_owner, int from_owner) {
  cudaIpcMemHandle_t h;
  for (size_t i = 0; i < sizeof(h.reserved); i++) {
    unsigned v;
    if (std::sscanf(hex + 2 * i, "%2x", &v) != 1) return 2;
    h.reserved[i] = char(v);
  }
  void* p = nullptr;
  CHECK_CUDA(cudaIpcOpenMemHandle(&p, h, cudaIpcMemLazyEnablePeerAccess));
  uint64_t* s = static_cast<uint64_t*>(p);
  uint64_t* own = nullptr;  // memory of its own, as any rank has
  CHECK_CUDA(cudaMalloc(&own, 1 << 20));
  for (;;) {
    uint64_t step = receive(from_owner);
    if (step == 0) break;
    mix<<<256, 256>>>(s + kHalf, s, kHalf, step + 1);
    CHECK_CUDA(cudaDeviceSynchronize());
    send(to_owner, step);
  }
  CHECK_CUDA(cudaIpcCloseMemHandle(p));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 5 && !std::strcmp(argv[1], "--import")) return importer(argv[2], std::atoi(argv[3]), std::atoi(argv[4]));
  if (argc < 4) {
    std::fprintf(stderr, "usage: %s STATE OUTPUTS STEPS\n", argv[0]);
    return 2;
  }
  const std::string state = argv[1], outputs = argv[2];
  const uint64_t steps = std::strtoull(argv[3], nullptr, 10);
  uint64_t token;
  if (getrandom(&token, sizeof(token), 0) != sizeof(token)) return 2;
  uint64_t* s = nullptr;
  unsigned long long* sum = nullptr;
  unsigned long long* host = nullptr;
  CHECK_CUDA(cudaMalloc(&s, kWords * 8));
  CHECK_CUDA(cudaMalloc(&sum, 8));
  CHECK_CUDA(cudaMallocHost(&host, 8));
  CHECK_CUDA(cudaMemset(s, 0x5a, kWords * 8));
  CHECK_CUDA(cudaDeviceSynchronize());
  cudaIpcMemHandle_t h;
  CHECK_CUDA(cudaIpcGetMemHandle(&h, s));
  char hex[2 * sizeof(h.reserved) + 1];
  for (size_t i = 0; i < sizeof(h.reserved); i++) std::snprintf(hex + 2 * i, 3, "%02x", (unsigned char)h.reserved[i]);
  int to_child[2], from_child[2];
  if (pipe(to_child) != 0 || pipe(from_child) != 0) return 2;
  pid_t child = fork();
  if (child < 0) return 2;
  if (child == 0) {
    std::string in = std::to_string(to_child[0]), out = std::to_string(from_child[1]);
    execl("/proc/self/exe", argv[0], "--import", hex, out.c_str(), in.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  close(to_child[0]);
  close(from_child[1]);
  char line[128];
  for (uint64_t step = 1; step <= steps; step++) {
    mix<<<256, 256>>>(s, s + kHalf, kHalf, step);
    CHECK_CUDA(cudaDeviceSynchronize());
    send(to_child[1], step);
    if (receive(from_child[0]) != step) return 3;
    CHECK_CUDA(cudaMemset(sum, 0, 8));
    checksum<<<256, 256>>>(s + kHalf, kHalf, sum);
    CHECK_CUDA(cudaMemcpy(host, sum, 8, cudaMemcpyDeviceToHost));
    std::snprintf(line, sizeof(line), "%llu %016llx\n", (unsigned long long)step, *host);
    append(outputs, line);
    std::snprintf(line, sizeof(line), "%016llx %llu\n", (unsigned long long)token, (unsigned long long)step);
    put(state, line);
    usleep(20000);
  }
  send(to_child[1], 0);
  return 0;
}
