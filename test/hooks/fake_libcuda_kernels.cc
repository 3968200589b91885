// The engine's kernels (plugin/gpu/chunk_crc.cu, chunk_sum.cu) run on the
// CPU by the fake libcuda with real memory (FAKE_CUDA_MEMORY=1), with the
// same definitions (crc32c_split.h, fingerprint.h, zero_chunk.h): criu's
// plugin goes its GPU ways in a test without a GPU. Launches are
// synchronous: a stream is always done.
#include <cstdint>
#include <cstring>

#include "chunk_crc.h"
#include "chunk_sum.h"
#include "phos/images/crc32c_split.h"
#include "phos/images/fingerprint.h"
#include "phos/images/zero_chunk.h"

namespace {

using phos::plugin::ChunkCrcTail;
using phos::plugin::ChunkSumOut;
using phos::plugin::ChunkSumTask;

uint32_t crc32c(const unsigned char* p, uint64_t n) {
  static const auto table = [] {
    struct Table {
      uint32_t v[256];
    } t{};
    for (uint32_t i = 0; i < 256; i++) t.v[i] = phos::crc32c_split::table_entry(i);
    return t;
  }();
  uint32_t reg = ~0u;
  for (uint64_t i = 0; i < n; i++) reg = phos::crc32c_split::step_byte(reg, p[i], table.v);
  return ~reg;
}

template <class T>
T param(void** params, int i) {
  T v;
  std::memcpy(&v, params[i], sizeof(v));
  return v;
}

void chunk_crc(void** params) {
  const auto* data = param<const unsigned char*>(params, 0);
  const auto size = param<unsigned long long>(params, 1);
  auto* tail = param<ChunkCrcTail*>(params, 2);
  tail->crc = crc32c(data, size);
  tail->zero = phos::zero_chunk::all_zero(data, size) ? 1 : 0;
  tail->done = phos::plugin::kChunkCrcDone;
}

void chunk_sum(unsigned blocks, void** params) {
  const auto* tasks = param<const ChunkSumTask*>(params, 0);
  auto* outs = param<ChunkSumOut*>(params, 1);
  for (unsigned b = 0; b < blocks; b++) {
    const auto* data = reinterpret_cast<const unsigned char*>(tasks[b].address);
    outs[b].fingerprint = phos::fingerprint::of(data, tasks[b].bytes);
    outs[b].zero = phos::zero_chunk::all_zero(data, tasks[b].bytes) ? 1 : 0;
    outs[b].done = phos::plugin::kChunkSumDone;
  }
}

void chunk_copy_sum(void** params) {
  const auto* src = param<const unsigned char*>(params, 0);
  auto* bounce = param<unsigned char*>(params, 1);
  const auto size = param<unsigned long long>(params, 2);
  auto* tail = param<ChunkCrcTail*>(params, 3);
  std::memmove(bounce, src, size);  // one read of the source, as on the GPU
  tail->crc = crc32c(bounce, size);
  tail->zero = phos::zero_chunk::all_zero(bounce, size) ? 1 : 0;
  tail->fingerprint = phos::fingerprint::of(bounce, size);
  tail->summed = phos::plugin::kChunkSumDone;
  tail->done = phos::plugin::kChunkCrcDone;
}

// libphos's save into the copy-on-write pool (cuda_hooks/gpu/chunk_save.cu).
void chunk_save(void** params) {
  const auto* src = param<const unsigned char*>(params, 0);
  auto* dst = param<unsigned char*>(params, 1);
  const auto words = param<unsigned long long>(params, 2);
  std::memmove(dst, src, words * 16);
}

}  // namespace

extern "C" int fake_real_memory(void);

// 1 where `name` is one of the engine's kernels and it ran.
extern "C" int fake_phos_kernel(const char* name, unsigned blocks, void** params) {
  if (!fake_real_memory() || !params) return 0;
  if (!std::strcmp(name, "phos_chunk_crc32c")) chunk_crc(params);
  else if (!std::strcmp(name, "phos_chunk_sum")) chunk_sum(blocks, params);
  else if (!std::strcmp(name, "phos_chunk_copy_sum")) chunk_copy_sum(params);
  else if (!std::strcmp(name, "phos_chunk_save")) chunk_save(params);
  else return 0;
  return 1;
}
