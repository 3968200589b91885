// The engine's checksum on the GPU: the CRC-32C of a chunk of device memory,
// computed by one block while the chunk is copied to the host, so the
// writer threads do not read each chunk once more to checksum it (a large
// share of their time: docs/benchmarks/architecture-figures.md). Each of the block's
// threads takes one part of the chunk (crc32c_split.h: 16-byte loads, a
// byte-at-a-time table in shared memory); thread 0 joins the parts' CRCs.
// The result is the same CRC-32C the host computes (test_crc32c.cc).
// Each thread also folds the words it loads into its part's OR
// (zero_chunk.h), and the block's OR-reduction says whether the chunk is
// zero: a sparse image stores none of it.
#include "chunk_crc.h"
#include "phos/images/crc32c_split.h"
#include "phos/images/zero_chunk.h"

namespace split = phos::crc32c_split;
namespace zero_chunk = phos::zero_chunk;
using phos::plugin::ChunkCrcTail;
constexpr unsigned kThreads = phos::plugin::kChunkCrcThreads;

extern "C" __global__ void __launch_bounds__(kThreads)
    phos_chunk_crc32c(const unsigned char* data, unsigned long long size, ChunkCrcTail* out) {
  __shared__ uint32_t table[256];
  __shared__ uint32_t parts[kThreads];
  for (unsigned i = threadIdx.x; i < 256; i += blockDim.x) table[i] = split::table_entry(i);
  __syncthreads();
  const uint64_t begin = uint64_t(threadIdx.x) * split::part_size(size, blockDim.x);
  const uint64_t n = split::part_length(size, blockDim.x, threadIdx.x);
  uint32_t reg = ~0u;
  uint32_t folded = 0;  // the OR of the part's words
  uint64_t at = 0;
  // Parts start 16-byte aligned when `data` is (chunks of device memory are).
  if ((reinterpret_cast<uintptr_t>(data) & 15) == 0) {
    for (; at + 16 <= n; at += 16) {
      uint4 v = __ldg(reinterpret_cast<const uint4*>(data + begin + at));
      reg = split::step_word(reg, v.x, table);
      reg = split::step_word(reg, v.y, table);
      reg = split::step_word(reg, v.z, table);
      reg = split::step_word(reg, v.w, table);
      folded = zero_chunk::fold(folded, v.x | v.y | v.z | v.w);
    }
  }
  for (; at < n; at++) {
    reg = split::step_byte(reg, data[begin + at], table);
    folded = zero_chunk::fold<uint32_t>(folded, data[begin + at]);
  }
  parts[threadIdx.x] = ~reg;
  // The barrier the parts need anyway, reducing the ORs on the way.
  const int any_nonzero = __syncthreads_or(folded != 0);
  if (threadIdx.x == 0) {
    out->crc = split::join_parts(parts, size, blockDim.x);
    out->zero = any_nonzero ? 0 : 1;
    __threadfence_system();  // the CRC and zero before the mark, as the host sees them
    out->done = phos::plugin::kChunkCrcDone;
  }
}
