#include "phos/speculation/buffer_index.h"

#include <algorithm>
#include <cstring>

namespace phos::speculation {
namespace {

// Index of the last element <= key in sorted a[0..n), or -1: a branch-light
// binary search (the compiler turns the halving step into a cmov).
inline ptrdiff_t last_not_greater(const uint64_t* a, size_t n, uint64_t key) {
  if (n == 0 || a[0] > key) return -1;
  const uint64_t* base = a;
  while (n > 1) {
    size_t half = n / 2;
    base = base[half] <= key ? base + half : base;
    n -= half;
  }
  return base - a;
}

}  // namespace

BufferIndex::BufferIndex() = default;
BufferIndex::~BufferIndex() = default;
BufferIndex::BufferIndex(BufferIndex&& other) noexcept { *this = std::move(other); }

BufferIndex& BufferIndex::operator=(BufferIndex&& other) noexcept {
  firsts_ = std::move(other.firsts_);
  leaves_ = std::move(other.leaves_);
  size_ = other.size_;
  lowest_ = other.lowest_;
  highest_ = other.highest_;
  other.lowest_ = UINT64_MAX;
  other.highest_ = 0;
  generation_++;  // this cache is stale; so is the emptied one's
  other.size_ = 0;
  other.firsts_.clear();
  other.leaves_.clear();
  other.generation_++;
  return *this;
}

size_t BufferIndex::leaf_for(uint64_t start) const {
  if (leaves_.empty()) return 0;
  ptrdiff_t i = last_not_greater(firsts_.data(), firsts_.size(), start);
  return i < 0 ? 0 : size_t(i);
}

bool BufferIndex::find(uint64_t address, Buffer* out) const {
  // Most words a launch's by-value structs hold (sizes, strides, floats)
  // are nowhere near a buffer: two compares, no cache line touched.
  if (address < lowest_ || address >= highest_) return false;
  // Buffers are at least 256-byte aligned and pointers into them often
  // aligned too: mix in higher bits so neighbours spread over the cache.
  CacheEntry& c = cache_[((address >> 8) ^ (address >> 20) ^ address) & (kCacheSize - 1)];
  if (c.address == address && c.generation == generation_) {
    if (c.found) *out = c.buffer;
    return c.found;
  }
  Buffer b;
  bool found = find_in_tree(address, &b);
  c.address = address;
  c.generation = generation_;
  c.buffer = b;
  c.found = found;
  if (found) *out = b;
  return found;
}

bool BufferIndex::find_in_tree(uint64_t address, Buffer* out) const {
  ptrdiff_t li = last_not_greater(firsts_.data(), firsts_.size(), address);
  if (li < 0) return false;
  const Leaf& leaf = *leaves_[size_t(li)];
  ptrdiff_t pos = last_not_greater(leaf.starts, leaf.count, address);
  if (pos < 0 || address >= leaf.ends[pos]) return false;
  *out = Buffer{leaf.starts[pos], leaf.ends[pos], leaf.ids[pos]};
  return true;
}

bool BufferIndex::insert(uint64_t start, uint64_t size, uint64_t id) {
  uint64_t end = start + size;
  if (size == 0 || end < start) return false;
  if (leaves_.empty()) {
    leaves_.push_back(std::make_unique<Leaf>());
    firsts_.push_back(start);
  }
  size_t li = leaf_for(start);
  Leaf& leaf = *leaves_[li];
  ptrdiff_t before = last_not_greater(leaf.starts, leaf.count, start);
  if (before >= 0 && leaf.ends[before] > start) return false;  // the one before reaches in
  uint32_t pos = uint32_t(before + 1);
  uint64_t next_start = pos < leaf.count ? leaf.starts[pos] : li + 1 < leaves_.size() ? firsts_[li + 1] : UINT64_MAX;
  if (next_start < end) return false;  // reaches into the next one
  insert_at(li, pos, start, end, id);
  lowest_ = std::min(lowest_, start);
  highest_ = std::max(highest_, end);
  generation_++;
  return true;
}

void BufferIndex::insert_at(size_t li, uint32_t pos, uint64_t start, uint64_t end, uint64_t id) {
  if (leaves_[li]->count == kLeafCapacity) {
    split(li);
    if (pos > kLeafCapacity / 2) {
      pos -= kLeafCapacity / 2;
      li++;
    }
  }
  Leaf& leaf = *leaves_[li];
  uint32_t tail = leaf.count - pos;
  std::memmove(leaf.starts + pos + 1, leaf.starts + pos, tail * sizeof(uint64_t));
  std::memmove(leaf.ends + pos + 1, leaf.ends + pos, tail * sizeof(uint64_t));
  std::memmove(leaf.ids + pos + 1, leaf.ids + pos, tail * sizeof(uint64_t));
  leaf.starts[pos] = start;
  leaf.ends[pos] = end;
  leaf.ids[pos] = id;
  leaf.count++;
  firsts_[li] = leaf.starts[0];
  size_++;
}

void BufferIndex::split(size_t li) {
  Leaf& full = *leaves_[li];
  auto right = std::make_unique<Leaf>();
  constexpr uint32_t kHalf = kLeafCapacity / 2;
  right->count = full.count - kHalf;
  std::memcpy(right->starts, full.starts + kHalf, right->count * sizeof(uint64_t));
  std::memcpy(right->ends, full.ends + kHalf, right->count * sizeof(uint64_t));
  std::memcpy(right->ids, full.ids + kHalf, right->count * sizeof(uint64_t));
  full.count = kHalf;
  firsts_.insert(firsts_.begin() + ptrdiff_t(li) + 1, right->starts[0]);
  leaves_.insert(leaves_.begin() + ptrdiff_t(li) + 1, std::move(right));
}

bool BufferIndex::erase(uint64_t start) {
  if (leaves_.empty()) return false;
  size_t li = leaf_for(start);
  const Leaf& leaf = *leaves_[li];
  ptrdiff_t pos = last_not_greater(leaf.starts, leaf.count, start);
  if (pos < 0 || leaf.starts[pos] != start) return false;
  remove_at(li, uint32_t(pos));
  generation_++;
  return true;
}

void BufferIndex::remove_at(size_t li, uint32_t pos) {
  Leaf& leaf = *leaves_[li];
  uint32_t tail = leaf.count - pos - 1;
  std::memmove(leaf.starts + pos, leaf.starts + pos + 1, tail * sizeof(uint64_t));
  std::memmove(leaf.ends + pos, leaf.ends + pos + 1, tail * sizeof(uint64_t));
  std::memmove(leaf.ids + pos, leaf.ids + pos + 1, tail * sizeof(uint64_t));
  leaf.count--;
  size_--;
  if (leaf.count > 0) firsts_[li] = leaf.starts[0];
  // Keep leaves at least a quarter full: merge a small leaf into its right
  // neighbour (or drop it when empty), so lookups stay two short searches.
  size_t next = li + 1;
  if (leaf.count == 0) {
    firsts_.erase(firsts_.begin() + ptrdiff_t(li));
    leaves_.erase(leaves_.begin() + ptrdiff_t(li));
  } else if (leaf.count < kLeafCapacity / 4 && next < leaves_.size() &&
             leaf.count + leaves_[next]->count <= kLeafCapacity / 2) {
    Leaf& right = *leaves_[next];
    std::memcpy(leaf.starts + leaf.count, right.starts, right.count * sizeof(uint64_t));
    std::memcpy(leaf.ends + leaf.count, right.ends, right.count * sizeof(uint64_t));
    std::memcpy(leaf.ids + leaf.count, right.ids, right.count * sizeof(uint64_t));
    leaf.count += right.count;
    firsts_.erase(firsts_.begin() + ptrdiff_t(next));
    leaves_.erase(leaves_.begin() + ptrdiff_t(next));
  }
}

void BufferIndex::clear() {
  generation_++;
  firsts_.clear();
  leaves_.clear();
  size_ = 0;
  lowest_ = UINT64_MAX;
  highest_ = 0;
}

std::vector<Buffer> BufferIndex::buffers() const {
  std::vector<Buffer> out;
  out.reserve(size_);
  for (const auto& leaf : leaves_)
    for (uint32_t i = 0; i < leaf->count; i++) out.push_back({leaf->starts[i], leaf->ends[i], leaf->ids[i]});
  return out;
}

}  // namespace phos::speculation
