// The fingerprint kernels of validation by checksum (plugin/gpu/chunk_sum.cu,
// included here: the very kernels the engine loads), on a GPU:
//   1. the freeze's pass (phos_chunk_sum, one block per 4 MiB chunk, tasks
//      and sums in pinned host memory as the engine has them) over SIZE GiB
//      of device memory, best of 5, beside a device-to-device copy of 4 GiB
//      for the memory's speed;
//   2. copy-and-sum (phos_chunk_copy_sum) 48 chunks at a time on 48 streams
//      (16 workers x 3 ring slots), as the copy made while a process runs;
//   3. the GPU's fingerprints, zero bits and CRC-32C equal the host's
//      (fingerprint.h, crc32c_split.h) for chunks of random data, zeros, and
//      a short tail.
// One line per figure:
//   bench_checksum: GPU NAME
//   bench_checksum: fingerprint pass SIZE GiB in MS ms (GB/s), N chunks
//   bench_checksum: device-to-device copy 4 GiB in MS ms (GB/s of data)
//   bench_checksum: copy-and-sum, 48 chunks at a time: GB/s
//   bench_checksum: GPU = host: N chunks (fingerprint, zero, CRC-32C)
// and exits 1 where the GPU and the host disagree. A size the GPU has no
// room for is skipped, saying so.
//
// usage: bench_checksum [SIZE_GIB...]   (default: 16 64 80)
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "chunk_sum.cu"

namespace {

constexpr uint64_t kChunk = 4ull << 20;
using phos::plugin::ChunkCrcTail;
using phos::plugin::ChunkSumOut;
using phos::plugin::ChunkSumTask;

void check(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return;
  std::fprintf(stderr, "bench_checksum: %s: %s\n", what, cudaGetErrorString(e));
  std::exit(2);
}

__global__ void fill_pattern(uint64_t* p, uint64_t words, uint64_t seed) {
  for (uint64_t i = blockIdx.x * uint64_t(blockDim.x) + threadIdx.x; i < words; i += uint64_t(gridDim.x) * blockDim.x) {
    uint64_t x = (i + seed) * 0x9E3779B97F4A7C15ull;
    x ^= x >> 31;
    p[i] = x * 0xBF58476D1CE4E5B9ull;
  }
}

uint32_t host_crc32c(const unsigned char* p, uint64_t n) {
  static uint32_t table[256];
  static bool made = false;
  if (!made) {
    for (uint32_t i = 0; i < 256; i++) table[i] = phos::crc32c_split::table_entry(i);
    made = true;
  }
  uint32_t reg = ~0u;
  for (uint64_t i = 0; i < n; i++) reg = phos::crc32c_split::step_byte(reg, p[i], table);
  return ~reg;
}

// The freeze's pass over `bytes` at `base`: milliseconds, best of `runs`.
double time_sum_pass(unsigned char* base, uint64_t bytes, int runs) {
  const uint64_t chunks = (bytes + kChunk - 1) / kChunk;
  ChunkSumTask* tasks = nullptr;
  ChunkSumOut* outs = nullptr;
  check(cudaHostAlloc(&tasks, chunks * sizeof(ChunkSumTask), cudaHostAllocMapped), "pinned tasks");
  check(cudaHostAlloc(&outs, chunks * sizeof(ChunkSumOut), cudaHostAllocMapped), "pinned sums");
  for (uint64_t c = 0; c < chunks; c++)
    tasks[c] = ChunkSumTask{uint64_t(base + c * kChunk), std::min(kChunk, bytes - c * kChunk)};
  cudaEvent_t a, b;
  check(cudaEventCreate(&a), "event");
  check(cudaEventCreate(&b), "event");
  double best = 1e30;
  for (int r = 0; r < runs + 1; r++) {  // the first one warms up
    std::memset(outs, 0, chunks * sizeof(ChunkSumOut));
    check(cudaEventRecord(a), "record");
    phos_chunk_sum<<<unsigned(chunks), kThreads>>>(tasks, outs);
    check(cudaEventRecord(b), "record");
    check(cudaEventSynchronize(b), "fingerprint pass");
    float ms = 0;
    check(cudaEventElapsedTime(&ms, a, b), "elapsed");
    if (r) best = std::min(best, double(ms));
    for (uint64_t c = 0; c < chunks; c++)
      if (outs[c].done != phos::plugin::kChunkSumDone) {
        std::fprintf(stderr, "bench_checksum: chunk %llu not summed\n", (unsigned long long)c);
        std::exit(1);
      }
  }
  cudaFreeHost(tasks);
  cudaFreeHost(outs);
  return best;
}

double time_copy(unsigned char* dst, const unsigned char* src, uint64_t bytes) {
  cudaEvent_t a, b;
  check(cudaEventCreate(&a), "event");
  check(cudaEventCreate(&b), "event");
  double best = 1e30;
  for (int r = 0; r < 4; r++) {
    check(cudaEventRecord(a), "record");
    check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice), "device-to-device copy");
    check(cudaEventRecord(b), "record");
    check(cudaEventSynchronize(b), "copy");
    float ms = 0;
    check(cudaEventElapsedTime(&ms, a, b), "elapsed");
    if (r) best = std::min(best, double(ms));
  }
  return best;
}

