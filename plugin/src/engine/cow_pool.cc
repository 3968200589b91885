#include "phos/plugin/cow_pool.h"

#include <algorithm>
#include <cstdio>

namespace phos::plugin {
namespace {
constexpr uint64_t kGiB = uint64_t(1) << 30;
double gib(uint64_t b) { return double(b) / double(kGiB); }
}  // namespace

PoolSize size_pool(const PoolRequest& q) {
  PoolSize s;
  if (!q.chunk) return s;
  // A program that allocates after the stall (a new cache block, a
  // workspace) should find room without the pool giving anything back:
  // auto keeps more than the explicit size's old 1 GiB.
  const uint64_t floor = q.automatic ? 2 * kGiB : kGiB;
  s.reserve = std::max<uint64_t>(q.total_bytes / 20, floor) + q.extra_keep;
  s.room = q.free_bytes > s.reserve ? q.free_bytes - s.reserve : 0;
  uint64_t bytes = s.room;
  s.limit = "free memory";
  const uint64_t cap = q.automatic ? std::min(q.process_bytes, kMaxPoolBytes) : std::min(q.wanted, kMaxPoolBytes);
  if (cap <= bytes) {
    bytes = cap;
    s.limit = q.automatic ? "the process's memory" : "the setting";
  }
  s.slots = bytes / q.chunk;
  return s;
}

std::string describe_pool_size(const PoolRequest& q, const PoolSize& s) {
  char line[320];
  std::snprintf(line, sizeof(line),
                "cow_pool_mib=%s: %.2f GiB free of %.2f GiB, %.2f GiB kept for the program (%s%s), "
                "the process's memory there %.2f GiB: %llu slots (%.2f GiB), bounded by %s",
                q.automatic ? "auto" : std::to_string(q.wanted >> 20).c_str(), gib(q.free_bytes), gib(q.total_bytes),
                gib(s.reserve), q.automatic ? "5% of the GPU or 2 GiB, the larger" : "5% of the GPU or 1 GiB, the larger",
                q.extra_keep ? ", and the checksum's bounce buffers" : "", gib(q.process_bytes),
                (unsigned long long)s.slots, gib(s.slots * q.chunk), s.limit);
  return line;
}

}  // namespace phos::plugin
