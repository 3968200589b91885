// The parent's chunks an incremental dump may reference (parent_index.h).
#include "phos/images/parent_index.h"

#include <cerrno>

namespace phos::image {

Result<ParentIndex> ParentIndex::of(const Manifest& parent) {
  ParentIndex index;
  for (const auto& a : parent.allocations)
    for (const auto& c : a.chunks) {
      if (c.compression != Compression::kNone && c.compression != Compression::kZstd) continue;
      if (!c.fingerprint)
        return make_error("its chunk at offset " + std::to_string(c.alloc_offset) + " of allocation " +
                              std::to_string(a.id) + " records no 64-bit fingerprint (format version " +
                              std::to_string(parent.format_version) + ", fingerprints came with version " +
                              std::to_string(kFingerprintFormatVersion) +
                              "), so no chunk can be shown unchanged by more than its 32-bit CRC",
                          ENOTSUP);
      index.chunks_[{a.id, c.alloc_offset}] = ChunkSums{c.raw_size, c.crc32c, *c.fingerprint};
    }
  return index;
}

bool ParentIndex::unchanged(uint64_t allocation, uint64_t offset, const ChunkSums& sums) const {
  auto it = chunks_.find({allocation, offset});
  return it != chunks_.end() && it->second == sums;
}

}  // namespace phos::image
