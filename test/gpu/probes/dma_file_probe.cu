// Probe for the engine's data rate: how fast can T threads move device memory
// into files of a directory (and back), staged through pinned buffers and
// write() (the engine's way today) or by DMA straight into the files' pages
// (file mmapped MAP_SHARED, registered with cudaHostRegister)?
// usage: dma_file_probe DIR THREADS MIB_PER_THREAD
#include <cuda_runtime.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { printf("FAIL %s: %s\n", #x, cudaGetErrorString(e_)); exit(1); } } while (0)
static double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }
static const size_t kChunk = 4 << 20;

struct Phase { double seconds = 0; double setup = 0; };

template <class F> static double in_threads(int n, F f) {
  std::vector<std::thread> ts;
  double t = now_s();
  for (int i = 0; i < n; i++) ts.emplace_back(f, i);
  for (auto& th : ts) th.join();
  return now_s() - t;
}

int main(int argc, char** argv) {
  if (argc != 4) { printf("usage: dma_file_probe DIR THREADS MIB_PER_THREAD\n"); return 2; }
  std::string dir = argv[1];
  int threads = atoi(argv[2]);
  size_t per = size_t(atol(argv[3])) << 20, total = per * threads;
  char* dev; CK(cudaMalloc(&dev, total)); CK(cudaMemset(dev, 0x5a, total)); CK(cudaDeviceSynchronize());
  auto name = [&](int i, const char* mode) { return dir + "/probe-" + mode + "-" + std::to_string(i); };
  auto report = [&](const char* what, double s, double setup) {
    printf("%-44s %6.2f GB/s  (%.0f MiB in %.3f s%s)\n", what, total / s / 1e9, total / 1048576.0, s,
           setup > 0 ? (", setup " + std::to_string(setup).substr(0, 5) + " s inside").c_str() : "");
  };
  // 1. staged: pinned 4 MiB x2 per thread, DtoH then pwrite
  double t = in_threads(threads, [&](int i) {
    int fd = open(name(i, "staged").c_str(), O_CREAT | O_TRUNC | O_WRONLY, 0600);
    char* buf[2]; cudaStream_t s; cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    cudaHostAlloc((void**)&buf[0], kChunk, 0); cudaHostAlloc((void**)&buf[1], kChunk, 0);
    cudaEvent_t ev[2]; cudaEventCreate(&ev[0]); cudaEventCreate(&ev[1]);
    size_t n = per / kChunk;
    for (size_t k = 0; k < n + 1; k++) {
      if (k < n) { cudaMemcpyAsync(buf[k & 1], dev + i * per + k * kChunk, kChunk, cudaMemcpyDeviceToHost, s); cudaEventRecord(ev[k & 1], s); }
      if (k > 0) { cudaEventSynchronize(ev[(k - 1) & 1]); if (pwrite(fd, buf[(k - 1) & 1], kChunk, (k - 1) * kChunk) != (ssize_t)kChunk) { perror("pwrite"); exit(1); } }
    }
    close(fd); cudaFreeHost(buf[0]); cudaFreeHost(buf[1]); cudaStreamDestroy(s);
  });
  report("staged: DtoH to pinned, pwrite", t, 0);
  // 2. registered: fallocate, mmap shared, register, DtoH into the file pages
  std::vector<double> reg(threads), fal(threads);
  std::vector<char*> maps(threads);
  t = in_threads(threads, [&](int i) {
    int fd = open(name(i, "dma").c_str(), O_CREAT | O_TRUNC | O_RDWR, 0600);
    double a = now_s();
    if (fallocate(fd, 0, 0, per) != 0) { perror("fallocate"); exit(1); }
    char* m = (char*)mmap(nullptr, per, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
    close(fd);
    double b = now_s();
    cudaError_t e = cudaHostRegister(m, per, cudaHostRegisterDefault);
    double c = now_s();
    if (e != cudaSuccess) { printf("FAIL cudaHostRegister of a file mapping: %s\n", cudaGetErrorString(e)); exit(1); }
    fal[i] = b - a; reg[i] = c - b; maps[i] = m;
    cudaStream_t s; cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    for (size_t k = 0; k < per / kChunk; k++) cudaMemcpyAsync(m + k * kChunk, dev + i * per + k * kChunk, kChunk, cudaMemcpyDeviceToHost, s);
    cudaStreamSynchronize(s); cudaStreamDestroy(s);
  });
  double fmax = 0, rmax = 0; for (int i = 0; i < threads; i++) { fmax = std::max(fmax, fal[i]); rmax = std::max(rmax, reg[i]); }
  report("registered: fallocate+mmap+register, DtoH", t, fmax + rmax);
  printf("  slowest thread: fallocate+populate %.3f s, cudaHostRegister %.3f s\n", fmax, rmax);
  // 2b. the same mappings again (already registered): the DMA alone
  t = in_threads(threads, [&](int i) {
    cudaStream_t s; cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    for (size_t k = 0; k < per / kChunk; k++) cudaMemcpyAsync(maps[i] + k * kChunk, dev + i * per + k * kChunk, kChunk, cudaMemcpyDeviceToHost, s);
    cudaStreamSynchronize(s); cudaStreamDestroy(s);
  });
  report("registered, DMA alone (DtoH)", t, 0);
  t = in_threads(threads, [&](int i) {
    cudaStream_t s; cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    for (size_t k = 0; k < per / kChunk; k++) cudaMemcpyAsync(dev + i * per + k * kChunk, maps[i] + k * kChunk, kChunk, cudaMemcpyHostToDevice, s);
    cudaStreamSynchronize(s); cudaStreamDestroy(s);
  });
  report("registered, DMA alone (HtoD)", t, 0);
  // checksum pass over the file pages (what the engine does per chunk)
  std::atomic<unsigned long long> sum{0};
  t = in_threads(threads, [&](int i) {
    unsigned long long x = 0; const unsigned long long* w = (const unsigned long long*)maps[i];
    for (size_t k = 0; k < per / 8; k++) x += w[k] * 0x9E3779B97F4A7C15ull;
    sum += x;
  });
  report("read pass over the file pages (checksum-like)", t, 0);
  t = in_threads(threads, [&](int i) { cudaHostUnregister(maps[i]); munmap(maps[i], per); });
  printf("unregister+munmap %.3f s\n", t);
  // 3. restore the staged way: pread into pinned, HtoD
  t = in_threads(threads, [&](int i) {
    int fd = open(name(i, "staged").c_str(), O_RDONLY);
    char* buf[2]; cudaStream_t s; cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    cudaHostAlloc((void**)&buf[0], kChunk, 0); cudaHostAlloc((void**)&buf[1], kChunk, 0);
    cudaEvent_t ev[2]; cudaEventCreate(&ev[0]); cudaEventCreate(&ev[1]);
    for (size_t k = 0; k < per / kChunk; k++) {
      if (k >= 2) cudaEventSynchronize(ev[k & 1]);
      if (pread(fd, buf[k & 1], kChunk, k * kChunk) != (ssize_t)kChunk) { perror("pread"); exit(1); }
      cudaMemcpyAsync(dev + i * per + k * kChunk, buf[k & 1], kChunk, cudaMemcpyHostToDevice, s); cudaEventRecord(ev[k & 1], s);
    }
    cudaStreamSynchronize(s); close(fd); cudaFreeHost(buf[0]); cudaFreeHost(buf[1]); cudaStreamDestroy(s);
  });
  report("staged restore: pread to pinned, HtoD", t, 0);
  for (int i = 0; i < threads; i++) { unlink(name(i, "staged").c_str()); unlink(name(i, "dma").c_str()); }
  return 0;
}
