// The copy-on-write pool's size on one GPU (phos/plugin/cow_pool.h): auto
// takes what is free less the program's reserve, an explicit size stays as
// it was.
#include <catch2/catch.hpp>

#include "phos/plugin/cow_pool.h"

using namespace phos::plugin;

namespace {
constexpr uint64_t kMiB = uint64_t(1) << 20, kGiB = uint64_t(1) << 30;
constexpr uint64_t kChunk = 4 * kMiB;
}  // namespace

TEST_CASE("cow pool: auto takes what is free less 5% of the GPU", "[cow_pool]") {
  // The 8B server on an H200: 139 GiB, 79.8 GiB in use.
  PoolRequest q{.automatic = true, .free_bytes = 59 * kGiB, .total_bytes = 140 * kGiB, .process_bytes = 80 * kGiB,
                .chunk = kChunk};
  PoolSize s = size_pool(q);
  CHECK(s.reserve == 7 * kGiB);  // 5% of 140 GiB, more than 2 GiB
  CHECK(s.room == 52 * kGiB);
  CHECK(s.slots == 52 * kGiB / kChunk);
  CHECK(std::string(s.limit) == "free memory");
  const std::string line = describe_pool_size(q, s);
  INFO(line);
  CHECK(line.find("cow_pool_mib=auto: 59.00 GiB free of 140.00 GiB, 7.00 GiB kept for the program") == 0);
  CHECK(line.find("13312 slots (52.00 GiB), bounded by free memory") != std::string::npos);
}

TEST_CASE("cow pool: auto keeps at least 2 GiB, and the checksum's bounce buffers", "[cow_pool]") {
  PoolRequest q{.automatic = true, .free_bytes = 8 * kGiB, .total_bytes = 16 * kGiB, .extra_keep = 96 * kMiB,
                .process_bytes = 64 * kGiB, .chunk = kChunk};
  PoolSize s = size_pool(q);
  CHECK(s.reserve == 2 * kGiB + 96 * kMiB);  // 5% of 16 GiB is less than 2 GiB
  CHECK(s.slots == (6 * kGiB - 96 * kMiB) / kChunk);
  CHECK(describe_pool_size(q, s).find("and the checksum's bounce buffers") != std::string::npos);
}

TEST_CASE("cow pool: auto needs no slot beyond the process's memory on the GPU", "[cow_pool]") {
  PoolRequest q{.automatic = true, .free_bytes = 100 * kGiB, .total_bytes = 140 * kGiB, .process_bytes = 3 * kGiB,
                .chunk = kChunk};
  PoolSize s = size_pool(q);
  CHECK(s.slots == 3 * kGiB / kChunk);
  CHECK(std::string(s.limit) == "the process's memory");
}

TEST_CASE("cow pool: auto on a full GPU has no pool", "[cow_pool]") {
  PoolRequest q{.automatic = true, .free_bytes = 6 * kGiB, .total_bytes = 140 * kGiB, .process_bytes = 130 * kGiB,
                .chunk = kChunk};
  CHECK(size_pool(q).slots == 0);
  q.free_bytes = 7 * kGiB + kChunk - 1;  // less than a chunk past the reserve
  CHECK(size_pool(q).slots == 0);
}

TEST_CASE("cow pool: an explicit size is as it was: the setting, within free less 5% (at least 1 GiB)",
          "[cow_pool]") {
  PoolRequest q{.automatic = false, .wanted = 2048 * kMiB, .free_bytes = 59 * kGiB, .total_bytes = 140 * kGiB,
                .process_bytes = 80 * kGiB, .chunk = kChunk};
  PoolSize s = size_pool(q);
  CHECK(s.slots == 512);
  CHECK(std::string(s.limit) == "the setting");
  CHECK(describe_pool_size(q, s).find("cow_pool_mib=2048:") == 0);
  // Larger than the process needs: still the setting.
  q.wanted = 100 * kGiB;
  q.process_bytes = kGiB;
  s = size_pool(q);
  CHECK(s.slots == 52 * kGiB / kChunk);
  CHECK(std::string(s.limit) == "free memory");
  // A small GPU: 1 GiB kept, not 2.
  q = PoolRequest{.automatic = false, .wanted = 64 * kGiB, .free_bytes = 8 * kGiB, .total_bytes = 16 * kGiB,
                  .chunk = kChunk};
  CHECK(size_pool(q).reserve == kGiB);
  CHECK(size_pool(q).slots == 7 * kGiB / kChunk);
  q.wanted = 0;
  CHECK(size_pool(q).slots == 0);
}

