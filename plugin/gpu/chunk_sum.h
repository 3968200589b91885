// The contract between the engine (engine.cc) and its fingerprint kernels
// (chunk_sum.cu), for validation by checksum (fingerprint.h):
//
//   phos_chunk_sum(tasks, out)        one block of kChunkSumThreads per task:
//                                     the fingerprint of `bytes` at `address`
//                                     (device memory, criu's mapping), and
//                                     whether all of it is 0, into out[block];
//                                     the freeze's sums (T0) and recopy's
//                                     final ones (T1)
//   phos_chunk_copy_sum(src, bounce, size, tail)
//                                     one block: copies the chunk at src to
//                                     bounce (criu's own device memory) and
//                                     takes the fingerprint, the zero bit and
//                                     the CRC-32C of the bytes it copied into
//                                     `tail` (ChunkCrcTail, behind the staging
//                                     buffer the bounce is copied to next):
//                                     one read of the process's memory, so
//                                     the image's bytes and their sums agree
//                                     whatever the process writes meanwhile
//
// `tasks` and `out` may be host memory mapped for the device. An output not
// marked done means the kernel did not run: the CPU sums the chunk.
#pragma once

#include <cstddef>
#include <cstdint>

namespace phos::plugin {

inline constexpr unsigned kChunkSumThreads = 1024;  // fingerprint::kParts
inline constexpr uint32_t kChunkSumDone = 0x4d555333;  // "3SUM"

struct ChunkSumTask {
  uint64_t address;
  uint64_t bytes;
};

struct ChunkSumOut {
  uint64_t fingerprint;
  uint32_t zero;  // 1: every byte is 0
  uint32_t done;  // kChunkSumDone once the others are written
};

// The kernels, built by nvcc and embedded (empty when the build had none).
extern const unsigned char kChunkSumImage[];
extern const size_t kChunkSumImageSize;

}  // namespace phos::plugin
