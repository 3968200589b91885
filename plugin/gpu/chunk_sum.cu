// The engine's fingerprint kernels (chunk_sum.h): validation by checksum
// (fingerprint.h). Thread t of a block takes the chunk's 16-byte words t,
// t + 1024, ...: a warp reads 512 contiguous bytes per load, so the pass
// over all of device memory at the freeze runs at the speed of HBM. The
// parts' hashes are joined in shared memory by the same tree the host uses
// (fingerprint::join_tree), and test_fingerprint.cc / bench_checksum.cu
// check that GPU and host agree.
#include "chunk_crc.h"
#include "chunk_sum.h"
#include "phos/images/crc32c_split.h"
#include "phos/images/fingerprint.h"
#include "phos/images/zero_chunk.h"

namespace fp = phos::fingerprint;
namespace split = phos::crc32c_split;
namespace zero_chunk = phos::zero_chunk;
using phos::plugin::ChunkCrcTail;
using phos::plugin::ChunkSumOut;
using phos::plugin::ChunkSumTask;
constexpr unsigned kThreads = phos::plugin::kChunkSumThreads;
static_assert(kThreads == fp::kParts, "one thread per fingerprint part");

namespace {

struct WordSum {
  fp::Lanes lanes;
  uint32_t folded = 0;  // the OR of the words (zero_chunk.h)
};

__device__ inline void take(WordSum& s, uint4 v) {
  s.lanes = fp::step(s.lanes, uint64_t(v.x) | (uint64_t(v.y) << 32), uint64_t(v.z) | (uint64_t(v.w) << 32));
  s.folded = zero_chunk::fold(s.folded, v.x | v.y | v.z | v.w);
}

// The last, short word (size % 16 bytes), zero-padded as fingerprint.h
// pads it; copied to `to` where given.
__device__ inline uint4 short_word(const unsigned char* from, unsigned char* to, uint64_t rest) {
  unsigned char pad[16] = {};
  for (uint64_t i = 0; i < rest; i++) {
    pad[i] = from[i];
    if (to) to[i] = pad[i];
  }
  uint4 v;
  memcpy(&v, pad, sizeof(v));
  return v;
}

// Word w of `data`, which need not be 16-byte aligned (device chunks are).
__device__ inline uint4 load_word(const unsigned char* data, uint64_t w, bool aligned) {
  if (aligned) return __ldg(reinterpret_cast<const uint4*>(data) + w);
  uint4 v;
  unsigned char b[16];
  for (int i = 0; i < 16; i++) b[i] = data[w * 16 + i];
  memcpy(&v, b, sizeof(v));
  return v;
}

// The block's fingerprint of a chunk of `size` bytes from each thread's
// lanes: valid in thread 0. `parts` is the block's shared scratch.
__device__ uint64_t join_block(const WordSum& s, uint64_t size, uint64_t* parts) {
  const unsigned t = threadIdx.x;
  parts[t] = fp::finish_part(s.lanes, fp::words_of_part(size, t));
  __syncthreads();
  for (unsigned width = kThreads / 2; width >= 1; width /= 2) {
    uint64_t joined = 0;
    if (t < width) joined = fp::join(parts[2 * t], parts[2 * t + 1]);
    __syncthreads();
    if (t < width) parts[t] = joined;
    __syncthreads();
  }
  return fp::finish(parts[0], size);
}

}  // namespace

extern "C" __global__ void __launch_bounds__(kThreads) phos_chunk_sum(const ChunkSumTask* tasks, ChunkSumOut* out) {
  __shared__ uint64_t parts[kThreads];
  __shared__ ChunkSumTask task;
  if (threadIdx.x == 0) task = tasks[blockIdx.x];  // one read where `tasks` is host memory
  __syncthreads();
  const auto* data = reinterpret_cast<const unsigned char*>(task.address);
  const bool aligned = (task.address & 15) == 0;
  const uint64_t whole = task.bytes / 16;
  WordSum s;
#pragma unroll 4
  for (uint64_t w = threadIdx.x; w < whole; w += kThreads) take(s, load_word(data, w, aligned));
  if (const uint64_t rest = task.bytes % 16; rest && threadIdx.x == whole % kThreads)
    take(s, short_word(data + whole * 16, nullptr, rest));
  const int any_nonzero = __syncthreads_or(s.folded != 0);
  const uint64_t sum = join_block(s, task.bytes, parts);
  if (threadIdx.x == 0) {
    ChunkSumOut& o = out[blockIdx.x];
    o.fingerprint = sum;
    o.zero = any_nonzero ? 0 : 1;
    __threadfence_system();  // the sums before the mark, as the host sees them
    o.done = phos::plugin::kChunkSumDone;
  }
}

extern "C" __global__ void __launch_bounds__(kThreads)
    phos_chunk_copy_sum(const unsigned char* src, unsigned char* bounce, unsigned long long size, ChunkCrcTail* tail) {
  __shared__ uint64_t parts[kThreads];
  __shared__ uint32_t table[256];
  __shared__ uint32_t crcs[kThreads];
  for (unsigned i = threadIdx.x; i < 256; i += blockDim.x) table[i] = split::table_entry(i);
  // 1. One read of the process's memory: each word goes to the bounce and
  //    into the fingerprint.
  const bool aligned = ((reinterpret_cast<uintptr_t>(src) | reinterpret_cast<uintptr_t>(bounce)) & 15) == 0;
  const uint64_t whole = size / 16;
  WordSum s;
#pragma unroll 4
  for (uint64_t w = threadIdx.x; w < whole; w += kThreads) {
    const uint4 v = load_word(src, w, aligned);
    if (aligned) {
      reinterpret_cast<uint4*>(bounce)[w] = v;
    } else {
      memcpy(bounce + w * 16, &v, sizeof(v));
    }
    take(s, v);
  }
  if (const uint64_t rest = size % 16; rest && threadIdx.x == whole % kThreads)
    take(s, short_word(src + whole * 16, bounce + whole * 16, rest));
  // The barrier makes the block's bounce writes visible to the block.
  const int any_nonzero = __syncthreads_or(s.folded != 0);
  // 2. The CRC-32C of the bounce, which nothing else writes: the same
  //    bytes. Contiguous parts, as crc32c_split joins them.
  const uint64_t begin = uint64_t(threadIdx.x) * split::part_size(size, blockDim.x);
  const uint64_t n = split::part_length(size, blockDim.x, threadIdx.x);
  uint32_t reg = ~0u;
  uint64_t at = 0;
  if (aligned) {
    for (; at + 16 <= n; at += 16) {
      const uint4 v = *reinterpret_cast<const uint4*>(bounce + begin + at);
      reg = split::step_word(reg, v.x, table);
      reg = split::step_word(reg, v.y, table);
      reg = split::step_word(reg, v.z, table);
      reg = split::step_word(reg, v.w, table);
    }
  }
  for (; at < n; at++) reg = split::step_byte(reg, bounce[begin + at], table);
  crcs[threadIdx.x] = ~reg;
  const uint64_t sum = join_block(s, size, parts);  // its barriers cover crcs[] too
  if (threadIdx.x == 0) {
    tail->crc = split::join_parts(crcs, size, blockDim.x);
    tail->zero = any_nonzero ? 0 : 1;
    tail->fingerprint = sum;
    tail->summed = phos::plugin::kChunkSumDone;
    __threadfence_system();  // everything before the mark, as the host sees it
    tail->done = phos::plugin::kChunkCrcDone;
  }
}
