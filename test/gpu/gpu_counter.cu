// The GPU workload of the checkpoint tests: the CPU workload's contract
// (a random token, a counter, state written every 10 ms to STATE without a
// file kept open) plus device state that only a real GPU restore brings back:
// a counter kept on the device that must stay equal to the host's, and MIB
// MiB of device memory filled from the token, re-verified a 64 MiB slice per
// step. STATE: "TOKEN COUNTER DEVICE_COUNTER ERRORS SLICES_VERIFIED MAX_GAP_MS".
//
// MAX_GAP_MS, for the benchmark's stall: the longest time in milliseconds
// between two consecutive state writes (CLOCK_MONOTONIC; about 10 when
// nothing stops the program). Creating STATE.reset starts it over: the next
// iteration removes the file, sets it to 0 and forgets the previous write, so
// no gap spans the reset. The benchmark creates it before a leave-running
// dump (the stall is then the longest gap of that window) and before a
// restore (no gap spans the restore); a clock that went backwards counts as
// no gap.
//
// usage: phos-gpu-counter STATE MIB [--child] [--cupti] [--devices N [--peer]] [--live LIVE]
//   --child: first fork and exec a second counter with STATE.child (a process
//            tree of two CUDA processes);
//   --cupti: subscribe CUPTI's activity API (the driver's checkpoint refuses
//            a process that CUPTI is attached to);
//   --devices N: MIB MiB on each of devices 0..N-1, each with its own
//            counter (DEVICE_COUNTER is the lowest, ERRORS the sum);
//   --peer:  with --devices, each device gets peer access to the next
//            (cudaDeviceEnablePeerAccess) and each step reads a word of
//            the next device's memory from its own kernel: memory mapped
//            again without peer access (after a restore) faults, a wrong
//            word counts as an error;
//   --live LIVE: only the first LIVE MiB hold the pattern, the rest is set
//            to zero and verified zero (a mostly unwritten buffer, as a
//            preallocated KV cache is: a sparse image).
#include <fcntl.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "gpu_check.h"

namespace {
constexpr size_t kSliceWords = (64u << 20) / 8;

__device__ uint64_t pattern(uint64_t token, uint64_t i) { return (token ^ (i * 0x9E3779B97F4A7C15ull)) + i; }

// Word i of the buffer: the pattern in the first `live` words, 0 after.
__device__ uint64_t expected(uint64_t token, uint64_t i, size_t live) { return i < live ? pattern(token, i) : 0; }

__global__ void fill(uint64_t* p, size_t n, uint64_t token, size_t live) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    p[i] = expected(token, i, live);
}

// A read through peer access: word `i` of another device's buffer.
__global__ void peer_check(const uint64_t* other, size_t i, uint64_t token, size_t live, unsigned long long* errors) {
  if (blockIdx.x == 0 && threadIdx.x == 0 && other[i] != expected(token, i, live)) atomicAdd(errors, 1ull);
}

__global__ void step(const uint64_t* p, size_t first, size_t n, uint64_t token, size_t live,
                     unsigned long long* errors, unsigned long long* device_counter) {
  if (blockIdx.x == 0 && threadIdx.x == 0) (*device_counter)++;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    if (p[first + i] != expected(token, first + i, live)) atomicAdd(errors, 1ull);
}

// The longest gap between two state writes, since the start or the last reset.
class GapMeter {
 public:
  explicit GapMeter(const char* state) : reset_path_(std::string(state) + ".reset") {}
  // Called right before each state write; returns the longest gap in ms.
  double tick() {
    if (unlink(reset_path_.c_str()) == 0) {  // reset requested (and acknowledged by the removal)
      max_ms_ = 0;
      have_last_ = false;
    }
    timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    double now_ms = double(now.tv_sec) * 1e3 + double(now.tv_nsec) / 1e6;
    if (have_last_ && now_ms - last_ms_ > max_ms_) max_ms_ = now_ms - last_ms_;  // negative gaps never count
    last_ms_ = now_ms;
    have_last_ = true;
    return max_ms_;
  }

 private:
  std::string reset_path_;
  double last_ms_ = 0, max_ms_ = 0;
  bool have_last_ = false;
};

