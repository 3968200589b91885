// The GPU suite's CUDA C++ program: cudaMalloc of small, medium and large
// buffers, pitch and stream-ordered allocations, kernels on several streams
// from two host threads, events, and every memcpy/memset flavour. It counts
// its own launches and allocations (the ground truth for phos's counters;
// CUPTI's kernel count as well) and prints a checksum that depends only on
// the data, so runs with and without libphos.so must print the same line.
//
// usage: cuda_basic [ITERATIONS] [--pace-ms N] [--ready FILE]
//   --ready FILE: written once allocations are made (the round-trip test
//   waits for it, then closes the gate, unmaps and remaps device memory while
//   the program runs).
#include <atomic>
#include <cstdint>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "gpu_check.h"

namespace {

std::atomic<long> g_launches{0}, g_allocs{0}, g_frees{0};
std::atomic<size_t> g_used_after_setup{0};  // device memory in use once both threads allocated

__host__ __device__ uint32_t mix(uint32_t x) {
  x ^= x >> 16;
  x *= 0x7feb352d;
  x ^= x >> 15;
  x *= 0x846ca68b;
  return x ^ (x >> 16);
}
__global__ void fill(uint32_t* p, size_t n, uint32_t seed) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    p[i] = mix(uint32_t(i) ^ seed);
}
__global__ void axpy(const uint32_t* x, uint32_t* y, size_t n, uint32_t a) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    y[i] = y[i] * a + x[i];
}
__global__ void sum(const uint32_t* p, size_t n, unsigned long long* out) {
  unsigned long long s = 0;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    s += p[i];
  atomicAdd(out, s);
}

template <class T>
void alloc(T** p, size_t bytes) {
  CHECK_CUDA(cudaMalloc(p, bytes));
  g_allocs++;
}
template <class T>
void release(T* p) {
  CHECK_CUDA(cudaFree(p));
  g_frees++;
}
#define LAUNCH(kernel, grid, block, stream, ...)                 \
  do {                                                           \
    kernel<<<grid, block, 0, stream>>>(__VA_ARGS__);             \
    CHECK_CUDA(cudaGetLastError());                              \
    g_launches++;                                                \
  } while (0)

struct Options {
  int iterations = 40;
  int pace_ms = 0;
  std::string ready;
};

