// phos-storage-bench: how fast N threads can put data into files of a
// directory, each thread its own file, by the ways the engine could write
// its image (a measurement to read, not a test). On the H200 host the
// engine's tmpfs writes top out at 1.2-1.7 GB/s per worker: this
// tells which way is faster there before the engine changes.
//   write       write() of 4 MiB chunks from one reused buffer (the engine today)
//   prealloc    the same into a file fallocate()d to its final size first
//   mmap        memcpy into a MAP_SHARED mapping of the file (ftruncate first)
//   mmap-pop    the same with the mapping populated up front (MAP_POPULATE)
// usage: phos-storage-bench DIR [THREADS [MIB_PER_THREAD]]
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

namespace {

constexpr size_t kChunk = 4u << 20;

bool write_way(const std::string& path, const std::string& way, size_t bytes, const char* src) {
  int fd = ::open(path.c_str(), O_CREAT | O_TRUNC | O_RDWR | O_CLOEXEC, 0600);
  if (fd < 0) return std::perror(path.c_str()), false;
  bool ok = true;
  if (way == "write" || way == "prealloc") {
    if (way == "prealloc" && ::posix_fallocate(fd, 0, off_t(bytes)) != 0) ok = false;
    for (size_t off = 0; ok && off < bytes; off += kChunk)
      ok = ::pwrite(fd, src, kChunk, off_t(off)) == ssize_t(kChunk);
  } else {
    ok = ::ftruncate(fd, off_t(bytes)) == 0;
    int flags = MAP_SHARED | (way == "mmap-pop" ? MAP_POPULATE : 0);
    void* p = ok ? ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, flags, fd, 0) : MAP_FAILED;
    ok = p != MAP_FAILED;
    for (size_t off = 0; ok && off < bytes; off += kChunk) std::memcpy(static_cast<char*>(p) + off, src, kChunk);
    if (ok) ::munmap(p, bytes);
  }
  ::close(fd);
  ::unlink(path.c_str());
  return ok;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) return std::fprintf(stderr, "usage: phos-storage-bench DIR [THREADS [MIB_PER_THREAD]]\n"), 2;
  std::string dir = argv[1];
  unsigned threads = argc > 2 ? unsigned(std::atoi(argv[2])) : 8;
  size_t bytes = (argc > 3 ? size_t(std::atoll(argv[3])) : 1024) << 20;
  bytes = bytes / kChunk * kChunk;
  std::vector<char> src(kChunk, 'p');
  for (const char* way : {"write", "prealloc", "mmap", "mmap-pop"}) {
    std::vector<std::thread> pool;
    std::vector<char> ok(threads, 1);
    auto t0 = std::chrono::steady_clock::now();
    for (unsigned t = 0; t < threads; t++)
      pool.emplace_back([&, t] {
        ok[t] = write_way(dir + "/phos-storage-bench." + std::to_string(t), way, bytes, src.data());
      });
    for (auto& th : pool) th.join();
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    bool all = true;
    for (char o : ok) all = all && o;
    std::printf("storage-bench: %-9s %2u threads x %5zu MiB: %6.2f GB/s in all, %5.2f GB/s per thread%s\n", way, threads,
                bytes >> 20, double(bytes) * threads / s / 1e9, double(bytes) / s / 1e9, all ? "" : "  (FAILED)");
  }
  return 0;
}
