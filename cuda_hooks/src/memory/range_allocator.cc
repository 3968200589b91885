#include "phos/hooks/range_allocator.h"

#include <cassert>

namespace phos::hooks {

void RangeAllocator::add_range(uint64_t base, uint64_t size) {
  if (size == 0) return;
  total_ += size;
  free(base, size);
}

std::optional<uint64_t> RangeAllocator::allocate(uint64_t size, uint64_t alignment) {
  if (size == 0) return std::nullopt;
  for (auto it = free_.begin(); it != free_.end(); ++it) {
    uint64_t start = it->first, len = it->second;
    uint64_t aligned = align_up(start, alignment);
    if (aligned < start || aligned - start > len || len - (aligned - start) < size) continue;
    uint64_t end = start + len;
    free_.erase(it);
    if (aligned > start) free_.emplace(start, aligned - start);
    if (aligned + size < end) free_.emplace(aligned + size, end - (aligned + size));
    free_total_ -= size;
    return aligned;
  }
  return std::nullopt;
}

void RangeAllocator::free(uint64_t addr, uint64_t size) {
  if (size == 0) return;
  free_total_ += size;
  auto next = free_.lower_bound(addr);
  if (next != free_.begin()) {
    auto prev = std::prev(next);
    assert(prev->first + prev->second <= addr);
    if (prev->first + prev->second == addr) {
      addr = prev->first;
      size += prev->second;
      free_.erase(prev);
    }
  }
  if (next != free_.end() && addr + size == next->first) {
    size += next->second;
    free_.erase(next);
  }
  free_.emplace(addr, size);
}

}  // namespace phos::hooks
