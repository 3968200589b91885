// Dead memory's range logic (dead_ranges.h): which chunks of an allocation
// the program's free blocks cover wholly, and the wire form of the ranges.
#include <catch2/catch.hpp>
#include <random>
#include <vector>

#include "phos/images/dead_ranges.h"

using phos::dead::Range;
namespace dead = phos::dead;

namespace {
constexpr uint64_t kMiB = 1ull << 20;
constexpr uint64_t kBase = 0x7f0000000000ull;

std::vector<bool> chunks_of(uint64_t size, std::vector<Range> ranges, uint64_t chunk = 4 * kMiB) {
  return dead::dead_chunks(kBase, size, chunk, dead::normalized(std::move(ranges)));
}
}  // namespace

TEST_CASE("dead ranges: normalized sorts, merges overlapping and adjacent ranges, drops empty ones", "[dead]") {
  CHECK(dead::normalized({}).empty());
  CHECK(dead::normalized({{10, 0}}).empty());
  CHECK(dead::normalized({{30, 10}, {10, 10}, {20, 5}}) == std::vector<Range>{{10, 15}, {30, 10}});
  CHECK(dead::normalized({{10, 10}, {15, 20}, {0, 3}}) == std::vector<Range>{{0, 3}, {10, 25}});
  CHECK(dead::normalized({{10, 100}, {20, 5}}) == std::vector<Range>{{10, 100}});  // one inside another
}

TEST_CASE("dead ranges: a chunk is dead only when free blocks cover all of it", "[dead]") {
  SECTION("a block exactly on chunk boundaries") {
    CHECK(chunks_of(16 * kMiB, {{kBase + 4 * kMiB, 8 * kMiB}}) == std::vector<bool>{false, true, true, false});
  }
  SECTION("a block one byte short at either end leaves its edge chunks stored") {
    CHECK(chunks_of(16 * kMiB, {{kBase + 4 * kMiB + 1, 8 * kMiB - 1}}) == std::vector<bool>{false, false, true, false});
    CHECK(chunks_of(16 * kMiB, {{kBase + 4 * kMiB, 8 * kMiB - 1}}) == std::vector<bool>{false, true, false, false});
  }
  SECTION("neighbouring free blocks together cover a chunk neither covers alone") {
    CHECK(chunks_of(8 * kMiB, {{kBase + 4 * kMiB, kMiB}, {kBase + 5 * kMiB, 3 * kMiB}}) ==
          std::vector<bool>{false, true});
  }
  SECTION("a live byte between two free blocks keeps its chunk") {
    CHECK(chunks_of(8 * kMiB, {{kBase + 4 * kMiB, kMiB}, {kBase + 5 * kMiB + 1, 3 * kMiB}}) ==
          std::vector<bool>{false, false});
  }
  SECTION("the allocation's short last chunk is dead when its bytes are") {
    CHECK(chunks_of(9 * kMiB, {{kBase + 8 * kMiB, kMiB}}) == std::vector<bool>{false, false, true});
  }
  SECTION("ranges outside the allocation, or spilling over it, count for its own bytes only") {
    CHECK(chunks_of(8 * kMiB, {{kBase - kMiB, 5 * kMiB}, {kBase + 8 * kMiB, 4 * kMiB}}) ==
          std::vector<bool>{true, false});
    CHECK(chunks_of(8 * kMiB, {{0, kBase}}) == std::vector<bool>{false, false});
  }
  SECTION("no ranges, no dead chunk") { CHECK(chunks_of(8 * kMiB, {}) == std::vector<bool>{false, false}); }
}

TEST_CASE("dead ranges: dead_chunks agrees with a byte map over random blocks", "[dead]") {
  // Byte granularity of 64 KiB pieces: a chunk of 4 pieces is dead exactly
  // when all its pieces are free.
  std::mt19937_64 rng(29);
  const uint64_t piece = 64 << 10, chunk = 4 * piece, pieces = 64;
  for (int round = 0; round < 200; round++) {
    std::vector<bool> free(pieces, false);
    std::vector<Range> ranges;
    for (int b = 0; b < 12; b++) {
      const uint64_t first = rng() % pieces, n = 1 + rng() % 6;
      ranges.push_back({kBase + first * piece, std::min(n, pieces - first) * piece});
      for (uint64_t p = first; p < std::min(pieces, first + n); p++) free[p] = true;
    }
    const std::vector<bool> got = dead::dead_chunks(kBase, pieces * piece, chunk, dead::normalized(ranges));
    REQUIRE(got.size() == pieces / 4);
    for (uint64_t c = 0; c < got.size(); c++) {
      INFO("round " << round << " chunk " << c);
      CHECK(got[c] == (free[4 * c] && free[4 * c + 1] && free[4 * c + 2] && free[4 * c + 3]));
    }
  }
}

TEST_CASE("dead ranges: the wire's (address, size) pairs", "[dead]") {
  const std::vector<Range> ranges{{kBase, kMiB}, {kBase + 4 * kMiB, 2 * kMiB}};
  std::vector<Range> back;
  CHECK(dead::from_pairs(dead::to_pairs(ranges), back).empty());
  CHECK(back == ranges);
  CHECK_THAT(dead::from_pairs({1, 2, 3}, back), Catch::Contains("not (address, size) pairs"));
  CHECK_THAT(dead::from_pairs({~0ull - 10, 100}, back), Catch::Contains("wraps around"));
}
