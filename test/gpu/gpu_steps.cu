// A deterministic GPU computation for checkpoint tests: each step's result
// depends on every earlier step through device memory, and is bitwise the
// same in every run, so a run that was dumped and restored must log exactly
// the checksums of an uninterrupted one. The e2e workload contract: STATE
// gets "TOKEN COUNTER CHECKSUM" every step (atomically, no file kept open);
// LOG gets "COUNTER CHECKSUM" appended per step (opened and closed each time).
// CHECKSUM is a running checksum, kept in host memory, of every step's result.
// A CUDA or cuBLAS error ends it with the message in STATE.error (its output
// goes nowhere under the e2e tests).
//
//   cublas: X <- tanh(alpha * A * X) + drive(step), SGEMM on 2048 x 2048
//           (cuBLAS without atomics; run with CUBLAS_WORKSPACE_CONFIG=:4096:8
//           so it picks the same algorithm every time);
//   graph:  one CUDA graph, instantiated once before the first step and
//           replayed every step: memset, a kernel that advances 64 MiB from
//           a step counter kept on the device, a device-to-device copy, a
//           kernel that mixes the copy, an integer sum, the step counter's
//           increment.
// The step result is an integer sum over the buffer (order-independent).
//
// usage: gpu_steps STATE cublas|graph [--steps N] [--log FILE] [--pace-ms MS]
//   --steps N: exit after N steps (default: run forever)
#include <cublas_v2.h>
#include <fcntl.h>
#include <sys/random.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "gpu_check.h"

namespace {

std::string g_error_file;
void write_file(const char* path, const char* text, bool append);

[[noreturn]] void die(const char* file, int line, const char* what, const std::string& why) {
  char text[1024];
  std::snprintf(text, sizeof(text), "%s:%d: %s: %s\n", file, line, what, why.c_str());
  std::fputs(text, stderr);
  if (!g_error_file.empty()) write_file(g_error_file.c_str(), text, false);
  std::exit(1);
}
}  // namespace

#undef CHECK_CUDA
#define CHECK_CUDA(x)                                                       \
  do {                                                                      \
    cudaError_t e_ = (x);                                                   \
    if (e_ != cudaSuccess) die(__FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
  } while (0)
#define CHECK_CUBLAS(x)                                                                         \
  do {                                                                                          \
    cublasStatus_t s_ = (x);                                                                    \
    if (s_ != CUBLAS_STATUS_SUCCESS) die(__FILE__, __LINE__, #x, "cuBLAS status " + std::to_string(int(s_))); \
  } while (0)

namespace {

__global__ void fill(float* p, size_t n, uint32_t seed) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    uint32_t x = uint32_t(i) * 2654435761u ^ seed;
    x ^= x >> 15;
    x *= 2246822519u;
    p[i] = float(x >> 8) / float(1u << 24) - 0.5f;
  }
}

__global__ void activate(const float* y, float* x, size_t n, uint64_t step) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    x[i] = tanhf(y[i]) + 1e-3f * float((i * 131 + step) % 17);
}

// Sum of (bits of word i) * (2i + 1): integer atomics, the same in any order.
template <class T>
__global__ void checksum(const T* p, size_t n, unsigned long long* out) {
  unsigned long long s = 0;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    uint32_t w;
    memcpy(&w, &p[i], 4);
    s += (unsigned long long)w * (2 * i + 1);
  }
  atomicAdd(out, s);
}

__global__ void advance(uint32_t* p, size_t n, const unsigned long long* step) {
  uint32_t salt = uint32_t(*step) * 0x9E3779B9u;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    uint32_t x = p[i] ^ salt ^ uint32_t(i);
    x ^= x >> 16;
    x *= 0x85EBCA6Bu;
    x ^= x >> 13;
    p[i] = x;
  }
}

__global__ void mix(uint32_t* p, size_t n) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    p[i] = p[i] * 2654435761u + uint32_t(i >> 3);
}

__global__ void tick(unsigned long long* step) { (*step)++; }

void write_file(const char* path, const char* text, bool append) {
  std::string tmp = std::string(path) + ".tmp";
  int fd = append ? open(path, O_WRONLY | O_CREAT | O_APPEND, 0644) : open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  size_t len = std::strlen(text);
  if (fd < 0 || write(fd, text, len) != ssize_t(len)) std::exit(2);
  close(fd);
  if (!append && rename(tmp.c_str(), path) != 0) std::exit(2);
}

// One step of either mode: runs it and returns its result.
struct Steps {
  virtual ~Steps() = default;
  virtual uint64_t step(uint64_t counter) = 0;
};