void write_state(const char* path, uint64_t token, uint64_t counter, unsigned long long dev, unsigned long long err,
                 uint64_t verified, double max_gap_ms) {
  char tmp[4096], line[256];
  std::snprintf(tmp, sizeof(tmp), "%s.tmp", path);
  int n = std::snprintf(line, sizeof(line), "%016llx %llu %llu %llu %llu %.3f\n", (unsigned long long)token,
                        (unsigned long long)counter, dev, err, (unsigned long long)verified, max_gap_ms);
  int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0 || write(fd, line, size_t(n)) != n) std::exit(2);
  close(fd);
  if (rename(tmp, path) != 0) std::exit(2);
}
}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s STATE MIB [--child] [--cupti] [--devices N [--peer]] [--live LIVE]\n", argv[0]);
    return 2;
  }
  bool cupti = false, peer = false;
  int devices = 1;
  long long live_mib = -1;  // all of it
  for (int i = 3; i < argc; i++) {
    if (!std::strcmp(argv[i], "--cupti")) cupti = true;
    if (!std::strcmp(argv[i], "--peer")) peer = true;
    if (!std::strcmp(argv[i], "--devices") && i + 1 < argc) devices = std::atoi(argv[++i]);
    if (!std::strcmp(argv[i], "--live") && i + 1 < argc) live_mib = std::atoll(argv[++i]);
    if (std::strcmp(argv[i], "--child")) continue;
    // Before any CUDA call: the child starts its own CUDA from scratch.
    pid_t child = fork();
    if (child < 0) return 2;
    if (child == 0) {
      std::string state = std::string(argv[1]) + ".child";
      execl(argv[0], argv[0], state.c_str(), argv[2], static_cast<char*>(nullptr));
      _exit(127);
    }
  }
  size_t words = (size_t(std::atoll(argv[2])) << 20) / 8;
  const size_t live = live_mib < 0 ? words : std::min(words, (size_t(live_mib) << 20) / 8);
  uint64_t token;
  if (getrandom(&token, sizeof(token), 0) != sizeof(token)) return 2;
  // Per device: MIB MiB of pattern, an error count and a step counter.
  std::vector<uint64_t*> big(devices);
  std::vector<unsigned long long*> errors(devices), device_counter(devices);
  unsigned long long* host;
  CHECK_CUDA(cudaFree(nullptr));
  if (cupti) gpu_check::start_kernel_count();
  CHECK_CUDA(cudaMallocHost(&host, 16 * devices));
  for (int d = 0; d < devices; d++) {
    CHECK_CUDA(cudaSetDevice(d));
    CHECK_CUDA(cudaMalloc(&big[d], words * 8));
    CHECK_CUDA(cudaMalloc(&errors[d], 8));           // small: in a slab
    CHECK_CUDA(cudaMalloc(&device_counter[d], 8));   // small: in a slab
    CHECK_CUDA(cudaMemset(errors[d], 0, 8));
    CHECK_CUDA(cudaMemset(device_counter[d], 0, 8));
    fill<<<1024, 256>>>(big[d], words, token, live);
    CHECK_CUDA(cudaDeviceSynchronize());
  }
  if (peer)
    for (int d = 0; d < devices && devices > 1; d++) {
      CHECK_CUDA(cudaSetDevice(d));
      CHECK_CUDA(cudaDeviceEnablePeerAccess((d + 1) % devices, 0));
    }
  size_t slices = (words + kSliceWords - 1) / kSliceWords;
  GapMeter gaps(argv[1]);
  for (uint64_t counter = 1;; counter++) {
    size_t first = ((counter - 1) % slices) * kSliceWords;
    size_t n = first + kSliceWords > words ? words - first : kSliceWords;
    // DEVICE_COUNTER: the lowest of the devices' counters; ERRORS: the sum.
    unsigned long long lowest = ~0ull, error_sum = 0;
    for (int d = 0; d < devices; d++) {
      CHECK_CUDA(cudaSetDevice(d));
      step<<<256, 256>>>(big[d], first, n, token, live, errors[d], device_counter[d]);
      if (peer && devices > 1) peer_check<<<1, 1>>>(big[(d + 1) % devices], first, token, live, errors[d]);
      CHECK_CUDA(cudaMemcpy(&host[2 * d], errors[d], 8, cudaMemcpyDeviceToHost));
      CHECK_CUDA(cudaMemcpy(&host[2 * d + 1], device_counter[d], 8, cudaMemcpyDeviceToHost));
      error_sum += host[2 * d];
      lowest = std::min(lowest, host[2 * d + 1]);
    }
    write_state(argv[1], token, counter, lowest, error_sum, counter, gaps.tick());
    usleep(10000);
  }
}
