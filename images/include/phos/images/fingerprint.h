// The chunk fingerprint of validation by checksum (docs/design/
// checksum-validation.md): a 64-bit hash of a chunk of device memory, taken
// on the GPU for every chunk at the freeze (T0) and for the bytes that go
// into the image, and compared. One definition for the GPU kernels
// (plugin/gpu/chunk_sum.cu), the CPU fallback (the engine) and the tests:
// header-only, usable from device code.
//
// The chunk is read as 16-byte words, word i going to part i % kParts: on
// the GPU each of a block's kParts threads takes one part, so a warp's loads
// are contiguous (coalesced) and the pass runs at the speed of the memory.
// Each part feeds its words into two lanes of xxHash64's round
// (acc = rotl(acc + w * P2, 31) * P1: for a fixed word a bijection of acc,
// and for a fixed acc of the word); the bytes after the last whole word go
// in as one more word, zero-padded. Parts end in an avalanche with their
// word count; the parts are joined in order by a binary tree whose join is a
// bijection in each argument for the other fixed (so not commutative), and
// the root is joined with the size.
//
// Hence a change within one aligned 8-byte word always changes the
// fingerprint; any other change passes with probability ~2^-64 when the
// hash is taken as random: 5.4e-20 per changed chunk, at most 1.1e-15 for
// an 80 GiB dump of 4 MiB chunks (20 480) all changed.
#pragma once

#include <cstdint>
#include <cstring>

#include "phos/images/crc32c_split.h"  // PHOS_HOST_DEVICE

namespace phos::fingerprint {

// Parts of a chunk: the GPU block's threads.
inline constexpr uint32_t kParts = 1024;
inline constexpr uint32_t kWordBytes = 16;

inline constexpr uint64_t kP1 = 0x9E3779B185EBCA87ull;
inline constexpr uint64_t kP2 = 0xC2B2AE3D27D4EB4Full;
inline constexpr uint64_t kP3 = 0x165667B19E3779F9ull;
inline constexpr uint64_t kP4 = 0x85EBCA77C2B2AE63ull;
inline constexpr uint64_t kP5 = 0x27D4EB2F165667C5ull;

PHOS_HOST_DEVICE constexpr uint64_t rotl(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }

// xxHash64's final mix: a bijection that spreads every bit over the word.
PHOS_HOST_DEVICE constexpr uint64_t avalanche(uint64_t h) {
  h ^= h >> 33;
  h *= kP2;
  h ^= h >> 29;
  h *= kP3;
  h ^= h >> 32;
  return h;
}

// One part's two lanes.
struct Lanes {
  uint64_t a = kP1 + kP2;
  uint64_t b = kP2;
};

PHOS_HOST_DEVICE constexpr uint64_t lane_round(uint64_t acc, uint64_t w) { return rotl(acc + w * kP2, 31) * kP1; }

// The lanes after one 16-byte word, its low and high 8 bytes (little-endian).
PHOS_HOST_DEVICE constexpr Lanes step(Lanes l, uint64_t lo, uint64_t hi) {
  l.a = lane_round(l.a, lo);
  l.b = lane_round(l.b, hi);
  return l;
}

// A part's hash from its lanes and how many words it took.
PHOS_HOST_DEVICE constexpr uint64_t finish_part(Lanes l, uint64_t words) {
  return avalanche((rotl(l.a, 1) + rotl(l.b, 7)) ^ (words * kP5));
}

// Two adjacent parts (or subtrees), left before right.
PHOS_HOST_DEVICE constexpr uint64_t join(uint64_t left, uint64_t right) {
  return avalanche(left * kP3 + rotl(right, 29));
}

// The fingerprint from the tree's root and the chunk's size in bytes.
PHOS_HOST_DEVICE constexpr uint64_t finish(uint64_t root, uint64_t size) { return join(root, size ^ kP4); }

// The words (whole, then the zero-padded rest) of a chunk of `size` bytes,
// and how many of them part `part` takes.
PHOS_HOST_DEVICE constexpr uint64_t word_count(uint64_t size) { return (size + kWordBytes - 1) / kWordBytes; }
PHOS_HOST_DEVICE constexpr uint64_t words_of_part(uint64_t size, uint32_t part) {
  const uint64_t n = word_count(size);
  return n / kParts + (part < n % kParts ? 1 : 0);
}

// Joins `values[0..kParts)` in place as the tree does, level by level
// ((0,1), (2,3), ...); the root is values[0]. Host only (the GPU joins in
// shared memory with its block, the same way).
inline uint64_t join_tree(uint64_t* values) {
  for (uint32_t width = kParts / 2; width >= 1; width /= 2)
    for (uint32_t i = 0; i < width; i++) values[i] = join(values[2 * i], values[2 * i + 1]);
  return values[0];
}

namespace detail {
inline uint64_t load64(const unsigned char* p) {
  uint64_t v;
  std::memcpy(&v, p, sizeof(v));  // any alignment; the hosts phos runs on are little-endian
  return v;
}
}  // namespace detail

// The fingerprint of `size` bytes at `data`, on the CPU. It walks the chunk
// in rows of kParts words (16 KiB), the parts' lanes side by side: memory is
// read in order, and the parts' rounds are independent for the CPU to
// overlap.
inline uint64_t of(const void* data, uint64_t size) {
  const auto* p = static_cast<const unsigned char*>(data);
  Lanes lanes[kParts];  // 24 KiB of stack with parts[]
  uint64_t parts[kParts];
  const uint64_t whole = size / kWordBytes;
  uint64_t w = 0;
  for (; w + kParts <= whole; w += kParts) {
    const unsigned char* row = p + w * kWordBytes;
    for (uint32_t t = 0; t < kParts; t++)
      lanes[t] = step(lanes[t], detail::load64(row + t * kWordBytes), detail::load64(row + t * kWordBytes + 8));
  }
  for (; w < whole; w++) {
    const unsigned char* at = p + w * kWordBytes;
    lanes[w % kParts] = step(lanes[w % kParts], detail::load64(at), detail::load64(at + 8));
  }
  if (const uint64_t rest = size % kWordBytes) {
    unsigned char pad[kWordBytes] = {};
    std::memcpy(pad, p + whole * kWordBytes, rest);
    lanes[whole % kParts] = step(lanes[whole % kParts], detail::load64(pad), detail::load64(pad + 8));
  }
  for (uint32_t t = 0; t < kParts; t++) parts[t] = finish_part(lanes[t], words_of_part(size, t));
  return finish(join_tree(parts), size);
}

}  // namespace phos::fingerprint
