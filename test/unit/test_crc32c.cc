#include <catch2/catch.hpp>
#include <cstring>
#include <random>
#include <vector>

#include "phos/images/crc32c.h"

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