TEST_CASE("cow pool: auto splits free memory among the dump's processes on the GPU by their memory there",
          "[cow_pool]") {
  // Two processes of one dump on an H200 (140 GiB): 60 and 20 GiB, 59 GiB
  // free. Alone, the first would take 52 GiB and leave the second nothing
  // past the reserve; split, the 52 GiB of room go 3:1.
  PoolRequest a{.automatic = true, .free_bytes = 59 * kGiB, .total_bytes = 140 * kGiB, .process_bytes = 60 * kGiB,
                .chunk = kChunk, .dump_bytes = 80 * kGiB, .processes = 2};
  PoolSize sa = size_pool(a);
  CHECK(sa.reserve == 7 * kGiB);
  CHECK(sa.slots == 39 * kGiB / kChunk);
  CHECK(std::string(sa.limit) == "its share of free memory");
  // The second is sized after the first's pool was made: the split is of
  // the same measurement, within what is free now.
  PoolRequest b = a;
  b.process_bytes = 20 * kGiB;
  b.free_now = 59 * kGiB - 39 * kGiB;
  PoolSize sb = size_pool(b);
  CHECK(sb.slots == 13 * kGiB / kChunk);
  CHECK(std::string(sb.limit) == "its share of free memory");
  CHECK(sa.slots * kChunk + sb.slots * kChunk + sa.reserve <= a.free_bytes);  // the reserve is left for both
  const std::string line = describe_pool_size(b, sb);
  INFO(line);
  CHECK(line.find("59.00 GiB free (20.00 GiB now) of 140.00 GiB") != std::string::npos);
  CHECK(line.find("shared with 1 other process of the dump there (80.00 GiB of memory in all)") != std::string::npos);
  CHECK(line.find("bounded by its share of free memory") != std::string::npos);
}

TEST_CASE("cow pool: a split share is bounded by the process's memory, each process's bounce buffers kept, and "
          "what is free now",
          "[cow_pool]") {
  PoolRequest q{.automatic = true, .free_bytes = 100 * kGiB, .total_bytes = 140 * kGiB, .extra_keep = 96 * kMiB,
                .process_bytes = 2 * kGiB, .chunk = kChunk, .dump_bytes = 4 * kGiB, .processes = 3};
  PoolSize s = size_pool(q);
  CHECK(s.reserve == 7 * kGiB + 3 * 96 * kMiB);
  CHECK(s.slots == 2 * kGiB / kChunk);
  CHECK(std::string(s.limit) == "the process's memory");
  // Something outside the dump took memory since the first measurement.
  q.free_now = 8 * kGiB;
  s = size_pool(q);
  CHECK(s.slots == (8 * kGiB - 7 * kGiB - 96 * kMiB) / kChunk);
  CHECK(std::string(s.limit) == "free memory now");
  q.free_now = 7 * kGiB;
  CHECK(size_pool(q).slots == 0);
  // An explicit setting is not split.
  q = PoolRequest{.automatic = false, .wanted = 2048 * kMiB, .free_bytes = 59 * kGiB, .total_bytes = 140 * kGiB,
                  .process_bytes = 80 * kGiB, .chunk = kChunk, .dump_bytes = 800 * kGiB, .processes = 2};
  CHECK(size_pool(q).slots == 512);
}

TEST_CASE("cow pool: a split of two large GPUs' memory does not overflow", "[cow_pool]") {
  PoolRequest q{.automatic = true, .free_bytes = 900 * kGiB, .total_bytes = 1000 * kGiB, .process_bytes = 600 * kGiB,
                .chunk = kChunk, .dump_bytes = 1200 * kGiB, .processes = 2};
  CHECK(size_pool(q).slots == 425 * kGiB / kChunk);  // (900 - 50) / 2
}
