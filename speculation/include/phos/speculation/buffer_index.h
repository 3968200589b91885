// The buffer index: every live device buffer of a process as an interval
// [start, end), found by any address inside it. Every launch looks up each
// of its pointer-sized arguments here, so lookups must be fast (tens of
// millions a second on one core) and updates (each allocation and free)
// cheap.
//
// A two-level B+tree: leaves hold up to kLeafCapacity buffers sorted by
// start in flat arrays, and a sorted array of each leaf's first start finds
// the leaf; a lookup is two binary searches over contiguous memory, an update
// moves at most one leaf's entries (plus, rarely, the leaf pointers on a
// split or merge). Written here rather than taken from a library: the usual
// candidate (Abseil's btree_map) would put a second Abseil into processes
// that often carry their own (gRPC, protobuf, TensorFlow), from a library
// preloaded into them.
//
// In front of the tree, a small direct-mapped cache of recent lookups by
// exact address: a training loop launches its kernels with the same
// pointers step after step. Any update invalidates it as a whole (a
// generation number), so it can never answer with a buffer that is gone.
//
// Not thread-safe, lookups included (they fill the cache): the hooks hold
// their lock around it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

namespace phos::speculation {

struct Buffer {
  uint64_t start = 0;
  uint64_t end = 0;  // one past the last byte
  uint64_t id = 0;   // the owner's name for it (the hooks' allocation id)
};

class BufferIndex {
 public:
  static constexpr size_t kLeafCapacity = 64;

  BufferIndex();
  ~BufferIndex();
  BufferIndex(BufferIndex&&) noexcept;
  BufferIndex& operator=(BufferIndex&&) noexcept;

  // false (and nothing changes) for an empty range, one that wraps, or one
  // that overlaps a buffer already there.
  bool insert(uint64_t start, uint64_t size, uint64_t id);
  // Removes the buffer that starts at `start`; false if there is none.
  bool erase(uint64_t start);
  // The buffer containing `address`; false if none does.
  bool find(uint64_t address, Buffer* out) const;
  // Calls fn(const Buffer&) for each buffer overlapping [start, end), in
  // address order.
  template <class Fn>
  void for_each_overlapping(uint64_t start, uint64_t end, Fn&& fn) const;
  size_t size() const { return size_; }
  void clear();
  // Every buffer in address order (tests, statistics).
  std::vector<Buffer> buffers() const;

 private:
  static constexpr size_t kCacheSize = 1024;
  struct CacheEntry {
    uint64_t address = 0;
    uint64_t generation = 0;  // 0: empty
    Buffer buffer;
    bool found = false;
  };
  bool find_in_tree(uint64_t address, Buffer* out) const;

  struct Leaf {
    uint32_t count = 0;
    uint64_t starts[kLeafCapacity];
    uint64_t ends[kLeafCapacity];
    uint64_t ids[kLeafCapacity];
  };
  // The leaf that would hold `start`: the last whose first start <= start
  // (0 when start precedes them all); leaves_.size() when there are none.
  size_t leaf_for(uint64_t start) const;
  void insert_at(size_t leaf, uint32_t pos, uint64_t start, uint64_t end, uint64_t id);
  void split(size_t leaf);
  void remove_at(size_t leaf, uint32_t pos);

  std::vector<uint64_t> firsts_;  // firsts_[i] == leaves_[i]->starts[0]
  std::vector<std::unique_ptr<Leaf>> leaves_;
  size_t size_ = 0;
  // Every buffer lies in [lowest_, highest_): bounds that grow with inserts
  // (an erase leaves them, which only makes them looser).
  uint64_t lowest_ = UINT64_MAX;
  uint64_t highest_ = 0;
  uint64_t generation_ = 1;
  mutable CacheEntry cache_[kCacheSize];
};

template <class Fn>
void BufferIndex::for_each_overlapping(uint64_t start, uint64_t end, Fn&& fn) const {
  if (start >= end || leaves_.empty()) return;
  size_t li = leaf_for(start);
  const Leaf* leaf = leaves_[li].get();
  // The last buffer starting at or before `start` may reach into the range.
  uint32_t pos = 0;
  while (pos < leaf->count && leaf->starts[pos] <= start) pos++;
  if (pos > 0) pos--;
  for (; li < leaves_.size(); li++, pos = 0) {
    leaf = leaves_[li].get();
    for (; pos < leaf->count; pos++) {
      if (leaf->starts[pos] >= end) return;
      if (leaf->ends[pos] > start) fn(Buffer{leaf->starts[pos], leaf->ends[pos], leaf->ids[pos]});
    }
  }
}

}  // namespace phos::speculation
