#include <catch2/catch.hpp>

#include <map>
#include <random>

#include "phos/speculation/buffer_index.h"

using phos::speculation::Buffer;
using phos::speculation::BufferIndex;

namespace {

// The reference: the buffer containing `a` in an ordered map of start -> {end, id}.
bool reference_find(const std::map<uint64_t, std::pair<uint64_t, uint64_t>>& ref, uint64_t a, Buffer* out) {
  auto it = ref.upper_bound(a);
  if (it == ref.begin()) return false;
  --it;
  if (a >= it->second.first) return false;
  *out = Buffer{it->first, it->second.first, it->second.second};
  return true;
}

}  // namespace

TEST_CASE("buffer index: finds the buffer around an address, and nothing between buffers") {
  BufferIndex index;
  REQUIRE(index.insert(0x1000, 0x100, 1));
  REQUIRE(index.insert(0x2000, 0x1000, 2));
  Buffer b;
  REQUIRE(index.find(0x1000, &b));
  CHECK(b.id == 1);
  REQUIRE(index.find(0x10ff, &b));
  CHECK(b.id == 1);
  CHECK_FALSE(index.find(0x1100, &b));  // one past the end
  CHECK_FALSE(index.find(0xfff, &b));
  REQUIRE(index.find(0x2fff, &b));
  CHECK((b.id == 2 && b.start == 0x2000 && b.end == 0x3000));
  CHECK_FALSE(index.find(0x3000, &b));
  CHECK(index.size() == 2);
}

TEST_CASE("buffer index: refuses empty, wrapping and overlapping buffers, and changes nothing") {
  BufferIndex index;
  REQUIRE(index.insert(0x2000, 0x1000, 1));
  CHECK_FALSE(index.insert(0x5000, 0, 2));
  CHECK_FALSE(index.insert(UINT64_MAX - 10, 100, 3));
  CHECK_FALSE(index.insert(0x2800, 0x10, 4));   // inside
  CHECK_FALSE(index.insert(0x1800, 0x1000, 5)); // reaches into it
  CHECK_FALSE(index.insert(0x2fff, 0x10, 6));   // starts in its last byte
  CHECK_FALSE(index.insert(0x1000, 0x4000, 7)); // covers it
  CHECK(index.insert(0x1000, 0x1000, 8));       // ends where it starts: adjacent is fine
  CHECK(index.insert(0x3000, 0x1000, 9));
  CHECK(index.size() == 3);
}

TEST_CASE("buffer index: erase by start only") {
  BufferIndex index;
  REQUIRE(index.insert(0x1000, 0x1000, 1));
  CHECK_FALSE(index.erase(0x1800));  // not a start
  CHECK_FALSE(index.erase(0x5000));
  CHECK(index.erase(0x1000));
  Buffer b;
  CHECK_FALSE(index.find(0x1000, &b));
  CHECK(index.size() == 0);
  CHECK_FALSE(index.erase(0x1000));
  CHECK(index.insert(0x1000, 0x10, 2));  // usable again after emptying
}

TEST_CASE("buffer index: overlapping ranges are listed in address order") {
  BufferIndex index;
  for (uint64_t i = 0; i < 200; i++) REQUIRE(index.insert(0x100000 + i * 0x1000, 0x800, i + 1));
  std::vector<uint64_t> ids;
  index.for_each_overlapping(0x100000 + 0x7ff, 0x100000 + 3 * 0x1000 + 1, [&](const Buffer& b) { ids.push_back(b.id); });
  CHECK(ids == std::vector<uint64_t>{1, 2, 3, 4});
  ids.clear();
  index.for_each_overlapping(0x100800, 0x101000, [&](const Buffer& b) { ids.push_back(b.id); });  // a gap
  CHECK(ids.empty());
  ids.clear();
  index.for_each_overlapping(0, UINT64_MAX, [&](const Buffer& b) { ids.push_back(b.id); });
  CHECK(ids.size() == 200);
  CHECK(ids.back() == 200);
}