// copy-and-sum of `bytes` at `src`, 48 chunks in flight on 48 streams, each
// into its own bounce: GB/s of data.
double copy_sum_rate(const unsigned char* src, uint64_t bytes) {
  constexpr int kInFlight = 48;
  std::vector<cudaStream_t> streams(kInFlight);
  std::vector<unsigned char*> bounce(kInFlight);
  ChunkCrcTail* tails = nullptr;
  check(cudaHostAlloc(&tails, kInFlight * sizeof(ChunkCrcTail), cudaHostAllocMapped), "pinned tails");
  for (int s = 0; s < kInFlight; s++) {
    check(cudaStreamCreateWithFlags(&streams[s], cudaStreamNonBlocking), "stream");
    check(cudaMalloc(&bounce[s], kChunk), "bounce");
  }
  const uint64_t chunks = bytes / kChunk;
  check(cudaDeviceSynchronize(), "sync");
  const auto t0 = std::chrono::steady_clock::now();
  for (uint64_t c = 0; c < chunks; c++) {
    const int s = int(c % kInFlight);
    phos_chunk_copy_sum<<<1, kThreads, 0, streams[s]>>>(src + c * kChunk, bounce[s], kChunk, &tails[s]);
  }
  check(cudaDeviceSynchronize(), "copy-and-sum");
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  for (int i = 0; i < kInFlight; i++) {
    cudaStreamDestroy(streams[i]);
    cudaFree(bounce[i]);
  }
  cudaFreeHost(tails);
  return double(chunks * kChunk) / s / 1e9;
}

