// CRC-32C of a buffer computed as parts (for the GPU, where each thread of a
// block takes one part of a chunk: plugin/gpu/chunk_crc.cu), and the algebra
// that joins the parts' CRCs into the whole's: zlib's crc32_combine
// technique over GF(2) modulo the Castagnoli polynomial, bit-reflected as
// the CRC register holds it (x^0 is bit 31). Header-only and usable from
// device code; crc32c.h is the host's fast path.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define PHOS_HOST_DEVICE __host__ __device__
#else
#define PHOS_HOST_DEVICE
#endif

namespace phos::crc32c_split {

inline constexpr uint32_t kPolyReflected = 0x82F63B78u;

// Entry i of the byte-at-a-time table.
PHOS_HOST_DEVICE constexpr uint32_t table_entry(uint32_t i) {
  for (int k = 0; k < 8; k++) i = (i & 1) ? (i >> 1) ^ kPolyReflected : i >> 1;
  return i;
}

// a * b mod P.
PHOS_HOST_DEVICE constexpr uint32_t multmodp(uint32_t a, uint32_t b) {
  uint32_t m = 1u << 31, p = 0;
  for (;;) {
    if (a & m) {
      p ^= b;
      if ((a & (m - 1)) == 0) break;
    }
    m >>= 1;
    b = (b & 1) ? (b >> 1) ^ kPolyReflected : b >> 1;
  }
  return p;
}

// x^(8 * bytes) mod P: what appending `bytes` zero bytes multiplies a CRC
// register by (by squaring, no table).
PHOS_HOST_DEVICE constexpr uint32_t x8nmodp(uint64_t bytes) {
  uint32_t p = 1u << 31;   // x^0
  uint32_t x2k = 1u << 30;  // x^(2^k), from x^1
  for (int k = 0; k < 3; k++) x2k = multmodp(x2k, x2k);  // x^8
  for (; bytes; bytes >>= 1) {
    if (bytes & 1) p = multmodp(x2k, p);
    x2k = multmodp(x2k, x2k);
  }
  return p;
}

// CRC-32C of A|B from CRC(A), CRC(B) and |B| (crc32c_combine).
PHOS_HOST_DEVICE constexpr uint32_t join(uint32_t crc_a, uint32_t crc_b, uint64_t size_b) {
  return multmodp(x8nmodp(size_b), crc_a) ^ crc_b;
}

// How a buffer of `size` bytes is split among `parts`: each part but the
// last ones holds part_size() bytes (a multiple of 16, for 16-byte loads);
// part i starts at i * part_size() and may be short or empty at the end.
PHOS_HOST_DEVICE constexpr uint64_t part_size(uint64_t size, uint32_t parts) {
  uint64_t per = (size + parts - 1) / parts;
  return (per + 15) / 16 * 16;
}
PHOS_HOST_DEVICE constexpr uint64_t part_length(uint64_t size, uint32_t parts, uint32_t i) {
  uint64_t begin = uint64_t(i) * part_size(size, parts);
  return begin >= size ? 0 : (size - begin < part_size(size, parts) ? size - begin : part_size(size, parts));
}

// The CRC register after the little-endian 32-bit word `w` (reflected CRC:
// the word's bytes go in low byte first), with `table` from table_entry().
PHOS_HOST_DEVICE inline uint32_t step_word(uint32_t reg, uint32_t w, const uint32_t* table) {
  reg ^= w;
  for (int k = 0; k < 4; k++) reg = table[reg & 0xff] ^ (reg >> 8);
  return reg;
}
PHOS_HOST_DEVICE inline uint32_t step_byte(uint32_t reg, uint8_t b, const uint32_t* table) {
  return table[(reg ^ b) & 0xff] ^ (reg >> 8);
}

// The whole's CRC from its parts' CRCs (part_crcs[i] of part i, as split by
// part_size(); empty parts are skipped).
PHOS_HOST_DEVICE inline uint32_t join_parts(const uint32_t* part_crcs, uint64_t size, uint32_t parts) {
  uint32_t total = 0;  // CRC-32C of nothing
  const uint64_t full = part_size(size, parts);
  const uint32_t shift_full = x8nmodp(full);
  for (uint32_t i = 0; i < parts; i++) {
    uint64_t n = part_length(size, parts, i);
    if (n == 0) break;
    total = multmodp(n == full ? shift_full : x8nmodp(n), total) ^ part_crcs[i];
  }
  return total;
}

}  // namespace phos::crc32c_split
