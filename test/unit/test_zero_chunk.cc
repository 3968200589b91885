#include <catch2/catch.hpp>
#include <cstring>
#include <random>
#include <vector>

#include "phos/images/crc32c_split.h"
#include "phos/images/zero_chunk.h"

namespace zero_chunk = phos::zero_chunk;

TEST_CASE("zero chunk: zero bytes of every size are zero", "[zero_chunk]") {
  for (size_t size : {size_t(0), size_t(1), size_t(7), size_t(255), size_t(256), size_t(257), size_t(4096),
                      size_t(4) << 20, (size_t(4) << 20) + 13}) {
    INFO("size " << size);
    std::vector<unsigned char> zeros(size);
    CHECK(zero_chunk::all_zero(zeros.data(), zeros.size()));
  }
}

TEST_CASE("zero chunk: one nonzero byte anywhere is not zero", "[zero_chunk]") {
  // Every position of a buffer that has whole blocks and a tail, from an
  // unaligned start; each bit of a byte.
  std::vector<unsigned char> buf(1 + 3 * 256 + 37);
  const size_t size = buf.size() - 1;
  unsigned char* p = buf.data() + 1;
  for (size_t at = 0; at < size; at++) {
    for (int bit = 0; bit < 8; bit++) {
      std::memset(buf.data(), 0, buf.size());
      p[at] = static_cast<unsigned char>(1u << bit);
      INFO("byte " << at << " bit " << bit);
      CHECK_FALSE(zero_chunk::all_zero(p, size));
    }
  }
}

TEST_CASE("zero chunk: the last byte of a 4 MiB chunk counts", "[zero_chunk]") {
  std::vector<unsigned char> chunk(4 << 20);
  chunk.back() = 0x80;
  CHECK_FALSE(zero_chunk::all_zero(chunk.data(), chunk.size()));
  // A nonzero byte just past the size is not the chunk's.
  CHECK(zero_chunk::all_zero(chunk.data(), chunk.size() - 1));
}

TEST_CASE("zero chunk: the fold is 0 exactly while every word is", "[zero_chunk]") {
  STATIC_REQUIRE(zero_chunk::fold<uint32_t>(0, 0) == 0);
  STATIC_REQUIRE(zero_chunk::fold<uint32_t>(0, 0x80000000u) != 0);
  STATIC_REQUIRE(zero_chunk::fold<uint64_t>(1, 0) != 0);  // once nonzero, it stays
}

// The GPU's way (plugin/gpu/chunk_crc.cu): 1024 parts as the CRC splits
// them, each folded by 16-byte words (four 32-bit lanes ORed) and then bytes
// as one thread does it, the parts' results ORed as __syncthreads_or does;
// it must say what the host says.
namespace {

bool zero_as_the_gpu_folds_it(const std::vector<unsigned char>& data) {
  namespace split = phos::crc32c_split;
  const uint32_t parts = 1024;
  const uint64_t size = data.size();
  bool any_nonzero = false;
  for (uint32_t i = 0; i < parts; i++) {
    const uint64_t begin = uint64_t(i) * split::part_size(size, parts), n = split::part_length(size, parts, i);
    uint32_t folded = 0;
    uint64_t at = 0;
    for (; at + 16 <= n; at += 16) {
      uint32_t v[4];
      std::memcpy(v, &data[begin + at], 16);
      folded = zero_chunk::fold(folded, v[0] | v[1] | v[2] | v[3]);
    }
    for (; at < n; at++) folded = zero_chunk::fold<uint32_t>(folded, data[begin + at]);
    any_nonzero = any_nonzero || folded != 0;
  }
  return !any_nonzero;
}

}  // namespace

TEST_CASE("zero chunk: the GPU's fold over its parts agrees with the host", "[zero_chunk]") {
  std::mt19937 rng(11);
  for (size_t size : {size_t(1), size_t(17), size_t(1000), size_t(16384 + 3), size_t(4) << 20,
                      (size_t(4) << 20) + 12}) {
    std::vector<unsigned char> data(size);
    INFO("size " << size);
    CHECK(zero_as_the_gpu_folds_it(data) == zero_chunk::all_zero(data.data(), size));
    CHECK(zero_as_the_gpu_folds_it(data));
    // One nonzero byte at random places, the first and the last among them.
    for (size_t at : {size_t(0), size - 1, size_t(rng() % size), size_t(rng() % size)}) {
      data.assign(size, 0);
      data[at] = static_cast<unsigned char>(1 + rng() % 255);
      INFO("nonzero byte at " << at);
      CHECK_FALSE(zero_as_the_gpu_folds_it(data));
      CHECK_FALSE(zero_chunk::all_zero(data.data(), size));
    }
  }
}
