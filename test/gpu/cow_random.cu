// The randomized differential workload of copy-on-write (test/gpu/cow_suite.sh):
// a stream of random operations over many buffers, each a deterministic
// function of (seed, its index): memsets and device-to-device copies of
// random ranges (exact write sets), an opaque kernel with pointer arguments
// and one with a struct argument (speculated sets, or unknown), and cuBLAS
// SGEMMs (an exact library call). A run that was checkpointed at any moment
// and restored must hold, at every operation boundary after the restore,
// exactly the bytes of a run that was never interrupted.
//
// SIGUSR1 asks for a verification: at the next operation boundary M the
// program replays operations 0..M-1 into fresh buffers, compares them with
// its live ones word by word on the GPU, and appends to LOG
//   "VERIFY pid=P ops=M words=W mismatches=X"
// (the checkpointed process after the dump, the restored one after the
// restore, each checked against the uninterrupted run).
//
// --plant: every 32nd operation also writes where its arguments do not say:
// through a pointer kept in device memory, and through a __device__
// variable, into another buffer (planted mis-speculation; with validation
// on, a copy-on-write dump must refuse its image). --plant-last: every 4th
// operation, into the buffer allocated last (copied last by copy-on-write); built
// without PTX (test/gpu/make-bundle.sh: cow_random_sass) no validator sees
// the plants, and validation by checksum must refuse the image.
//
// The e2e workload contract: STATE gets "TOKEN OPS" (atomically) every 256
// operations.
//
// usage: cow_random STATE LOG [--mib M] [--seed S] [--plant [--plant-last]]
#include <cublas_v2.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/random.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "gpu_check.h"