struct Cublas : Steps {
  static constexpr int n = 2048;
  cublasHandle_t h;
  float *a, *x, *y;
  unsigned long long* sum;
  Cublas() {
    CHECK_CUBLAS(cublasCreate(&h));
    CHECK_CUDA(cudaMalloc(&a, sizeof(float) * n * n));
    CHECK_CUDA(cudaMalloc(&x, sizeof(float) * n * n));
    CHECK_CUDA(cudaMalloc(&y, sizeof(float) * n * n));
    CHECK_CUDA(cudaMalloc(&sum, 8));
    fill<<<256, 256>>>(a, size_t(n) * n, 1);
    fill<<<256, 256>>>(x, size_t(n) * n, 2);
    CHECK_CUDA(cudaDeviceSynchronize());
  }
  uint64_t step(uint64_t counter) override {
    // Gain 1.5 over the random matrix: the chain neither dies out nor blows up.
    const float alpha = 1.5f / (0.2887f * 45.2548f), zero = 0.f;
    CHECK_CUBLAS(cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &alpha, a, n, x, n, &zero, y, n));
    activate<<<256, 256>>>(y, x, size_t(n) * n, counter);
    CHECK_CUDA(cudaMemset(sum, 0, 8));
    checksum<<<256, 256>>>(x, size_t(n) * n, sum);
    unsigned long long out;
    CHECK_CUDA(cudaMemcpy(&out, sum, 8, cudaMemcpyDeviceToHost));
    return out;
  }
};

struct Graph : Steps {
  static constexpr size_t n = 16u << 20;  // 64 MiB of words
  uint32_t *a, *b;
  unsigned long long *sum, *device_step;
  cudaStream_t s;
  cudaGraphExec_t exec;
  Graph() {
    CHECK_CUDA(cudaMalloc(&a, n * 4));
    CHECK_CUDA(cudaMalloc(&b, n * 4));
    CHECK_CUDA(cudaMalloc(&sum, 8));
    CHECK_CUDA(cudaMalloc(&device_step, 8));
    CHECK_CUDA(cudaMemset(a, 0x5a, n * 4));
    CHECK_CUDA(cudaMemset(device_step, 0, 8));
    CHECK_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    CHECK_CUDA(cudaDeviceSynchronize());
    cudaGraph_t g;
    CHECK_CUDA(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    CHECK_CUDA(cudaMemsetAsync(sum, 0, 8, s));
    advance<<<256, 256, 0, s>>>(a, n, device_step);
    CHECK_CUDA(cudaMemcpyAsync(b, a, n * 4, cudaMemcpyDeviceToDevice, s));
    mix<<<256, 256, 0, s>>>(b, n);
    checksum<<<256, 256, 0, s>>>(b, n, sum);
    tick<<<1, 1, 0, s>>>(device_step);
    CHECK_CUDA(cudaStreamEndCapture(s, &g));
    CHECK_CUDA(cudaGraphInstantiate(&exec, g, 0));
  }
  uint64_t step(uint64_t) override {
    unsigned long long out;
    CHECK_CUDA(cudaGraphLaunch(exec, s));
    CHECK_CUDA(cudaMemcpyAsync(&out, sum, 8, cudaMemcpyDeviceToHost, s));
    CHECK_CUDA(cudaStreamSynchronize(s));
    return out;
  }
};

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3 || (std::strcmp(argv[2], "cublas") && std::strcmp(argv[2], "graph"))) {
    std::fprintf(stderr, "usage: %s STATE cublas|graph [--steps N] [--log FILE] [--pace-ms MS]\n", argv[0]);
    return 2;
  }
  uint64_t steps = 0;
  int pace_ms = 10;
  const char* log = nullptr;
  for (int i = 3; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--steps")) steps = std::strtoull(argv[i + 1], nullptr, 10);
    else if (!std::strcmp(argv[i], "--log")) log = argv[i + 1];
    else if (!std::strcmp(argv[i], "--pace-ms")) pace_ms = std::atoi(argv[i + 1]);
  }
  g_error_file = std::string(argv[1]) + ".error";
  uint64_t token;
  if (getrandom(&token, sizeof(token), 0) != sizeof(token)) return 2;
  CHECK_CUDA(cudaFree(nullptr));
  Steps* work = !std::strcmp(argv[2], "cublas") ? static_cast<Steps*>(new Cublas) : new Graph;
  uint64_t running = 0xcbf29ce484222325ull;
  for (uint64_t counter = 1; steps == 0 || counter <= steps; counter++) {
    running = (running ^ work->step(counter)) * 0x100000001b3ull;
    char line[128];
    if (log) {
      std::snprintf(line, sizeof(line), "%llu %016llx\n", (unsigned long long)counter, (unsigned long long)running);
      write_file(log, line, true);
    }
    std::snprintf(line, sizeof(line), "%016llx %llu %016llx\n", (unsigned long long)token,
                  (unsigned long long)counter, (unsigned long long)running);
    write_file(argv[1], line, false);
    if (pace_ms) usleep(pace_ms * 1000);
  }
  return 0;
}