// The GPU's sums of a few chunks against the host's: the number that agree,
// or -1 (and what differs, printed).
int compare_with_host(unsigned char* base, uint64_t bytes) {
  struct Case {
    uint64_t offset, size;
  };
  std::vector<Case> cases;
  const uint64_t chunks = bytes / kChunk;
  std::mt19937_64 rng(29);
  for (int i = 0; i < 64 && chunks; i++) cases.push_back({(rng() % chunks) * kChunk, kChunk});
  cases.push_back({0, 4096 + 5});  // a short tail, not a whole word
  cases.push_back({kChunk, 17});
  // A zero chunk, at the end of the memory.
  check(cudaMemset(base + bytes - kChunk, 0, kChunk), "zero chunk");
  cases.push_back({bytes - kChunk, kChunk});
  ChunkSumTask* tasks = nullptr;
  ChunkSumOut* outs = nullptr;
  ChunkCrcTail* tail = nullptr;
  unsigned char* bounce = nullptr;
  check(cudaHostAlloc(&tasks, cases.size() * sizeof(ChunkSumTask), cudaHostAllocMapped), "pinned tasks");
  check(cudaHostAlloc(&outs, cases.size() * sizeof(ChunkSumOut), cudaHostAllocMapped), "pinned sums");
  check(cudaHostAlloc(&tail, sizeof(ChunkCrcTail), cudaHostAllocMapped), "pinned tail");
  check(cudaMalloc(&bounce, kChunk), "bounce");
  for (size_t i = 0; i < cases.size(); i++) tasks[i] = ChunkSumTask{uint64_t(base + cases[i].offset), cases[i].size};
  phos_chunk_sum<<<unsigned(cases.size()), kThreads>>>(tasks, outs);
  check(cudaDeviceSynchronize(), "fingerprints to compare");
  std::vector<unsigned char> host(kChunk), copied(kChunk);
  int agree = 0;
  for (size_t i = 0; i < cases.size(); i++) {
    const Case& k = cases[i];
    check(cudaMemcpy(host.data(), base + k.offset, k.size, cudaMemcpyDeviceToHost), "chunk to host");
    const uint64_t want = phos::fingerprint::of(host.data(), k.size);
    const bool zero = phos::zero_chunk::all_zero(host.data(), k.size);
    std::memset(tail, 0, sizeof(*tail));
    phos_chunk_copy_sum<<<1, kThreads>>>(base + k.offset, bounce, k.size, tail);
    check(cudaDeviceSynchronize(), "copy-and-sum to compare");
    check(cudaMemcpy(copied.data(), bounce, k.size, cudaMemcpyDeviceToHost), "bounce to host");
    const bool ok = outs[i].done == phos::plugin::kChunkSumDone && outs[i].fingerprint == want &&
                    (outs[i].zero != 0) == zero && tail->summed == phos::plugin::kChunkSumDone &&
                    tail->fingerprint == want && tail->crc == host_crc32c(host.data(), k.size) &&
                    (tail->zero != 0) == zero && std::memcmp(copied.data(), host.data(), k.size) == 0;
    if (!ok) {
      std::printf("bench_checksum: GPU != host at offset %llu, %llu bytes: sum %016llx, copy-and-sum %016llx, host "
                  "%016llx; CRC %08x, host %08x\n",
                  (unsigned long long)k.offset, (unsigned long long)k.size, (unsigned long long)outs[i].fingerprint,
                  (unsigned long long)tail->fingerprint, (unsigned long long)want, tail->crc,
                  host_crc32c(host.data(), k.size));
      return -1;
    }
    agree++;
  }
  cudaFreeHost(tasks);
  cudaFreeHost(outs);
  cudaFreeHost(tail);
  cudaFree(bounce);
  return agree;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<uint64_t> sizes_gib;
  for (int i = 1; i < argc; i++) sizes_gib.push_back(std::strtoull(argv[i], nullptr, 10));
  if (sizes_gib.empty()) sizes_gib = {16, 64, 80};
  cudaDeviceProp prop{};
  check(cudaGetDeviceProperties(&prop, 0), "device");
  std::printf("bench_checksum: GPU %s, %.1f GiB\n", prop.name, double(prop.totalGlobalMem) / double(1ull << 30));
  int status = 0;
  bool compared = false, rated = false;
  for (uint64_t gib : sizes_gib) {
    const uint64_t bytes = gib << 30;
    size_t free_bytes = 0, total = 0;
    check(cudaMemGetInfo(&free_bytes, &total), "free memory");
    if (bytes + (1ull << 30) > free_bytes) {
      std::printf("bench_checksum: %llu GiB skipped: %.1f GiB free\n", (unsigned long long)gib,
                  double(free_bytes) / double(1ull << 30));
      continue;
    }
    unsigned char* base = nullptr;
    check(cudaMalloc(&base, bytes), "device memory");
    fill_pattern<<<4096, 256>>>(reinterpret_cast<uint64_t*>(base), bytes / 8, gib);
    check(cudaDeviceSynchronize(), "fill");
    const double ms = time_sum_pass(base, bytes, 5);
    std::printf("bench_checksum: fingerprint pass %llu GiB in %.1f ms (%.0f GB/s), %llu chunks of 4 MiB\n",
                (unsigned long long)gib, ms, double(bytes) / ms / 1e6, (unsigned long long)(bytes / kChunk));
    if (!rated && bytes >= (8ull << 30)) {
      const double copy_ms = time_copy(base + (4ull << 30), base, 4ull << 30);
      std::printf("bench_checksum: device-to-device copy 4 GiB in %.1f ms (%.0f GB/s of data)\n", copy_ms,
                  double(4ull << 30) / copy_ms / 1e6);
      std::printf("bench_checksum: copy-and-sum, 48 chunks at a time: %.0f GB/s\n", copy_sum_rate(base, 4ull << 30));
      rated = true;
    }
    if (!compared) {
      const int agree = compare_with_host(base, bytes);
      if (agree < 0) status = 1;
      else std::printf("bench_checksum: GPU = host: %d chunks (fingerprint, zero, CRC-32C, the bytes copied)\n", agree);
      compared = true;
    }
    check(cudaFree(base), "free");
  }
  return status;
}
