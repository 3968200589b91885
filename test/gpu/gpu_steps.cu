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
//   splitk: Y <- A * X by cublasGemmEx in BF16 (FP32 compute), A 64 x 2^20,
//           X 2^20 x 16: small m and n, very large k, so cuBLAS splits k
//           and keeps its partial sums in the workspace the program gave it
//           with cublasSetWorkspace (32 MiB, allocated last: a dump's copy
//           reaches it last); then X <- f(Y, step). Before each GEMM the
//           handle is given its stream and workspace again, as PyTorch does
//           each time it hands a handle out. --ballast-mib M: M MiB of
//           memory allocated first and never touched (a longer copy).
//           Before the first step one GEMM runs on a workspace set to a
//           pattern: STATE.workspace gets "workspace WRITTEN of BYTES" (the
//           bytes it changed; 0: cuBLAS did not use it for these shapes);
//   graph:  one CUDA graph, instantiated once before the first step and
//           replayed every step: memset, a kernel that advances 64 MiB from
//           a step counter kept on the device, a device-to-device copy, a
//           kernel that mixes the copy, an integer sum, the step counter's
//           increment.
// The step result is an integer sum over the buffer (order-independent).
//
// usage: gpu_steps STATE cublas|splitk|graph [--steps N] [--log FILE] [--pace-ms MS] [--ballast-mib M]
//   --steps N: exit after N steps (default: run forever)
#include <cublas_v2.h>
#include <cuda_bf16.h>
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

__global__ void fill_bf16(__nv_bfloat16* p, size_t n, uint32_t seed) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    uint32_t x = uint32_t(i) * 2654435761u ^ seed;
    x ^= x >> 15;
    x *= 2246822519u;
    p[i] = __float2bfloat16(float(x >> 8) / float(1u << 24) - 0.5f);
  }
}

// X <- f(Y, step): every element of X moves with Y and the step, so every
// GEMM's partial sums differ from the last one's.
__global__ void feed_back(const __nv_bfloat16* y, size_t y_n, __nv_bfloat16* x, size_t n, uint64_t step) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    float v = 0.01f * __bfloat162float(y[i % y_n]) + 1e-3f * float((i * 131 + step) % 17) + float(i % 7) * 0.1f - 0.3f;
    x[i] = __float2bfloat16(0.5f * tanhf(v));
  }
}

// The 32-bit words of p[0..n) that differ from `pattern`.
__global__ void count_changed(const uint32_t* p, size_t n, uint32_t pattern, unsigned long long* out) {
  unsigned long long c = 0;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    c += p[i] != pattern;
  atomicAdd(out, c);
}

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

struct SplitK : Steps {
  static constexpr int m = 64, n = 16, k = 1 << 20;
  static constexpr size_t kWorkspaceBytes = 32u << 20;
  cublasHandle_t h;
  cudaStream_t s;
  __nv_bfloat16 *a, *x, *y;
  void* workspace;
  unsigned long long* sum;
  SplitK(const char* state, size_t ballast_mib) {
    if (ballast_mib) {
      void* ballast;
      CHECK_CUDA(cudaMalloc(&ballast, ballast_mib << 20));
      CHECK_CUDA(cudaMemset(ballast, 0x3c, ballast_mib << 20));
    }
    CHECK_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    CHECK_CUBLAS(cublasCreate(&h));
    CHECK_CUDA(cudaMalloc(&a, sizeof(__nv_bfloat16) * size_t(m) * k));
    CHECK_CUDA(cudaMalloc(&x, sizeof(__nv_bfloat16) * size_t(k) * n));
    CHECK_CUDA(cudaMalloc(&y, sizeof(__nv_bfloat16) * size_t(m) * n));
    CHECK_CUDA(cudaMalloc(&sum, 8));
    CHECK_CUDA(cudaMalloc(&workspace, kWorkspaceBytes));  // last: the highest address
    fill_bf16<<<256, 256, 0, s>>>(a, size_t(m) * k, 1);
    fill_bf16<<<256, 256, 0, s>>>(x, size_t(k) * n, 2);
    // Does cuBLAS use the workspace for these shapes? One GEMM on a pattern.
    constexpr uint32_t kPattern = 0xa5a5a5a5u;
    CHECK_CUDA(cudaMemsetAsync(workspace, 0xa5, kWorkspaceBytes, s));
    gemm();
    CHECK_CUDA(cudaMemsetAsync(sum, 0, 8, s));
    count_changed<<<256, 256, 0, s>>>(static_cast<const uint32_t*>(workspace), kWorkspaceBytes / 4, kPattern, sum);
    unsigned long long changed = 0;
    CHECK_CUDA(cudaMemcpyAsync(&changed, sum, 8, cudaMemcpyDeviceToHost, s));
    CHECK_CUDA(cudaStreamSynchronize(s));
    char line[96];
    std::snprintf(line, sizeof(line), "workspace %llu of %zu\n", changed * 4, kWorkspaceBytes);
    write_file((std::string(state) + ".workspace").c_str(), line, false);
  }
  void gemm() {
    // As PyTorch hands out a handle: its stream (which in cuBLAS 12+ puts
    // back the default workspace), then its workspace.
    CHECK_CUBLAS(cublasSetStream(h, s));
    CHECK_CUBLAS(cublasSetWorkspace(h, workspace, kWorkspaceBytes));
    const float one = 1.f, zero = 0.f;
    CHECK_CUBLAS(cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, m, n, k, &one, a, CUDA_R_16BF, m, x, CUDA_R_16BF, k, &zero,
                              y, CUDA_R_16BF, m, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  }
  uint64_t step(uint64_t counter) override {
    gemm();
    feed_back<<<256, 256, 0, s>>>(y, size_t(m) * n, x, size_t(k) * n, counter);
    CHECK_CUDA(cudaMemsetAsync(sum, 0, 8, s));
    checksum<<<8, 256, 0, s>>>(reinterpret_cast<const uint32_t*>(y), size_t(m) * n / 2, sum);
    unsigned long long out;
    CHECK_CUDA(cudaMemcpyAsync(&out, sum, 8, cudaMemcpyDeviceToHost, s));
    CHECK_CUDA(cudaStreamSynchronize(s));
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
  if (argc < 3 || (std::strcmp(argv[2], "cublas") && std::strcmp(argv[2], "splitk") && std::strcmp(argv[2], "graph"))) {
    std::fprintf(stderr, "usage: %s STATE cublas|splitk|graph [--steps N] [--log FILE] [--pace-ms MS] [--ballast-mib M]\n",
                 argv[0]);
    return 2;
  }
  uint64_t steps = 0;
  int pace_ms = 10;
  size_t ballast_mib = 0;
  const char* log = nullptr;
  for (int i = 3; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--steps")) steps = std::strtoull(argv[i + 1], nullptr, 10);
    else if (!std::strcmp(argv[i], "--log")) log = argv[i + 1];
    else if (!std::strcmp(argv[i], "--pace-ms")) pace_ms = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--ballast-mib")) ballast_mib = std::strtoull(argv[i + 1], nullptr, 10);
  }
  g_error_file = std::string(argv[1]) + ".error";
  uint64_t token;
  if (getrandom(&token, sizeof(token), 0) != sizeof(token)) return 2;
  CHECK_CUDA(cudaFree(nullptr));
  Steps* work = !std::strcmp(argv[2], "cublas")   ? static_cast<Steps*>(new Cublas)
                : !std::strcmp(argv[2], "splitk") ? static_cast<Steps*>(new SplitK(argv[1], ballast_mib))
                                                  : new Graph;
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
