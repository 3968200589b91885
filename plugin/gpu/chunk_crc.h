// The contract between the engine (engine.cc) and its checksum kernel
// (chunk_crc.cu): one block of kChunkCrcThreads threads per chunk writes the
// chunk's CRC-32C, and whether its every byte is 0 (zero_chunk.h), into the
// tail behind the chunk's staging buffer, then marks it done; a tail not
// marked done means the CPU checksums the chunk. The copy-and-sum kernel
// (chunk_sum.h) fills the same tail and adds the chunk's fingerprint.
#pragma once

#include <cstddef>
#include <cstdint>

namespace phos::plugin {

inline constexpr unsigned kChunkCrcThreads = 1024;
inline constexpr uint32_t kChunkCrcDone = 0x43524333;  // "3CRC"

struct ChunkCrcTail {
  uint32_t crc;
  uint32_t zero;  // 1: every byte of the chunk is 0
  uint32_t done;  // kChunkCrcDone once crc and zero are written
  uint32_t summed;       // kChunkSumDone once `fingerprint` is written too (phos_chunk_copy_sum)
  uint64_t fingerprint;  // fingerprint.h of the bytes copied
};

// The kernel, built by nvcc and embedded (empty when the build had none).
extern const unsigned char kChunkCrcImage[];
extern const size_t kChunkCrcImageSize;

}  // namespace phos::plugin
