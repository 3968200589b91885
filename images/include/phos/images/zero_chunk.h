// Zero chunks: a chunk of device memory whose every byte is 0 is stored as a
// hole (Compression::kZero) and restored with a memset, so a process with
// much memory it never wrote (a preallocated KV cache) is dumped and restored
// at the rate of its live data.
//
// One definition of "zero" for the GPU and the host: the OR of all the
// chunk's words is 0. The engine's checksum kernel (plugin/gpu/chunk_crc.cu)
// folds each word it loads for the CRC into it; the host, where the kernel
// did not run, folds the chunk with all_zero(). Header-only and usable from
// device code.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "phos/images/crc32c_split.h"  // PHOS_HOST_DEVICE

namespace phos::zero_chunk {

// The running OR of a chunk's words: 0 exactly while every byte so far is 0.
template <class Word>
PHOS_HOST_DEVICE constexpr Word fold(Word folded, Word word) {
  return folded | word;
}

// Whether all `size` bytes at `data` are 0 (host only). A chunk with data
// is usually told apart in its first block: the check stops there.
inline bool all_zero(const void* data, size_t size) {
  constexpr size_t kBlock = 256;  // bytes folded between two looks at the result
  const auto* p = static_cast<const unsigned char*>(data);
  uint64_t folded = 0;
  size_t at = 0;
  for (; at + kBlock <= size; at += kBlock) {
    for (size_t k = 0; k < kBlock; k += sizeof(uint64_t)) {
      uint64_t word;
      std::memcpy(&word, p + at + k, sizeof(word));  // any alignment
      folded = fold(folded, word);
    }
    if (folded) return false;
  }
  for (; at < size; at++) folded = fold<uint64_t>(folded, p[at]);
  return folded == 0;
}

}  // namespace phos::zero_chunk
