// On-demand restore's reads (lazy_restore, the GPU suite's lazy_read_* cases):
// a program whose kernels read memory the restore may not have filled yet.
//   lazy_read STATE OUT FILLER_MIB STEPS [--plant]
// It allocates FILLER_MIB of filler first, then a 64 MiB victim (its own
// allocation, at a higher address: an address-order fill reaches it last),
// and small buffers. Every step (10 ms apart) runs
//   scale(in, out, step):       out[i] = 2 * in[i] + step
//   honest:  copy_from(victim, out2): the victim is an argument (its read
//            is in the speculated set)
//   --plant: read_through(table, out2): the victim only through a pointer
//            kept in device memory (table[0]); the speculation sees `table`
// and appends "STEP SUM" (sums of out and out2, and a filler probe) to OUT;
// STATE is "TOKEN STEP". stderr goes to STATE.err (phos's messages, when it
// ends the process, land there).
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <thread>

#include "gpu_check.h"

constexpr int kN = 256;

__global__ void fill(unsigned* p, size_t n, unsigned seed) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    p[i] = unsigned(i) * 2654435761u + seed;
}
__global__ void scale(const float* in, float* out, int step) { out[threadIdx.x] = 2 * in[threadIdx.x] + step; }
__global__ void copy_from(const float* victim, float* out2) { out2[threadIdx.x] = victim[threadIdx.x]; }
__global__ void read_through(float* const* table, float* out2) { out2[threadIdx.x] = table[0][threadIdx.x]; }
__global__ void probe(const unsigned* filler, size_t n, unsigned* out) {
  // A few words spread over the filler: its content must survive too.
  out[threadIdx.x] = filler[(n / kN) * threadIdx.x];
}

int main(int argc, char** argv) {
  if (argc < 5) {
    std::fprintf(stderr, "usage: %s STATE OUT FILLER_MIB STEPS [--plant]\n", argv[0]);
    return 2;
  }
  const std::string state = argv[1], out_path = argv[2];
  const size_t filler_words = size_t(std::atoll(argv[3])) << 18;  // MiB / 4 bytes
  const int steps = std::atoi(argv[4]);
  const bool plant = argc > 5 && !std::strcmp(argv[5], "--plant");
  std::freopen((state + ".err").c_str(), "a", stderr);
  unsigned* filler;
  float *victim, *in, *out, *out2, **table;
  unsigned* probed;
  CHECK_CUDA(cudaMalloc(&filler, filler_words * 4));
  CHECK_CUDA(cudaMalloc(&victim, 64u << 20));
  CHECK_CUDA(cudaMalloc(&in, kN * sizeof(float)));
  CHECK_CUDA(cudaMalloc(&out, kN * sizeof(float)));
  CHECK_CUDA(cudaMalloc(&out2, kN * sizeof(float)));
  CHECK_CUDA(cudaMalloc(&probed, kN * sizeof(unsigned)));
  CHECK_CUDA(cudaMalloc(&table, sizeof(float*)));
  fill<<<1024, 256>>>(filler, filler_words, 7);
  float host[kN];
  for (int i = 0; i < kN; i++) host[i] = float(i) * 0.5f;
  CHECK_CUDA(cudaMemcpy(in, host, sizeof host, cudaMemcpyHostToDevice));
  for (int i = 0; i < kN; i++) host[i] = 1000.0f + float(i);
  CHECK_CUDA(cudaMemcpy(victim, host, sizeof host, cudaMemcpyHostToDevice));
  CHECK_CUDA(cudaMemcpy(table, &victim, sizeof victim, cudaMemcpyHostToDevice));
  CHECK_CUDA(cudaDeviceSynchronize());
  const unsigned token = std::random_device{}();
  for (int step = 0; step < steps; step++) {
    scale<<<1, kN>>>(in, out, step);
    if (plant) read_through<<<1, kN>>>(table, out2);
    else copy_from<<<1, kN>>>(victim, out2);
    probe<<<1, kN>>>(filler, filler_words, probed);
    float a[kN], b[kN];
    unsigned p[kN];
    CHECK_CUDA(cudaMemcpy(a, out, sizeof a, cudaMemcpyDeviceToHost));
    CHECK_CUDA(cudaMemcpy(b, out2, sizeof b, cudaMemcpyDeviceToHost));
    CHECK_CUDA(cudaMemcpy(p, probed, sizeof p, cudaMemcpyDeviceToHost));
    double sum = 0;
    unsigned long long psum = 0;
    for (int i = 0; i < kN; i++) sum += double(a[i]) + double(b[i]), psum += p[i];
    if (FILE* f = std::fopen(out_path.c_str(), "a")) {
      std::fprintf(f, "%d %.1f %llu\n", step, sum, psum);
      std::fclose(f);
    }
    std::string tmp = state + ".tmp";
    if (FILE* f = std::fopen(tmp.c_str(), "w")) {
      std::fprintf(f, "%u %d\n", token, step);
      std::fclose(f);
      std::rename(tmp.c_str(), state.c_str());
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return 0;
}
