// phos-crc-bench: how fast each CRC-32C implementation checksums 4 MiB
// chunks on this CPU (a measurement to read, not a test).
#include <time.h>

#include <cstdint>
#include <cstdio>
#include <random>
#include <vector>

#include "phos/images/crc32c.h"

namespace {

double now_s() {
  struct timespec ts {};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return double(ts.tv_sec) + double(ts.tv_nsec) / 1e9;
}

template <class Fn>
void measure(const char* name, const std::vector<unsigned char>& buf, unsigned rounds, Fn fn) {
  uint32_t crc = 0;
  double t0 = now_s();
  for (unsigned i = 0; i < rounds; i++) crc = fn(0, buf.data(), buf.size());
  double elapsed = now_s() - t0;
  std::printf("%-22s %7.2f GB/s  (crc %08x)\n", name, double(buf.size()) * rounds / elapsed / 1e9, crc);
}

}  // namespace

int main() {
  std::vector<unsigned char> buf(4 << 20);
  std::mt19937 rng(1);
  for (auto& b : buf) b = static_cast<unsigned char>(rng());
  std::printf("CRC-32C of a 4 MiB chunk, one thread:\n");
  measure("table (portable)", buf, 20, phos::crc32c_portable);
  measure("sse4.2, one stream", buf, 200, phos::crc32c_one_stream);
  measure("sse4.2, three streams", buf, 200, [](uint32_t c, const void* p, size_t n) { return phos::crc32c(c, p, n); });
  return 0;
}
