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
