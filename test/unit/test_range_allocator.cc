#include <catch2/catch.hpp>
#include <random>
#include <vector>

#include "phos/hooks/range_allocator.h"

using phos::hooks::RangeAllocator;

TEST_CASE("range allocator: first fit from the lowest address", "[range]") {
  RangeAllocator r;
  r.add_range(0x1000, 0x10000);
  CHECK(r.allocate(0x100, 0x100) == 0x1000);
  CHECK(r.allocate(0x100, 0x100) == 0x1100);
  CHECK(r.free_bytes() == 0x10000 - 0x200);
}

TEST_CASE("range allocator: alignment leaves the gap free", "[range]") {
  RangeAllocator r;
  r.add_range(0x1100, 0x10000);
  CHECK(r.allocate(0x1000, 0x1000) == 0x2000);
  CHECK(r.allocate(0x100, 0x100) == 0x1100);  // from the gap before the aligned block
}

TEST_CASE("range allocator: exhaustion and zero size", "[range]") {
  RangeAllocator r;
  r.add_range(0, 0x1000);
  CHECK_FALSE(r.allocate(0x2000, 1).has_value());
  CHECK_FALSE(r.allocate(0, 1).has_value());
  CHECK(r.allocate(0x1000, 1) == 0u);
  CHECK_FALSE(r.allocate(1, 1).has_value());
}

TEST_CASE("range allocator: frees coalesce back to one extent", "[range]") {
  RangeAllocator r;
  r.add_range(0, 1 << 20);
  std::vector<uint64_t> blocks;
  for (int i = 0; i < 64; i++) blocks.push_back(*r.allocate(4096, 256));
  std::mt19937 rng(3);
  std::shuffle(blocks.begin(), blocks.end(), rng);
  for (uint64_t b : blocks) r.free(b, 4096);
  CHECK(r.unused());
  CHECK(r.free_extents() == 1);
  CHECK(r.allocate(1 << 20, 1) == 0u);
}

TEST_CASE("range allocator: several ranges", "[range]") {
  RangeAllocator r;
  r.add_range(0x100000, 0x1000);
  r.add_range(0x900000, 0x10000);
  CHECK(r.allocate(0x2000, 0x1000) == 0x900000);
  CHECK(r.total_bytes() == 0x11000);
}

TEST_CASE("range allocator: random allocations never overlap", "[range]") {
  RangeAllocator r;
  r.add_range(0, 64 << 20);
  std::mt19937 rng(11);
  std::vector<std::pair<uint64_t, uint64_t>> live;
  for (int i = 0; i < 3000; i++) {
    if (!live.empty() && rng() % 3 == 0) {
      size_t k = rng() % live.size();
      r.free(live[k].first, live[k].second);
      live.erase(live.begin() + long(k));
      continue;
    }
    uint64_t size = 256 * (1 + rng() % 64);
    if (auto a = r.allocate(size, 256)) {
      REQUIRE(*a % 256 == 0);
      for (auto& [s, n] : live) REQUIRE((*a + size <= s || s + n <= *a));
      live.emplace_back(*a, size);
    }
  }
  uint64_t used = 0;
  for (auto& [s, n] : live) used += n;
  CHECK(r.free_bytes() == r.total_bytes() - used);
}
