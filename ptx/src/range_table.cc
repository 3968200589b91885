#include "phos/ptx/range_table.h"

#include <algorithm>

namespace phos::ptx {

void build_range_table(std::span<const std::pair<uint64_t, uint64_t>> ranges, std::vector<uint64_t>* words) {
  std::vector<std::pair<uint64_t, uint64_t>> sorted;
  sorted.reserve(ranges.size());
  for (const auto& r : ranges) {
    if (r.first < r.second) sorted.push_back(r);
  }
  std::sort(sorted.begin(), sorted.end());
  std::vector<std::pair<uint64_t, uint64_t>> merged;
  for (const auto& r : sorted) {
    if (!merged.empty() && r.first <= merged.back().second) {
      merged.back().second = std::max(merged.back().second, r.second);
    } else {
      merged.push_back(r);
    }
  }
  words->assign(kTableHeaderWords + 2 * merged.size(), 0);
  (*words)[kTableCount] = merged.size();
  for (size_t i = 0; i < merged.size(); i++) {
    (*words)[kTableHeaderWords + 2 * i] = merged[i].first;
    (*words)[kTableHeaderWords + 2 * i + 1] = merged[i].second;
  }
}

bool build_range_table(const speculation::AccessSet& set, const speculation::BufferIndex& index, uint8_t access,
                       std::vector<uint64_t>* words) {
  if (set.kind == speculation::SetKind::kUnknown) return false;
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  ranges.reserve(set.count);
  for (uint32_t i = 0; i < set.count; i++) {
    const speculation::BufferAccess& item = set.items[i];
    if ((item.access & access) == 0) continue;
    speculation::Buffer b;
    if (!index.find(item.start, &b) || b.start != item.start) return false;
    ranges.emplace_back(b.start, b.end);
  }
  build_range_table(ranges, words);
  return true;
}

Violations read_violations(std::span<const uint64_t> words) {
  Violations v;
  if (words.size() < kTableHeaderWords) return v;
  v.count = words[kTableViolations];
  v.first_address = words[kTableFirstAddress];
  v.first_instruction = words[kTableFirstInstruction];
  return v;
}

}  // namespace phos::ptx
