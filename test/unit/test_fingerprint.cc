#include <catch2/catch.hpp>
#include <cstring>
#include <random>
#include <set>
#include <vector>

#include "phos/images/fingerprint.h"

namespace fp = phos::fingerprint;

namespace {

std::vector<unsigned char> random_bytes(size_t size, uint32_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<unsigned char> v(size);
  for (auto& b : v) b = static_cast<unsigned char>(rng());
  return v;
}

uint64_t le64(const unsigned char* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; i--) v = (v << 8) | p[i];
  return v;
}

// The definition read literally (fingerprint.h's comment): part t takes
// words t, t + kParts, ... (the last one zero-padded), the parts are joined
// pairwise level by level, the root with the size. Independent of of()'s
// row-wise walk, which the GPU's per-thread walk must equal too.
uint64_t reference(const std::vector<unsigned char>& data) {
  const uint64_t size = data.size();
  const uint64_t words = fp::word_count(size);
  std::vector<uint64_t> level(fp::kParts);
  for (uint32_t t = 0; t < fp::kParts; t++) {
    fp::Lanes l;
    uint64_t taken = 0;
    for (uint64_t w = t; w < words; w += fp::kParts, taken++) {
      unsigned char word[16] = {};
      std::memcpy(word, data.data() + w * 16, std::min<uint64_t>(16, size - w * 16));
      l = fp::step(l, le64(word), le64(word + 8));
    }
    level[t] = fp::finish_part(l, taken);
  }
  while (level.size() > 1) {
    std::vector<uint64_t> up;
    for (size_t i = 0; i < level.size(); i += 2) up.push_back(fp::join(level[i], level[i + 1]));
    level = up;
  }
  return fp::finish(level[0], size);
}

}  // namespace

TEST_CASE("fingerprint: of() equals the definition at every size, tails included", "[fingerprint]") {
  for (size_t size : {size_t(0), size_t(1), size_t(15), size_t(16), size_t(17), size_t(4096), size_t(4096 + 9),
                      size_t(16384), size_t(16384 + 16 * 5 + 3), size_t(1) << 20, size_t(4) << 20,
                      (size_t(4) << 20) + 13, size_t(64) << 20}) {
    INFO("size " << size);
    auto data = random_bytes(size, uint32_t(size));
    CHECK(fp::of(data.data(), data.size()) == reference(data));
  }
}

TEST_CASE("fingerprint: fixed values pin the definition (the GPU's must be the same)", "[fingerprint]") {
  // Changing the function changes these: an image's fingerprints are never
  // stored, but the GPU kernels, the CPU and bench_checksum.cu must agree.
  std::vector<unsigned char> counting(4096 + 7);
  for (size_t i = 0; i < counting.size(); i++) counting[i] = static_cast<unsigned char>(i * 7 + 1);
  const std::vector<unsigned char> zeros(4 << 20);
  CHECK(fp::of(nullptr, 0) == reference({}));
  CHECK(fp::of(counting.data(), counting.size()) == reference(counting));
  CHECK(fp::of(zeros.data(), zeros.size()) == reference(zeros));
  CHECK(fp::of(nullptr, 0) == 0x894907054f0bd5d6ull);
  CHECK(fp::of(counting.data(), counting.size()) == 0x2157b7eb01c5a846ull);
  CHECK(fp::of(zeros.data(), zeros.size()) == 0x8a381731d75cb7acull);
}

TEST_CASE("fingerprint: a one-bit flip anywhere in a small chunk changes it", "[fingerprint]") {
  auto data = random_bytes(4096 + 16 * 3 + 5, 1);
  const uint64_t before = fp::of(data.data(), data.size());
  for (size_t at = 0; at < data.size(); at++) {
    data[at] ^= static_cast<unsigned char>(1u << (at % 8));
    INFO("byte " << at);
    CHECK(fp::of(data.data(), data.size()) != before);
    data[at] ^= static_cast<unsigned char>(1u << (at % 8));
  }
  CHECK(fp::of(data.data(), data.size()) == before);
}

TEST_CASE("fingerprint: one-bit flips at random positions of a 4 MiB chunk change it", "[fingerprint]") {
  auto data = random_bytes(4 << 20, 2);
  const uint64_t before = fp::of(data.data(), data.size());
  std::mt19937_64 rng(3);
  for (int i = 0; i < 400; i++) {
    const size_t at = rng() % data.size();
    const auto bit = static_cast<unsigned char>(1u << (rng() % 8));
    data[at] ^= bit;
    INFO("byte " << at);
    CHECK(fp::of(data.data(), data.size()) != before);
    data[at] ^= bit;
  }
}

TEST_CASE("fingerprint: swapped 16-byte words change it, within a part and across parts", "[fingerprint]") {
  auto data = random_bytes(4 << 20, 4);
  const uint64_t before = fp::of(data.data(), data.size());
  auto swapped = [&](size_t a, size_t b) {
    auto copy = data;
    std::swap_ranges(copy.begin() + long(a * 16), copy.begin() + long(a * 16 + 16), copy.begin() + long(b * 16));
    return fp::of(copy.data(), copy.size());
  };
  CHECK(swapped(0, 1) != before);                // neighbours: two parts
  CHECK(swapped(5, 5 + fp::kParts) != before);   // the same part, one after the other
  CHECK(swapped(0, fp::kParts - 1) != before);   // first and last part
  CHECK(swapped(100, 100 + 7 * fp::kParts + 3) != before);
  // The two halves of a word (its lanes) swapped.
  auto copy = data;
  std::swap_ranges(copy.begin(), copy.begin() + 8, copy.begin() + 8);
  CHECK(fp::of(copy.data(), copy.size()) != before);
}

TEST_CASE("fingerprint: zeros of different sizes differ, and so do equal bytes shifted", "[fingerprint]") {
  const std::vector<unsigned char> zeros(4 << 20);
  std::set<uint64_t> seen;
  for (size_t size : {size_t(0), size_t(1), size_t(16), size_t(17), size_t(4096), size_t(4) << 20})
    CHECK(seen.insert(fp::of(zeros.data(), size)).second);
  auto data = random_bytes(8192 + 16, 5);
  CHECK(fp::of(data.data(), 8192) != fp::of(data.data() + 16, 8192));
}

TEST_CASE("fingerprint: 20 000 random chunks give 20 000 fingerprints", "[fingerprint]") {
  std::set<uint64_t> seen;
  std::mt19937_64 rng(6);
  std::vector<unsigned char> chunk(4096);
  for (int i = 0; i < 20000; i++) {
    for (size_t k = 0; k < chunk.size(); k += 8) {
      uint64_t v = rng();
      std::memcpy(chunk.data() + k, &v, 8);
    }
    seen.insert(fp::of(chunk.data(), chunk.size()));
  }
  CHECK(seen.size() == 20000);
}

TEST_CASE("fingerprint: the join is a bijection in each argument, and not commutative", "[fingerprint]") {
  // What makes a change within one word always seen: each step maps a
  // different input to a different output, whatever the other input.
  std::mt19937_64 rng(8);
  for (int i = 0; i < 1000; i++) {
    const uint64_t a = rng(), b = rng(), c = rng();
    if (b != c) {
      CHECK(fp::join(a, b) != fp::join(a, c));
      CHECK(fp::join(b, a) != fp::join(c, a));
      CHECK(fp::lane_round(a, b) != fp::lane_round(a, c));
      CHECK(fp::lane_round(b, a) != fp::lane_round(c, a));
    }
    if (a != b) CHECK(fp::join(a, b) != fp::join(b, a));
  }
}
