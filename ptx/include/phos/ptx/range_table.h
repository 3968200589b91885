// The range table: the contract between a twin kernel (twin.h) and the
// runtime that launches it. It lives in global memory, 16-byte aligned, as
// little-endian 64-bit words:
//
//   word 0           count              number of ranges that follow (runtime writes)
//   word 1           violations         checked accesses that fell outside every
//                                       range (each adds 1, atomically)
//   word 2           first_address      the address of the access whose increment
//                                       found violations == 0
//   word 3           first_instruction  that access's check ordinal (CheckSite::ordinal)
//   words 4+2i, 5+2i range i            [start, end): generic addresses, end exclusive
//
// An access of w bytes at address a passes when some range has
// start <= a and a + w <= end; the twin walks the ranges in order and stops
// at the first that holds it, so the runtime keeps the list short (one
// launch's speculated buffers) and merges ranges that touch (an access may
// span two adjacent buffers). The runtime zeroes words 1-3 before the launch
// and reads them once it has completed; words 2-3 are written by the thread
// whose increment found 0, after that increment, so they are meaningful once
// the kernel is done. The twin only reads words 0 and 4+ (through the
// non-coherent cache): do not change them while a twin runs.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "phos/speculation/buffer_index.h"
#include "phos/speculation/speculate.h"

namespace phos::ptx {

inline constexpr size_t kTableCount = 0;
inline constexpr size_t kTableViolations = 1;
inline constexpr size_t kTableFirstAddress = 2;
inline constexpr size_t kTableFirstInstruction = 3;
inline constexpr size_t kTableHeaderWords = 4;
inline constexpr size_t kTableAlignment = 16;

constexpr size_t range_table_bytes(size_t ranges) { return (kTableHeaderWords + 2 * ranges) * sizeof(uint64_t); }

// A table for `ranges` ([start, end) pairs): empty ones dropped, the rest
// sorted and merged where they overlap or touch, violation words zero.
void build_range_table(std::span<const std::pair<uint64_t, uint64_t>> ranges, std::vector<uint64_t>* words);

// A table for the buffers of `set` whose access bits meet `access`
// (speculation::kWrite for a stores twin, kRead for a loads twin), their
// extents from `index`. False for a set of kind unknown (every buffer may be
// touched: the launch has nothing to validate against) or a buffer that is
// no longer in the index.
bool build_range_table(const speculation::AccessSet& set, const speculation::BufferIndex& index, uint8_t access,
                       std::vector<uint64_t>* words);

struct Violations {
  uint64_t count = 0;
  uint64_t first_address = 0;
  uint64_t first_instruction = 0;
};
// Reads words 1-3 of a table copied back to the host (zeros for a table
// shorter than its header).
Violations read_violations(std::span<const uint64_t> words);

}  // namespace phos::ptx
