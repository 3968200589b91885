// Which chunks of an incremental dump are unchanged since its parent image:
// those whose size, CRC-32C and 64-bit fingerprint (fingerprint.h) all equal
// the parent's chunk at the same allocation and offset. The CRC alone (32
// bits) would let a changed chunk whose CRC collides be taken from the parent
// about once in 2^32; with the fingerprint, a changed chunk passes for
// unchanged with probability at most ~2^-64 (the fingerprint's alone), ~2^-96
// if the two hashes are taken as independent (docs/architecture.md).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>

#include "phos/images/manifest.h"
#include "phos/support/result.h"

namespace phos::image {

// What a dump knows of a chunk it copied.
struct ChunkSums {
  uint32_t raw_size = 0;
  uint32_t crc32c = 0;
  uint64_t fingerprint = 0;
  bool operator==(const ChunkSums&) const = default;
};

class ParentIndex {
 public:
  ParentIndex() = default;
  // The index of a parent image's manifest, its own parent chunks resolved
  // (open_parent_image). Refused, saying why, where a chunk it stores has no
  // fingerprint (an image of before format version 7): such a parent cannot
  // show a chunk unchanged, and the dump must store every chunk.
  static Result<ParentIndex> of(const Manifest& parent);

  // The chunk at `offset` of allocation `allocation` is the parent's: it
  // stores one there with the same size, CRC-32C and fingerprint.
  bool unchanged(uint64_t allocation, uint64_t offset, const ChunkSums& sums) const;
  bool empty() const { return chunks_.empty(); }

 private:
  // A chunk the parent stores: a zero or dead one costs the image nothing.
  std::map<std::pair<uint64_t, uint64_t>, ChunkSums> chunks_;
};

}  // namespace phos::image
