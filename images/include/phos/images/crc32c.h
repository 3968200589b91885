// CRC-32C (Castagnoli), the per-chunk checksum of GPU images.
//
// Written here because Debian has no packaged crc32c library; it uses the
// SSE4.2 crc32 instruction where the CPU has it (three interleaved streams
// for large buffers) and a table otherwise.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

namespace phos {

// Continues a CRC: crc32c(crc32c(0, a), b) == crc32c(0, a + b).
uint32_t crc32c(uint32_t crc, const void* data, size_t size);

inline uint32_t crc32c(std::span<const std::byte> bytes) { return crc32c(0, bytes.data(), bytes.size()); }

// The CRC of a + b from crc32c(0, a), crc32c(0, b) and b's size.
uint32_t crc32c_combine(uint32_t crc_a, uint32_t crc_b, uint64_t size_b);

// The table-driven and the single-stream implementations, exposed so tests
// can check that all agree and the benchmark can compare them.
uint32_t crc32c_portable(uint32_t crc, const void* data, size_t size);
uint32_t crc32c_one_stream(uint32_t crc, const void* data, size_t size);

}  // namespace phos
