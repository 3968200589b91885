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
  const uint64_t own_reserve = std::max<uint64_t>(q.total_bytes / 20, floor) + q.extra_keep;
  const uint32_t others = q.automatic && q.processes > 1 ? q.processes - 1 : 0;
  s.reserve = own_reserve + uint64_t(others) * q.extra_keep;
  s.room = q.free_bytes > s.reserve ? q.free_bytes - s.reserve : 0;
  uint64_t bytes = s.room;
  s.limit = "free memory";
  if (q.automatic && q.dump_bytes > q.process_bytes) {
    // 128 bits: a room and a memory of 100 GiB each overflow 64.
    bytes = uint64_t((unsigned __int128)s.room * q.process_bytes / q.dump_bytes);
    s.limit = "its share of free memory";
  }
  if (q.automatic && q.free_now) {
    const uint64_t now = q.free_now > own_reserve ? q.free_now - own_reserve : 0;
    if (now < bytes) {
      bytes = now;
      s.limit = "free memory now";
    }
  }
  const uint64_t cap = q.automatic ? std::min(q.process_bytes, kMaxPoolBytes) : std::min(q.wanted, kMaxPoolBytes);
  if (cap <= bytes) {
    bytes = cap;
    s.limit = q.automatic ? "the process's memory" : "the setting";
  }
  s.slots = bytes / q.chunk;
  return s;
}

std::string describe_pool_size(const PoolRequest& q, const PoolSize& s) {
  char shared[160] = "";
  if (q.automatic && q.processes > 1)
    std::snprintf(shared, sizeof(shared), ", shared with %u other process%s of the dump there (%.2f GiB of memory in all)",
                  q.processes - 1, q.processes > 2 ? "es" : "", gib(q.dump_bytes));
  char now[64] = "";
  if (q.automatic && q.free_now) std::snprintf(now, sizeof(now), " (%.2f GiB now)", gib(q.free_now));
  char bounce[48] = "";
  if (q.extra_keep) std::snprintf(bounce, sizeof(bounce), " (%.1f MiB)", double(q.extra_keep) / double(1 << 20));
  char line[480];
  std::snprintf(line, sizeof(line),
                "cow_pool_mib=%s: %.2f GiB free%s of %.2f GiB, %.2f GiB kept for the program (%s%s%s), "
                "the process's memory there %.2f GiB%s: %llu slots (%.2f GiB), bounded by %s",
                q.automatic ? "auto" : std::to_string(q.wanted >> 20).c_str(), gib(q.free_bytes), now,
                gib(q.total_bytes), gib(s.reserve),
                q.automatic ? "5% of the GPU or 2 GiB, the larger" : "5% of the GPU or 1 GiB, the larger",
                q.extra_keep ? (q.automatic && q.processes > 1 ? ", and each process's checksum bounce buffers"
                                                               : ", and the checksum's bounce buffers")
                             : "",
                bounce, gib(q.process_bytes), shared, (unsigned long long)s.slots, gib(s.slots * q.chunk), s.limit);
  return line;
}

}  // namespace phos::plugin