unsigned long long worker(int tid, const Options& o, std::atomic<int>& ready_count) {
  cudaStream_t s;
  CHECK_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  constexpr size_t kLarge = 64u << 20, kMedium = 600u << 10;
  std::vector<uint32_t*> small(48);
  for (size_t i = 0; i < small.size(); i++) alloc(&small[i], 1024 + 8 * i + tid);
  uint32_t *medium, *large, *persistent, *pitched, *async_buf;
  unsigned long long* acc;
  alloc(&medium, kMedium);
  alloc(&large, kLarge);
  alloc(&persistent, kLarge);
  alloc(&acc, sizeof(unsigned long long));
  size_t pitch = 0;
  CHECK_CUDA(cudaMallocPitch(reinterpret_cast<void**>(&pitched), &pitch, 1000 * sizeof(uint32_t), 64));
  g_allocs++;
  // The padding is summed too. On the worker's stream: the legacy stream is
  // not ordered with non-blocking streams.
  CHECK_CUDA(cudaMemsetAsync(pitched, 0, pitch * 64, s));
  uint32_t* host;
  CHECK_CUDA(cudaMallocHost(&host, kMedium));
  cudaEvent_t ev;
  CHECK_CUDA(cudaEventCreate(&ev));

  // Data that must survive everything until the end (and any remap).
  LAUNCH(fill, 256, 256, s, persistent, kLarge / 4, 0xC0FFEE + tid);
  CHECK_CUDA(cudaMemsetAsync(acc, 0, sizeof(*acc), s));
  CHECK_CUDA(cudaStreamSynchronize(s));
  if (++ready_count == 2) {
    size_t free_bytes = 0, total = 0;
    CHECK_CUDA(cudaMemGetInfo(&free_bytes, &total));
    g_used_after_setup = total - free_bytes;
    if (!o.ready.empty())
      if (FILE* f = std::fopen(o.ready.c_str(), "w")) std::fclose(f);
  }

  for (int it = 0; it < o.iterations; it++) {
    uint32_t* sm = small[it % small.size()];
    LAUNCH(fill, 4, 128, s, sm, 256, it * 7 + tid);
    LAUNCH(fill, 128, 256, s, medium, kMedium / 4, it + tid * 1000);
    LAUNCH(fill, 256, 256, s, large, kLarge / 4, it ^ 0x55);
    LAUNCH(axpy, 128, 256, s, medium, large, kMedium / 4, 3 + it);
    CHECK_CUDA(cudaMallocAsync(reinterpret_cast<void**>(&async_buf), kMedium, s));
    g_allocs++;
    CHECK_CUDA(cudaMemcpyAsync(async_buf, large, kMedium, cudaMemcpyDeviceToDevice, s));
    CHECK_CUDA(cudaMemcpy2DAsync(pitched, pitch, async_buf, 1000 * 4, 1000 * 4, 64, cudaMemcpyDeviceToDevice, s));
    CHECK_CUDA(cudaMemcpyAsync(host, async_buf, kMedium, cudaMemcpyDeviceToHost, s));
    CHECK_CUDA(cudaFreeAsync(async_buf, s));
    g_frees++;
    CHECK_CUDA(cudaEventRecord(ev, s));
    CHECK_CUDA(cudaEventSynchronize(ev));
    unsigned long long host_sum = 0;
    for (size_t i = 0; i < kMedium / 4; i++) host_sum += host[i];
    CHECK_CUDA(cudaMemcpyAsync(medium, host, kMedium, cudaMemcpyHostToDevice, s));
    LAUNCH(sum, 64, 256, s, medium, kMedium / 4, acc);
    LAUNCH(sum, 64, 256, s, sm, 256, acc);
    LAUNCH(sum, 64, 256, s, pitched, pitch / 4 * 64, acc);
    CHECK_CUDA(cudaStreamSynchronize(s));
    (void)host_sum;
    if (o.pace_ms) std::this_thread::sleep_for(std::chrono::milliseconds(o.pace_ms));
  }
  LAUNCH(sum, 256, 256, s, persistent, kLarge / 4, acc);
  unsigned long long result = 0;
  CHECK_CUDA(cudaMemcpyAsync(&result, acc, sizeof(result), cudaMemcpyDeviceToHost, s));
  CHECK_CUDA(cudaStreamSynchronize(s));
  // Word by word, the data written before everything else.
  std::vector<uint32_t> check(kLarge / 4);
  CHECK_CUDA(cudaMemcpyAsync(check.data(), persistent, kLarge, cudaMemcpyDeviceToHost, s));
  CHECK_CUDA(cudaStreamSynchronize(s));
  for (size_t i = 0; i < check.size(); i++)
    if (check[i] != mix(uint32_t(i) ^ (0xC0FFEE + tid))) {
      std::fprintf(stderr, "thread %d: persistent buffer %p wrong at word %zu: %08x, expected %08x\n", tid,
                   static_cast<void*>(persistent), i, check[i], mix(uint32_t(i) ^ (0xC0FFEE + tid)));
      break;
    }

  for (auto* p : small) release(p);
  release(medium);
  release(large);
  release(persistent);
  release(acc);
  release(pitched);
  CHECK_CUDA(cudaFreeHost(host));
  CHECK_CUDA(cudaEventDestroy(ev));
  CHECK_CUDA(cudaStreamDestroy(s));
  return result;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; i++) {
    if (!std::strcmp(argv[i], "--pace-ms") && i + 1 < argc) o.pace_ms = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--ready") && i + 1 < argc) o.ready = argv[++i];
    else o.iterations = std::atoi(argv[i]);
  }
  CHECK_CUDA(cudaFree(nullptr));  // create the context before CUPTI starts counting
  gpu_check::start_kernel_count();
  std::atomic<int> ready_count{0};
  unsigned long long results[2] = {0, 0};
  std::thread t0([&] { results[0] = worker(0, o, ready_count); });
  std::thread t1([&] { results[1] = worker(1, o, ready_count); });
  t0.join();
  t1.join();
  unsigned long long kernels = gpu_check::kernel_count();
  std::printf("checksum %016llx %016llx\n", results[0], results[1]);
  std::printf("counts launches=%ld allocations=%ld frees=%ld cupti_kernels=%llu\n", g_launches.load(),
              g_allocs.load(), g_frees.load(), kernels);
  std::printf("memory used_after_setup=%zu\n", g_used_after_setup.load());
  return 0;
}
