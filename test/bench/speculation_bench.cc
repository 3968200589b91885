// phos-speculation-bench: the speculation's costs on this CPU, one core (a
// measurement to read, not a test). For indexes of 1k, 10k and 100k buffers
// (sizes and gaps like a PyTorch process's): lookups per second at random
// addresses inside and between buffers, the cost of an insert + erase, and
// the cost of speculating one launch with 8 pointer parameters (4 const) and
// of one with a 64-byte by-value struct scanned word by word. Lookups and
// launches at random addresses miss the index's cache of recent lookups;
// "the same pointers again" is a loop over 16 launches' worth of pointers,
// as a training step repeats its kernels.
#include <chrono>
#include <cstdio>
#include <random>
#include <vector>

#include "phos/speculation/speculate.h"

namespace {

namespace spec = phos::speculation;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

std::vector<spec::Buffer> fill(spec::BufferIndex& index, size_t n, std::mt19937_64& rng) {
  std::vector<spec::Buffer> buffers;
  uint64_t at = 0x7f0000000000;
  for (size_t i = 0; i < n; i++) {
    uint64_t size = 512ull << (rng() % 16);  // 512 B .. 16 MiB
    index.insert(at, size, i + 1);
    buffers.push_back({at, at + size, i + 1});
    at += size + 512 * (rng() % 4);
  }
  return buffers;
}

void bench(size_t n) {
  std::mt19937_64 rng(n);
  spec::BufferIndex index;
  std::vector<spec::Buffer> buffers = fill(index, n, rng);
  std::vector<uint64_t> probes(1 << 16);
  for (uint64_t& p : probes) {
    const spec::Buffer& b = buffers[rng() % buffers.size()];
    p = rng() % 4 ? b.start + rng() % (b.end - b.start) : b.end + rng() % 1024;
  }
  constexpr size_t kLookups = 20000000;
  spec::Buffer out;
  uint64_t found = 0;
  auto t0 = Clock::now();
  for (size_t i = 0; i < kLookups; i++) found += index.find(probes[i & (probes.size() - 1)], &out);
  double lookup_s = seconds_since(t0);

  constexpr size_t kUpdates = 200000;
  std::vector<uint64_t> gaps;  // free places right after buffers (the gap before the next one)
  for (const spec::Buffer& b : buffers) gaps.push_back(b.end);
  t0 = Clock::now();
  for (size_t i = 0; i < kUpdates; i++) {
    uint64_t at = gaps[(i * 7919) % gaps.size()];
    if (index.insert(at, 256, 0)) index.erase(at);
  }
  double update_s = seconds_since(t0);

  // 8 pointer parameters: 4 const, 4 mutable, each into a random buffer.
  spec::KernelLayout ptr8;
  ptr8.slots_known = true;
  for (uint32_t i = 0; i < 8; i++) {
    spec::ParamLayout p;
    p.offset = i * 8;
    p.size = 8;
    p.kind = i < 4 ? spec::ParamKind::kConstPointer : spec::ParamKind::kPointer;
    ptr8.params.push_back(p);
  }
  std::vector<uint64_t> values(8 * 1024);
  for (size_t i = 0; i < values.size(); i++) {
    const spec::Buffer& b = buffers[rng() % buffers.size()];
    values[i] = b.start + rng() % (b.end - b.start);
  }
  spec::KernelLayout closure;
  closure.slots_known = true;
  spec::ParamLayout c;
  c.size = 64;
  c.kind = spec::ParamKind::kAggregate;
  closure.params.push_back(c);

  constexpr size_t kLaunches = 2000000;
  spec::AccessSet set;
  uint64_t named = 0;
  // Seconds for kLaunches launches of `layout`, the i-th passing the 8
  // words at values[slot(i) * 8] as its parameters' values.
  auto time_launches = [&](const spec::KernelLayout& layout, auto slot) {
    auto start = Clock::now();
    for (size_t i = 0; i < kLaunches; i++) {
      uint64_t* v = &values[slot(i) * 8];
      void* params[8] = {v, v + 1, v + 2, v + 3, v + 4, v + 5, v + 6, v + 7};
      spec::speculate_kernel(layout, spec::LaunchArgs{params}, index, &set);
      named += set.count;
    }
    return seconds_since(start);
  };
  double ptr8_s = time_launches(ptr8, [](size_t i) { return i % 1024; });
  double closure_s = time_launches(closure, [](size_t i) { return i % 1024; });
  // The same 8 pointers launch after launch, as a training loop's kernels.
  double repeated_s = time_launches(ptr8, [](size_t i) { return i % 16; });

  std::printf("speculation-bench: %6zu buffers: %6.1f M lookups/s, insert+erase %6.0f ns, "
              "launch with 8 pointers %5.0f ns (the same pointers again: %4.0f ns), 64-byte struct scanned %5.0f ns"
              "  (found %llu, named %llu)\n",
              n, kLookups / lookup_s / 1e6, update_s / kUpdates * 1e9, ptr8_s / kLaunches * 1e9,
              repeated_s / kLaunches * 1e9, closure_s / kLaunches * 1e9, (unsigned long long)found,
              (unsigned long long)named);
}

}  // namespace

int main() {
  for (size_t n : {size_t(1000), size_t(10000), size_t(100000)}) bench(n);
  return 0;
}
