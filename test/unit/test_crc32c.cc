#include <catch2/catch.hpp>
#include <cstring>
#include <random>
#include <vector>

#include "phos/images/crc32c.h"
#include "phos/images/crc32c_split.h"

using phos::crc32c;
using phos::crc32c_portable;

TEST_CASE("crc32c: standard check value", "[crc32c]") {
  const char* s = "123456789";
  CHECK(crc32c(0, s, 9) == 0xE3069283u);
  CHECK(crc32c_portable(0, s, 9) == 0xE3069283u);
}

TEST_CASE("crc32c: empty input is 0", "[crc32c]") { CHECK(crc32c(0, nullptr, 0) == 0u); }

TEST_CASE("crc32c: hardware and portable agree at every length and alignment", "[crc32c]") {
  std::mt19937 rng(7);
  std::vector<unsigned char> buf(4096 + 16);
  for (auto& b : buf) b = static_cast<unsigned char>(rng());
  for (size_t off = 0; off < 8; off++)
    for (size_t len : {0, 1, 7, 8, 9, 63, 64, 65, 1000, 4096})
      REQUIRE(crc32c(0, buf.data() + off, len) == crc32c_portable(0, buf.data() + off, len));
}

TEST_CASE("crc32c: continues across split input", "[crc32c]") {
  std::vector<unsigned char> buf(1000);
  for (size_t i = 0; i < buf.size(); i++) buf[i] = static_cast<unsigned char>(i * 31);
  uint32_t whole = crc32c(0, buf.data(), buf.size());
  for (size_t cut : {1, 333, 999}) CHECK(crc32c(crc32c(0, buf.data(), cut), buf.data() + cut, buf.size() - cut) == whole);
}

TEST_CASE("crc32c: a flipped bit changes it", "[crc32c]") {
  std::vector<unsigned char> buf(4096, 0xAB);
  uint32_t before = crc32c(0, buf.data(), buf.size());
  buf[2000] ^= 1;
  CHECK(crc32c(0, buf.data(), buf.size()) != before);
}

namespace {

std::vector<unsigned char> random_bytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<unsigned char> v(n);
  for (auto& b : v) b = static_cast<unsigned char>(rng());
  return v;
}

}  // namespace

TEST_CASE("crc32c: all implementations agree at every length up to 3 KiB", "[crc32c]") {
  auto buf = random_bytes(3072 + 8, 11);
  for (size_t len = 0; len <= 3072; len++) {
    uint32_t expect = crc32c_portable(0, buf.data() + 1, len);
    REQUIRE(crc32c(0, buf.data() + 1, len) == expect);
    REQUIRE(phos::crc32c_one_stream(0, buf.data() + 1, len) == expect);
  }
}

TEST_CASE("crc32c: three streams agree around their threshold, odd lengths and unaligned starts", "[crc32c]") {
  auto buf = random_bytes((64 << 10) + 64, 12);
  for (size_t off : {0, 1, 3, 7})
    for (size_t len = (16 << 10) - 40; len < (16 << 10) + 40; len++)
      REQUIRE(crc32c(0, buf.data() + off, len) == crc32c_portable(0, buf.data() + off, len));
  for (size_t off : {0, 5})
    for (size_t len : {(32 << 10) + 1, (48 << 10) + 23, (64 << 10) - 1, 64 << 10})
      REQUIRE(crc32c(0, buf.data() + off, len) == crc32c_portable(0, buf.data() + off, len));
}

TEST_CASE("crc32c: three streams agree on a 4 MiB chunk and a bit less", "[crc32c]") {
  auto buf = random_bytes((4 << 20) + 16, 13);
  for (size_t len : {size_t(4) << 20, (size_t(4) << 20) - 4095, (size_t(4) << 20) + 13})
    CHECK(crc32c(0, buf.data() + 3, len) == crc32c_portable(0, buf.data() + 3, len));
}

TEST_CASE("crc32c: three streams continue a chained CRC", "[crc32c]") {
  auto buf = random_bytes(200000, 14);
  uint32_t whole = crc32c_portable(0, buf.data(), buf.size());
  for (size_t cut : {size_t(1), size_t(17000), size_t(100001), size_t(183000)})
    CHECK(crc32c(crc32c(0, buf.data(), cut), buf.data() + cut, buf.size() - cut) == whole);
  CHECK(crc32c(0xDEADBEEFu, buf.data(), buf.size()) == crc32c_portable(0xDEADBEEFu, buf.data(), buf.size()));
}

TEST_CASE("crc32c: combine joins the CRCs of two pieces", "[crc32c]") {
  auto buf = random_bytes(70000, 15);
  for (size_t cut : {size_t(0), size_t(1), size_t(8), size_t(4096), size_t(69999), size_t(70000)}) {
    uint32_t a = crc32c(0, buf.data(), cut), b = crc32c(0, buf.data() + cut, buf.size() - cut);
    CHECK(phos::crc32c_combine(a, b, buf.size() - cut) == crc32c_portable(0, buf.data(), buf.size()));
  }
}

TEST_CASE("crc32c: zero-filled buffers of many sizes", "[crc32c]") {
  std::vector<unsigned char> zeros(1 << 20);
  for (size_t len : {size_t(16) << 10, size_t(100) << 10, size_t(1) << 20})
    CHECK(crc32c(0, zeros.data(), len) == crc32c_portable(0, zeros.data(), len));
}

// The GPU's way (plugin/gpu/chunk_crc.cu): 1024 parts, each CRC'd by words
// and bytes as one thread does it, joined; it must give the host's CRC.
TEST_CASE("crc32c: parts joined as the GPU computes them equal the whole's", "[crc32c]") {
  namespace split = phos::crc32c_split;
  uint32_t table[256];
  for (uint32_t i = 0; i < 256; i++) table[i] = split::table_entry(i);
  std::mt19937 rng(7);
  for (size_t size : {size_t(1), size_t(17), size_t(1000), size_t(4096), size_t(16384 + 3), size_t(3) << 20,
                      size_t(4) << 20, (size_t(4) << 20) + 12}) {
    std::vector<unsigned char> data(size);
    for (auto& c : data) c = static_cast<unsigned char>(rng());
    const uint32_t parts = 1024;
    std::vector<uint32_t> crcs(parts, 0);
    for (uint32_t i = 0; i < parts; i++) {
      uint64_t begin = uint64_t(i) * split::part_size(size, parts), n = split::part_length(size, parts, i), at = 0;
      uint32_t reg = ~0u;
      for (; at + 4 <= n; at += 4) {
        uint32_t w;
        std::memcpy(&w, &data[begin + at], 4);
        reg = split::step_word(reg, w, table);
      }
      for (; at < n; at++) reg = split::step_byte(reg, data[begin + at], table);
      crcs[i] = ~reg;
    }
    INFO("size " << size);
    CHECK(split::part_size(size, parts) % 16 == 0);
    CHECK(split::join_parts(crcs.data(), size, parts) == phos::crc32c(0, data.data(), size));
    CHECK(split::join(phos::crc32c(0, data.data(), size / 2), phos::crc32c(0, data.data() + size / 2, size - size / 2),
                      size - size / 2) == phos::crc32c(0, data.data(), size));
  }
}
