#include "phos/images/dead_ranges.h"

#include <algorithm>

namespace phos::dead {

std::vector<Range> normalized(std::vector<Range> ranges) {
  std::erase_if(ranges, [](const Range& r) { return r.size == 0; });
  std::sort(ranges.begin(), ranges.end(), [](const Range& a, const Range& b) { return a.address < b.address; });
  std::vector<Range> out;
  for (const Range& r : ranges) {
    if (!out.empty() && r.address <= out.back().address + out.back().size) {
      const uint64_t end = std::max(out.back().address + out.back().size, r.address + r.size);
      out.back().size = end - out.back().address;
    } else {
      out.push_back(r);
    }
  }
  return out;
}

std::vector<bool> dead_chunks(uint64_t address, uint64_t size, uint64_t chunk_size, const std::vector<Range>& ranges) {
  const uint64_t n = chunk_size ? (size + chunk_size - 1) / chunk_size : 0;
  std::vector<bool> dead(n, false);
  // The first range that ends after the chunk's start: with merged ranges,
  // a chunk is dead exactly when that range also holds its end.
  auto it = ranges.begin();
  for (uint64_t k = 0; k < n; k++) {
    const uint64_t start = address + k * chunk_size;
    const uint64_t end = address + std::min(size, (k + 1) * chunk_size);
    while (it != ranges.end() && it->address + it->size <= start) ++it;
    if (it == ranges.end()) break;
    dead[k] = it->address <= start && end <= it->address + it->size;
  }
  return dead;
}

std::vector<uint64_t> to_pairs(const std::vector<Range>& ranges) {
  std::vector<uint64_t> pairs;
  pairs.reserve(ranges.size() * 2);
  for (const Range& r : ranges) {
    pairs.push_back(r.address);
    pairs.push_back(r.size);
  }
  return pairs;
}

std::string from_pairs(const std::vector<uint64_t>& pairs, std::vector<Range>& out) {
  out.clear();
  if (pairs.size() % 2) return "dead ranges: " + std::to_string(pairs.size()) + " numbers, not (address, size) pairs";
  for (size_t i = 0; i < pairs.size(); i += 2) {
    if (pairs[i] + pairs[i + 1] < pairs[i])
      return "dead ranges: range " + std::to_string(i / 2) + " wraps around the address space";
    out.push_back(Range{pairs[i], pairs[i + 1]});
  }
  return "";
}

}  // namespace phos::dead
