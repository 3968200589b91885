// Free-space bookkeeping of address ranges: first fit with alignment,
// coalescing on free. Used for the VA arena phos reserves on each device and
// for the small allocations sub-allocated inside slabs. Pure bookkeeping: no
// CUDA here, so it is tested alone.
#pragma once

#include <cstdint>
#include <map>
#include <optional>

namespace phos::hooks {

class RangeAllocator {
 public:
  void add_range(uint64_t base, uint64_t size);
  // The lowest address of a free extent of `size` bytes aligned to
  // `alignment` (a power of two), or nothing.
  std::optional<uint64_t> allocate(uint64_t size, uint64_t alignment);
  // Returns [addr, addr + size) (which allocate() handed out) to the free space.
  void free(uint64_t addr, uint64_t size);
  uint64_t total_bytes() const { return total_; }
  uint64_t free_bytes() const { return free_total_; }
  bool unused() const { return free_total_ == total_; }
  size_t free_extents() const { return free_.size(); }

 private:
  std::map<uint64_t, uint64_t> free_;  // start -> size
  uint64_t total_ = 0;
  uint64_t free_total_ = 0;
};

inline uint64_t align_up(uint64_t v, uint64_t a) { return (v + a - 1) & ~(a - 1); }

}  // namespace phos::hooks
