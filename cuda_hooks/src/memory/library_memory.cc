#include "phos/hooks/library_memory.h"

#include <algorithm>
#include <vector>

namespace phos::hooks {

namespace {
// Initial-exec: libphos.so is preloaded, its TLS static; a scope costs an
// increment and a decrement, on every cuBLAS call.
__attribute__((tls_model("initial-exec"))) thread_local int t_depth = 0;
}  // namespace

LibraryMemory::Scope::Scope() { t_depth++; }
LibraryMemory::Scope::~Scope() { t_depth--; }
bool LibraryMemory::inside() { return t_depth > 0; }

void LibraryMemory::set_workspace(const void* handle, uint64_t address, uint64_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!address || !bytes) {
    workspaces_.erase(handle);
    return;
  }
  workspaces_[handle] = Range{address, bytes};
}

void LibraryMemory::forget_handle(const void* handle) {
  std::lock_guard<std::mutex> lock(mu_);
  workspaces_.erase(handle);
}

void LibraryMemory::allocated(uint64_t address, uint64_t bytes) {
  if (!address || !bytes) return;
  std::lock_guard<std::mutex> lock(mu_);
  owned_[address] = bytes;
  owns_any_.store(true, std::memory_order_relaxed);
}

void LibraryMemory::freed(uint64_t address) {
  if (!owns_any_.load(std::memory_order_relaxed)) return;
  std::lock_guard<std::mutex> lock(mu_);
  owned_.erase(address);
  owns_any_.store(!owned_.empty(), std::memory_order_relaxed);
}

size_t LibraryMemory::written(const void* handle, Range* out, size_t max) const {
  if (max == 0) return 0;
  std::vector<Range> owned;
  size_t n = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (handle)
      if (auto it = workspaces_.find(handle); it != workspaces_.end()) out[n++] = it->second;
    if (owned_.size() <= max - n) {  // the usual case: no copy, nothing merged
      for (const auto& [address, bytes] : owned_) out[n++] = Range{address, bytes};
      return n;
    }
    owned.reserve(owned_.size());
    for (const auto& [address, bytes] : owned_) owned.push_back(Range{address, bytes});
  }
  // Merge the two neighbours with the smallest gap until the rest fits.
  while (owned.size() > max - n && owned.size() > 1) {
    size_t best = 0;
    uint64_t best_gap = UINT64_MAX;
    for (size_t i = 0; i + 1 < owned.size(); i++) {
      const uint64_t end = owned[i].address + owned[i].bytes;
      const uint64_t gap = owned[i + 1].address > end ? owned[i + 1].address - end : 0;
      if (gap < best_gap) best_gap = gap, best = i;
    }
    Range& a = owned[best];
    const Range& b = owned[best + 1];
    a.bytes = std::max(a.address + a.bytes, b.address + b.bytes) - a.address;
    owned.erase(owned.begin() + ptrdiff_t(best) + 1);
  }
  // No room beside the workspace (max 1): one range around both.
  if (!owned.empty() && n == max) {
    const uint64_t start = std::min(out[0].address, owned[0].address);
    const uint64_t end = std::max(out[0].address + out[0].bytes, owned[0].address + owned[0].bytes);
    out[0] = Range{start, end - start};
    return n;
  }
  for (const Range& r : owned) out[n++] = r;
  return n;
}

}  // namespace phos::hooks