namespace {

constexpr int kBuffers = 32;
volatile sig_atomic_t g_verify = 0;

uint64_t mix(uint64_t x) {  // splitmix64's finalizer
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

struct Job {  // passed by value: the pointer is inside a struct argument
  uint32_t* p;
  uint64_t n;
  uint32_t v;
};

__device__ uint32_t* g_target;

__global__ void init_words(uint32_t* p, uint64_t n, uint32_t seed) {
  for (uint64_t i = blockIdx.x * uint64_t(blockDim.x) + threadIdx.x; i < n; i += uint64_t(gridDim.x) * blockDim.x)
    p[i] = seed * 2654435761u + uint32_t(i) * 40503u;
}
__global__ void fill(uint32_t* p, uint64_t n, uint32_t v) {
  for (uint64_t i = blockIdx.x * uint64_t(blockDim.x) + threadIdx.x; i < n; i += uint64_t(gridDim.x) * blockDim.x)
    p[i] = v ^ uint32_t(i);
}
__global__ void mix_job(Job j) {
  for (uint64_t i = blockIdx.x * uint64_t(blockDim.x) + threadIdx.x; i < j.n; i += uint64_t(gridDim.x) * blockDim.x)
    j.p[i] = j.p[i] * 31u + j.v + uint32_t(i);
}
// Planted: the written buffer is named only by device memory.
__global__ void plant_indirect(uint32_t* const* holder, uint32_t v) { (*holder)[threadIdx.x] = v + threadIdx.x; }
__global__ void plant_global(uint32_t v) { g_target[threadIdx.x] = v * 3u + threadIdx.x; }
__global__ void count_mismatches(const uint32_t* a, const uint32_t* b, uint64_t n, unsigned long long* out) {
  unsigned long long bad = 0;
  for (uint64_t i = blockIdx.x * uint64_t(blockDim.x) + threadIdx.x; i < n; i += uint64_t(gridDim.x) * blockDim.x)
    bad += a[i] != b[i];
  if (bad) atomicAdd(out, bad);
}

struct Buffers {
  std::vector<uint32_t*> p;
  uint64_t words = 0;  // per buffer
  uint32_t** holder = nullptr;  // a pointer in device memory, for plant_indirect
};

Buffers make_buffers(uint64_t words) {
  Buffers b;
  b.words = words;
  for (int i = 0; i < kBuffers; i++) {
    uint32_t* p = nullptr;
    CHECK_CUDA(cudaMalloc(&p, words * 4));
    init_words<<<256, 256>>>(p, words, uint32_t(i + 1));
    b.p.push_back(p);
  }
  CHECK_CUDA(cudaMalloc(&b.holder, sizeof(uint32_t*)));
  // The operations run on a non-blocking stream: the fills must be done.
  CHECK_CUDA(cudaDeviceSynchronize());
  return b;
}

void free_buffers(Buffers& b) {
  for (uint32_t* p : b.p) CHECK_CUDA(cudaFree(p));
  CHECK_CUDA(cudaFree(b.holder));
  b.p.clear();
}

// Where the plants write: none, into another buffer, into the last one.
enum class Plant { kNone, kOther, kLast };

// Operation `i` of the stream over `b`.
void run_op(uint64_t seed, uint64_t i, Buffers& b, cudaStream_t s, cublasHandle_t blas, Plant plant) {
  uint64_t r = mix(seed ^ mix(i));
  const int buf = int(r % kBuffers);
  const int other = int((buf + 1 + (r >> 8) % (kBuffers - 1)) % kBuffers);
  // A range of up to 8 MiB (or the buffer) at a random word.
  const uint64_t max_words = std::min<uint64_t>(b.words, 2u << 20);
  const uint64_t n = 1 + mix(r + 1) % max_words;
  const uint64_t at = mix(r + 2) % (b.words - n + 1);
  const uint32_t v = uint32_t(mix(r + 3));
  switch ((r >> 40) % 5) {
    case 0: CHECK_CUDA(cudaMemsetAsync(b.p[buf] + at, int(v & 0xff), n * 4, s)); break;
    case 1: {
      const uint64_t from = mix(r + 4) % (b.words - n + 1);
      CHECK_CUDA(cudaMemcpyAsync(b.p[buf] + at, b.p[other] + from, n * 4, cudaMemcpyDeviceToDevice, s));
      break;
    }
    case 2: fill<<<128, 256, 0, s>>>(b.p[buf] + at, n, v); break;
    case 3: mix_job<<<128, 256, 0, s>>>(Job{b.p[buf] + at, n, v}); break;
    case 4: {
      // C (256 x 256 floats in buf) = A * B, A and B read from `other`.
      constexpr int kDim = 256;
      if (b.words < 3ull * kDim * kDim) break;
      const float alpha = 1.0f / 1024, beta = 0.5f;
      const float* a = reinterpret_cast<const float*>(b.p[other]);
      const float* bm = a + kDim * kDim;
      float* c = reinterpret_cast<float*>(b.p[buf] + (at % (b.words - kDim * kDim + 1)));
      if (cublasSgemm(blas, CUBLAS_OP_N, CUBLAS_OP_N, kDim, kDim, kDim, &alpha, a, kDim, bm, kDim, &beta, c, kDim) !=
          CUBLAS_STATUS_SUCCESS) {
        std::fprintf(stderr, "cublasSgemm failed\n");
        std::exit(1);
      }
      break;
    }
  }
  // Into the last buffer every 4th operation: the engine copies 1 GiB in
  // ~50 ms, and 32 operations whose writes wait for it once took longer,
  // so every plant landed after its chunk's copy (issue 29's run 6).
  const uint64_t every = plant == Plant::kLast ? 4 : 32;
  if (plant != Plant::kNone && i % every == every - 1) {
    uint32_t* victim = (plant == Plant::kLast ? b.p[kBuffers - 1] : b.p[other]) + at % (b.words - 256);
    if ((i / every) % 2 == 1) {
      CHECK_CUDA(cudaMemcpyAsync(b.holder, &victim, sizeof(victim), cudaMemcpyHostToDevice, s));
      plant_indirect<<<1, 256, 0, s>>>(b.holder, v);
    } else {
      CHECK_CUDA(cudaMemcpyToSymbolAsync(g_target, &victim, sizeof(victim), 0, cudaMemcpyHostToDevice, s));
      plant_global<<<1, 256, 0, s>>>(v);
    }
    // The pointer copies above read host memory: done before it changes.
    CHECK_CUDA(cudaStreamSynchronize(s));
  }
  CHECK_CUDA(cudaGetLastError());
}

void write_file(const std::string& path, const std::string& text, bool append) {
  std::string tmp = append ? path : path + ".tmp";
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | (append ? O_APPEND : O_TRUNC), 0644);
  if (fd < 0) return;
  if (::write(fd, text.data(), text.size()) < 0) std::perror("write");
  ::close(fd);
  if (!append) ::rename(tmp.c_str(), path.c_str());
}

// Replays operations [0, ops) into fresh buffers and compares them with `live`.
unsigned long long verify(uint64_t seed, uint64_t ops, Buffers& live, cudaStream_t s, cublasHandle_t blas,
                          Plant plant) {
  CHECK_CUDA(cudaStreamSynchronize(s));
  Buffers fresh = make_buffers(live.words);
  for (uint64_t i = 0; i < ops; i++) run_op(seed, i, fresh, s, blas, plant);
  unsigned long long* bad = nullptr;
  CHECK_CUDA(cudaMalloc(&bad, sizeof(*bad)));
  CHECK_CUDA(cudaMemsetAsync(bad, 0, sizeof(*bad), s));
  for (int k = 0; k < kBuffers; k++) count_mismatches<<<256, 256, 0, s>>>(live.p[k], fresh.p[k], live.words, bad);
  unsigned long long mismatches = 0;
  CHECK_CUDA(cudaMemcpyAsync(&mismatches, bad, sizeof(mismatches), cudaMemcpyDeviceToHost, s));
  CHECK_CUDA(cudaStreamSynchronize(s));
  CHECK_CUDA(cudaFree(bad));
  free_buffers(fresh);
  return mismatches;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: cow_random STATE LOG [--mib M] [--seed S] [--plant [--plant-last]]\n");
    return 2;
  }
  std::string state = argv[1], log = argv[2];
  uint64_t mib = 2048, seed = 1;
  Plant plant = Plant::kNone;
  bool last = false;
  for (int i = 3; i < argc; i++) {
    std::string a = argv[i];
    if (a == "--mib" && i + 1 < argc) mib = std::strtoull(argv[++i], nullptr, 10);
    else if (a == "--seed" && i + 1 < argc) seed = std::strtoull(argv[++i], nullptr, 10);
    else if (a == "--plant") plant = Plant::kOther;
    else if (a == "--plant-last") last = true;
  }
  if (plant == Plant::kOther && last) plant = Plant::kLast;
  signal(SIGUSR1, [](int) { g_verify = 1; });
  uint64_t token = 0;
  if (getrandom(&token, sizeof(token), 0) != sizeof(token)) token = uint64_t(getpid());
  cudaStream_t s;
  CHECK_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  cublasHandle_t blas;
  if (cublasCreate(&blas) != CUBLAS_STATUS_SUCCESS || cublasSetStream(blas, s) != CUBLAS_STATUS_SUCCESS) {
    std::fprintf(stderr, "cuBLAS setup failed\n");
    return 1;
  }
  Buffers live = make_buffers((mib << 20) / kBuffers / 4);
  CHECK_CUDA(cudaDeviceSynchronize());
  for (uint64_t i = 0;; i++) {
    if (g_verify) {
      g_verify = 0;
      unsigned long long bad = verify(seed, i, live, s, blas, plant);
      write_file(log,
                 "VERIFY pid=" + std::to_string(getpid()) + " ops=" + std::to_string(i) +
                     " words=" + std::to_string(live.words * kBuffers) + " mismatches=" + std::to_string(bad) + "\n",
                 true);
    }
    run_op(seed, i, live, s, blas, plant);
    if (i % 256 == 0) {
      char line[64];
      std::snprintf(line, sizeof(line), "%016llx %llu\n", (unsigned long long)token, (unsigned long long)i);
      write_file(state, line, false);
    }
  }
}