TEST_CASE("buffer index: random inserts, erases and lookups agree with an ordered map") {
  std::mt19937_64 rng(42);
  BufferIndex index;
  std::map<uint64_t, std::pair<uint64_t, uint64_t>> ref;
  std::vector<uint64_t> starts;
  uint64_t next_id = 1;
  for (int step = 0; step < 60000; step++) {
    int op = int(rng() % 10);
    if (op < 5 || starts.empty()) {
      uint64_t start = (rng() % (1u << 24)) * 256, size = 256 * (1 + rng() % 64);
      Buffer clash;
      bool free = true;
      for (auto it = ref.lower_bound(start); it != ref.end() && it->first < start + size; ++it) free = false;
      if (reference_find(ref, start, &clash)) free = false;
      bool inserted = index.insert(start, size, next_id);
      REQUIRE(inserted == free);
      if (inserted) {
        ref[start] = {start + size, next_id++};
        starts.push_back(start);
      }
    } else if (op < 8) {
      size_t k = rng() % starts.size();
      REQUIRE(index.erase(starts[k]));
      ref.erase(starts[k]);
      starts[k] = starts.back();
      starts.pop_back();
    } else {
      for (int i = 0; i < 20; i++) {
        uint64_t a = rng() % (uint64_t(1) << 32);
        if (!starts.empty() && i % 2) a = starts[rng() % starts.size()] + rng() % 512;
        Buffer got, want;
        bool found = index.find(a, &got);
        REQUIRE(found == reference_find(ref, a, &want));
        if (found) REQUIRE((got.id == want.id && got.start == want.start && got.end == want.end));
      }
    }
    REQUIRE(index.size() == ref.size());
  }
  // Emptied completely, leaf by leaf.
  for (uint64_t s : starts) REQUIRE(index.erase(s));
  CHECK(index.size() == 0);
  CHECK(index.buffers().empty());
}

TEST_CASE("buffer index: a cached lookup never outlives the buffer it found") {
  BufferIndex index;
  REQUIRE(index.insert(0x10000, 0x1000, 1));
  Buffer b;
  REQUIRE(index.find(0x10010, &b));  // now cached
  REQUIRE(index.erase(0x10000));
  CHECK_FALSE(index.find(0x10010, &b));
  REQUIRE(index.insert(0x10000, 0x100, 2));  // a different buffer at the same place
  REQUIRE(index.find(0x10010, &b));
  CHECK(b.id == 2);
  CHECK_FALSE(index.find(0x10100, &b));  // a miss is cached too ...
  REQUIRE(index.insert(0x10100, 0x100, 3));
  REQUIRE(index.find(0x10100, &b));  // ... and dropped by the next update
  CHECK(b.id == 3);
  BufferIndex moved = std::move(index);
  CHECK_FALSE(index.find(0x10010, &b));  // the emptied index answers nothing
  REQUIRE(moved.find(0x10010, &b));
  CHECK(b.id == 2);
  moved.clear();
  CHECK_FALSE(moved.find(0x10010, &b));
}

TEST_CASE("buffer index: addresses below and above all buffers miss, as the bounds grow and after clear") {
  BufferIndex index;
  Buffer b;
  CHECK_FALSE(index.find(0x1000, &b));
  REQUIRE(index.insert(0x10000, 0x1000, 1));
  CHECK_FALSE(index.find(0xffff, &b));
  CHECK_FALSE(index.find(0x11000, &b));
  CHECK(index.find(0x10fff, &b));
  REQUIRE(index.insert(0x100000, 0x100, 2));  // above: the bounds grow
  CHECK(index.find(0x1000ff, &b));
  CHECK(b.id == 2);
  CHECK_FALSE(index.find(0x100100, &b));
  REQUIRE(index.insert(0x100, 0x100, 3));  // below
  CHECK(index.find(0x100, &b));
  CHECK(b.id == 3);
  REQUIRE(index.erase(0x100000));  // erased: gone, though the bounds stay
  CHECK_FALSE(index.find(0x100000, &b));
  index.clear();
  CHECK_FALSE(index.find(0x10000, &b));
  REQUIRE(index.insert(0x20000, 0x1000, 4));
  CHECK(index.find(0x20000, &b));
  CHECK_FALSE(index.find(0x10000, &b));
}
